package main

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/weights"
)

// logitsClose fails t unless lg (of shape) is wantLg's shape with every row within 1e-5
// of that row's largest |wantLg|.
func logitsClose(t *testing.T, name string, lg []float32, shape []int, wantLg []float32, wantShape []int) {
	t.Helper()
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
// in-tree configs' experts split unevenly), --tp 2, --tp 2 --ep 2, TP and EP of different
// sizes (--tp 2 --ep 4, glm-5-flash's --tp 4 --ep 2 too) and, with --tp-procs, the other
// ranks worker processes, what one rank prints, and their --logits-out files hold logits
// of the same shape within 1e-5 of each row's largest; a split the heads do not divide,
// TP and EP neither of which divides the other, different sizes on the GPU and --ep on
// llama are refused by name.
func TestGenerateMoEParallel(t *testing.T) {
	for _, c := range []struct {
		model   string
		layouts [][]string
		refused []string
		why     string
	}{
		{"deepseek-v4-flash", [][]string{{"--ep", "2"}, {"--ep", "3", "--ep-dispatch", "all-to-all"}, {"--tp", "2"}, {"--ep", "2", "--tp-procs"}, {"--tp", "2", "--ep", "2"},
			{"--tp", "2", "--ep", "4"}},
			[]string{"--tp", "3"}, "do not all divide by tp=3"},
		{"glm-5-flash", [][]string{{"--ep", "2"}, {"--ep", "3", "--ep-dispatch", "all-to-all"}, {"--tp", "2"}, {"--tp", "2", "--tp-procs"}, {"--tp", "2", "--ep", "2", "--tp-procs"},
			{"--tp", "2", "--ep", "4", "--tp-procs"}, {"--tp", "4", "--ep", "2", "--ep-dispatch", "all-to-all"}},
			[]string{"--tp", "2", "--ep", "3"}, "tp=2 with ep=3: the smaller must divide the larger"},
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
				logitsClose(t, name, lg, shape, wantLg, wantShape)
			}
			_, errOut, err = runGenerate(t, args("bad", c.refused...)...)
			if err == nil || !strings.Contains(err.Error()+errOut, c.why) {
				t.Fatalf("%v: %v (%s), want an error saying %q", c.refused, err, errOut, c.why)
			}
		})
	}
	if _, _, err := runGenerate(t, "--model", "glm-5-flash", "--random-weights", "../../models/glm-5-flash/config.json", "--device", "cuda-emu",
		"--tp", "2", "--ep", "4", "--max-tokens", "2", "hi"); err == nil || !strings.Contains(err.Error(), "--tp and --ep must be equal there") {
		t.Fatalf("--tp 2 --ep 4 on the GPU: %v", err)
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

// TestGenerateMoENodes: deepseek-v4-flash with --ep 2 over two "nodes" (this process as
// node 0, a child of this binary as node 1 given torchrun's environment) meeting over TCP
// prints what one rank prints; node 1 prints nothing and ends when node 0 stops it.
func TestGenerateMoENodes(t *testing.T) {
	args := []string{"--model", "deepseek-v4-flash", "--random-weights", "../../models/deepseek-v4-flash/config.json",
		"--prompt-ids", "1,2,3", "--max-tokens", "12", "--ignore-eos"}
	want, errOut, err := runGenerate(t, args...)
	if err != nil {
		t.Fatalf("%v (%s)", err, errOut)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	host, port, _ := net.SplitHostPort(addr)
	childArgs, _ := json.Marshal(append([]string{"generate", "--ep", "2"}, args...))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0])
	cmd.Env = append(os.Environ(), "RESIN_TEST_RESIN_ARGS="+string(childArgs),
		"MASTER_ADDR="+host, "MASTER_PORT="+port, "RANK=1", "WORLD_SIZE=2")
	var childOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &childOut, &childOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// --dist-timeout bounds node 0's wait for a child that never joins (go test's own
	// 10-minute default would end the whole package first)
	got, errOut, err := runGenerate(t, append([]string{"--ep", "2", "--nnodes", "2", "--node-rank", "0", "--dist-init-addr", addr, "--dist-timeout", "2m"}, args...)...)
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("node 0: %v (%s)\nnode 1: %s", err, errOut, childOut.String())
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("node 1: %v\n%s", err, childOut.String())
	}
	if withoutTiming(got) != withoutTiming(want) {
		t.Fatalf("two nodes printed %q, one rank %q", got, want)
	}
	if childOut.Len() != 0 {
		t.Fatalf("node 1 printed %q; a worker node prints nothing", childOut.String())
	}
}

// TestMoELayoutRefusedOnce: a layout the config refuses (more expert ranks than routed
// experts, a tp the heads do not divide) is refused once, naming the problem, before any
// rank starts (also with --tp-procs, which started a worker process per rank first); the
// message came once per rank.
func TestMoELayoutRefusedOnce(t *testing.T) {
	for _, c := range []struct {
		model string
		flags []string
		why   string
	}{
		{"deepseek-v4-flash", []string{"--ep", "12"}, "ep=12 for 8 routed experts"},
		{"deepseek-v4-flash", []string{"--ep", "12", "--tp-procs"}, "ep=12 for 8 routed experts"},
		{"deepseek-v4-flash", []string{"--tp", "5"}, "do not all divide by tp=5"},
		{"glm-5-flash", []string{"--ep", "40"}, "routed experts"},
		{"glm-5-flash", []string{"--tp", "5", "--tp-procs"}, "do not all divide by tp=5"},
		{"deepseek-v4-flash", []string{"--tp", "2", "--ep", "3", "--tp-procs"}, "the smaller must divide the larger"},
	} {
		args := append([]string{"--model", c.model, "--random-weights", filepath.Join("../../models", c.model, "config.json"),
			"--prompt-ids", "1,2,3", "--max-tokens", "2"}, c.flags...)
		_, errOut, err := runGenerate(t, args...)
		if err == nil || !strings.Contains(err.Error(), c.why) {
			t.Fatalf("%s %v: %v (%s), want an error saying %q", c.model, c.flags, err, errOut, c.why)
		}
		if strings.Count(err.Error(), c.why) != 1 || strings.Contains(err.Error(), "rank ") {
			t.Fatalf("%s %v: %q: want the refusal once, before any rank", c.model, c.flags, err)
		}
	}
}

// TestEPDispatchChecked: a misspelled --ep-dispatch is refused by name with or without
// --ep, and all-to-all without --ep 2 or more is refused as ignored; both ran silently
// as the one-rank model.
func TestEPDispatchChecked(t *testing.T) {
	for _, c := range []struct {
		flags []string
		why   string
	}{
		{[]string{"--ep-dispatch", "all2all"}, `--ep-dispatch "all2all": want gather or all-to-all`},
		{[]string{"--ep-dispatch", "all2all", "--tp", "2"}, `--ep-dispatch "all2all": want gather or all-to-all`},
		{[]string{"--ep-dispatch", "all-to-all", "--tp", "2"}, "--ep-dispatch all-to-all needs --ep 2 or more"},
	} {
		args := append([]string{"--model", "deepseek-v4-flash", "--random-weights", "../../models/deepseek-v4-flash/config.json",
			"--prompt-ids", "1,2,3", "--max-tokens", "2"}, c.flags...)
		if _, errOut, err := runGenerate(t, args...); err == nil || !strings.Contains(err.Error(), c.why) {
			t.Errorf("%v: %v (%s), want an error saying %q", c.flags, err, errOut, c.why)
		}
	}
	if _, errOut, err := runGenerate(t, "--ep-dispatch", "gatherr", "--prompt-ids", "1,2", "--max-tokens", "2"); err == nil || !strings.Contains(err.Error(), `"gatherr"`) {
		t.Errorf("the test runner with --ep-dispatch gatherr: %v (%s)", err, errOut)
	}
}

// TestGenerateParallelRefusesVisionTokens: glm-5-flash's image placeholder in a prompt is
// refused naming it by every layout, also those whose rank 0 is wrapped for worker
// processes (--tp-procs, --cp-procs) and the dp ranks' engines (--dp-attention, with
// --dp-procs, and replicas), whose runners did not ask the model's CheckPrompt.
func TestGenerateParallelRefusesVisionTokens(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "models", "glm-5-flash", "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	cfg["image_token_id"] = 5
	if b, err = json.Marshal(cfg); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, layout := range [][]string{nil, {"--ep", "2", "--tp-procs"}, {"--cp", "2", "--cp-procs"}, {"--dp", "2", "--dp-attention"},
		{"--dp", "2", "--dp-attention", "--dp-procs"}, {"--dp", "2", "--ep", "2"}} {
		args := append([]string{"--model", "glm-5-flash", "--random-weights", path, "--prompt-ids", "1,5,3", "--max-tokens", "2"}, layout...)
		_, errOut, err := runGenerate(t, args...)
		if want := "image/video placeholder"; err == nil || !strings.Contains(errOut+err.Error(), want) {
			t.Errorf("%v: err %v, stderr %q; want it refused naming the %s", layout, err, errOut, want)
		}
	}
}
