package main

import (
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/weights"
)

// readLogits reads the logits of generate's --logits-out file.
func readLogits(t *testing.T, path string) ([]float32, []int) {
	t.Helper()
	ck, err := weights.Open(filepath.Dir(path))
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	info, _ := ck.Info("logits")
	lg, err := ck.Float32("logits", info.Shape...)
	if err != nil {
		t.Fatal(err)
	}
	return lg, info.Shape
}

// TestGenerateMoEParallel: `resin generate --model deepseek-v4-flash|glm-5-flash
// --random-weights … --prompt-ids 1,2,3` prints with --ep 2, --ep 3 by all-to-all (the
// in-tree configs' experts split unevenly), --tp 2 and, with --tp-procs, rank 1 a worker
// process, what one rank prints, and their --logits-out files hold logits of the same shape
// within 1e-5 of each row's largest; a split the heads do not divide and --ep on
// llama are refused by name.
func TestGenerateMoEParallel(t *testing.T) {
	for _, c := range []struct {
		model   string
		layouts [][]string
		refused []string
		why     string
	}{
		{"deepseek-v4-flash", [][]string{{"--ep", "2"}, {"--ep", "3", "--ep-dispatch", "all-to-all"}, {"--tp", "2"}, {"--ep", "2", "--tp-procs"}},
			[]string{"--tp", "3"}, "do not all divide by tp=3"},
		{"glm-5-flash", [][]string{{"--ep", "2"}, {"--ep", "3", "--ep-dispatch", "all-to-all"}, {"--tp", "2"}, {"--tp", "2", "--tp-procs"}},
			[]string{"--tp", "3"}, "do not all divide by tp=3"},
	} {
		t.Run(c.model, func(t *testing.T) {
			dir := t.TempDir()
			args := func(logits string, extra ...string) []string {
				if err := os.MkdirAll(filepath.Join(dir, logits), 0o755); err != nil {
					t.Fatal(err)
				}
				return append([]string{"--model", c.model, "--random-weights", filepath.Join("../../models", c.model, "config.json"),
					"--prompt-ids", "1,2,3", "--max-tokens", "12", "--ignore-eos", "--logits-out", filepath.Join(dir, logits, "l.safetensors")}, extra...)
			}
			want, errOut, err := runGenerate(t, args("one")...)
			if err != nil {
				t.Fatalf("%v (%s)", err, errOut)
			}
			wantLg, wantShape := readLogits(t, filepath.Join(dir, "one", "l.safetensors"))
			for i, l := range c.layouts {
				name := strings.Join(l, " ")
				sub := string(rune('a' + i))
				got, errOut, err := runGenerate(t, args(sub, l...)...)
				if err != nil {
					t.Fatalf("%s: %v (%s)", name, err, errOut)
				}
				if withoutTiming(got) != withoutTiming(want) {
					t.Fatalf("%s printed %q, one rank %q", name, got, want)
				}
				lg, shape := readLogits(t, filepath.Join(dir, sub, "l.safetensors"))
				if !slices.Equal(shape, wantShape) {
					t.Fatalf("%s: logits %v, one rank %v", name, shape, wantShape)
				}
				v := shape[1]
				for r := range shape[0] {
					scale := 0.0
					for _, x := range wantLg[r*v : (r+1)*v] {
						scale = max(scale, math.Abs(float64(x)))
					}
					for j := r * v; j < (r+1)*v; j++ {
						if d := math.Abs(float64(lg[j]-wantLg[j])) / scale; !(d <= 1e-5) {
							t.Fatalf("%s: logits row %d column %d: %g, one rank %g", name, r, j-r*v, lg[j], wantLg[j])
						}
					}
				}
			}
			_, errOut, err = runGenerate(t, args("bad", c.refused...)...)
			if err == nil || !strings.Contains(err.Error()+errOut, c.why) {
				t.Fatalf("%v: %v (%s), want an error saying %q", c.refused, err, errOut, c.why)
			}
		})
	}
	if _, _, err := runGenerate(t, "--model", "llama", "--random-weights", tinyLlama, "--ep", "2", "--max-tokens", "2", "hi"); err == nil ||
		!strings.Contains(err.Error(), "expert parallelism covers deepseek-v4-flash and glm-5-flash only") {
		t.Fatalf("--ep 2 on llama: %v", err)
	}
}

// withoutTiming drops generate's last line (the finish line with its timing).
func withoutTiming(out string) string {
	out = strings.TrimRight(out, "\n")
	if i := strings.LastIndex(out, "\n"); i >= 0 {
		return out[:i]
	}
	return out
}
