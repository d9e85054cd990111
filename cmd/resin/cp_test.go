package main

import (
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestGenerateCP: `resin generate --model M --random-weights … --prompt-ids (37 tokens)
// --cp 2`, `--cp 3` and `--cp 2 --cp-procs` (rank 1 a worker process), and the last two
// with --max-batch-tokens 16 (the prompt in chunks of 16, 16 and 5 tokens, the later ones
// continuing over the cp group), and for llama --cp 2 --tp 2, --cp 3 --tp 2 and --cp 2
// --tp 2 --cp-procs (CP over tensor-parallel groups; the last two chunked), print what
// one rank prints, and their --logits-out files
// hold every prompt row's and step's logits within 1e-5 of the row's largest logit, for
// llama, deepseek-v4-flash and glm-5-flash; the layouts --cp does not cover are refused by name.
func TestGenerateCP(t *testing.T) {
	for _, m := range []struct{ name, config string }{
		{"llama", tinyLlama},
		{"deepseek-v4-flash", "../../models/deepseek-v4-flash/config.json"},
		{"glm-5-flash", "../../models/glm-5-flash/config.json"},
	} {
		t.Run(m.name, func(t *testing.T) { checkGenerateCP(t, m.name, m.config) })
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--model", "llama", "--random-weights", tinyLlama, "--cp", "0", "hi"}, "--cp 0"},
		{[]string{"--model", "llama", "--random-weights", tinyLlama, "--cp-procs", "hi"}, "--cp-procs needs --cp 2"},
		{[]string{"--model", "glm-5-flash", "--random-weights", "../../models/glm-5-flash/config.json", "--cp", "2", "--tp", "2", "--device", "cuda-emu", "--prompt-ids", "1,2"}, "--cp 2 --tp 2 on the GPU covers --model llama, not glm-5-flash"},
		{[]string{"--model", "glm-5-flash", "--random-weights", "../../models/glm-5-flash/config.json", "--cp", "2", "--tp", "2", "--ep", "2", "--device", "cuda-emu", "--prompt-ids", "1,2"}, "CP over tensor-parallel groups runs with --ep 1"},
		{[]string{"--model", "llama", "--random-weights", tinyLlama, "--cp", "2", "--tp", "2", "--cp-procs", "--dist-init-addr", "127.0.0.1:1", "hi"}, "worker processes and --dist-init-addr are exclusive"},
		{[]string{"--model", "llama", "--random-weights", tinyLlama, "--cp", "2", "--tp-procs", "hi"}, "--cp-procs runs CP's ranks as worker processes"},
		{[]string{"--model", "deepseek-v4-flash", "--random-weights", "../../models/deepseek-v4-flash/config.json", "--cp", "2", "--tp", "2", "--prompt-ids", "1,2"}, "covers the llama family so far, not deepseek-v4-flash"},
		{[]string{"--model", "deepseek-v4-flash", "--random-weights", "../../models/deepseek-v4-flash/config.json", "--cp", "2", "--num-speculative-tokens", "1", "--prompt-ids", "1,2"}, "not combined with --num-speculative-tokens"},
		{[]string{"--model", "glm-5-flash", "--random-weights", "../../models/glm-5-flash/config.json", "--cp", "2", "--dtype", "int8", "--prompt-ids", "1,2"}, "run fp32 only"},
		{[]string{"--cp", "2", "--max-tokens", "2", "hi"}, "--cp needs --model llama"},
	} {
		_, errOut, err := runGenerate(t, c.args...)
		if err == nil || !strings.Contains(err.Error()+errOut, c.want) {
			t.Fatalf("%v: %v (%s), want an error saying %q", c.args, err, errOut, c.want)
		}
	}
}

func checkGenerateCP(t *testing.T, model, config string) {
	ids := make([]string, 37)
	for i := range ids {
		ids[i] = string(rune('0'+(i*7+3)%10)) + "1"
	}
	dir := t.TempDir()
	args := func(sub string, extra ...string) []string {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			t.Fatal(err)
		}
		return append([]string{"--model", model, "--random-weights", config, "--cache-bytes", "4000000",
			"--prompt-ids", strings.Join(ids, ","), "--max-tokens", "12", "--ignore-eos", "--logits-out", filepath.Join(dir, sub, "l.safetensors")}, extra...)
	}
	want, errOut, err := runGenerate(t, args("one")...)
	if err != nil {
		t.Fatalf("%v (%s)", err, errOut)
	}
	wantLg, wantShape := readLogits(t, filepath.Join(dir, "one", "l.safetensors"))
	layouts := [][]string{{"--cp", "2"}, {"--cp", "3"}, {"--cp", "2", "--cp-procs"},
		{"--cp", "3", "--max-batch-tokens", "16"}, {"--cp", "2", "--cp-procs", "--max-batch-tokens", "16"}}
	if model == "llama" { // CP over TP groups (core/dist/tp's CP × TP)
		layouts = append(layouts, []string{"--cp", "2", "--tp", "2"}, []string{"--cp", "3", "--tp", "2", "--max-batch-tokens", "16"},
			[]string{"--cp", "2", "--tp", "2", "--cp-procs", "--max-batch-tokens", "16"})
	}
	for i, extra := range layouts {
		n := strings.Join(extra, " ")
		sub := string(rune('a' + i))
		got, errOut, err := runGenerate(t, args(sub, extra...)...)
		if err != nil {
			t.Fatalf("%s: %v (%s)", n, err, errOut)
		}
		if withoutTiming(got) != withoutTiming(want) {
			t.Fatalf("%s printed %q, one rank %q", n, got, want)
		}
		lg, shape := readLogits(t, filepath.Join(dir, sub, "l.safetensors"))
		if !slices.Equal(shape, wantShape) || shape[0] < 37 {
			t.Fatalf("%s: logits %v, one rank %v", n, shape, wantShape)
		}
		v := shape[1]
		for r := range shape[0] {
			scale := 0.0
			for _, x := range wantLg[r*v : (r+1)*v] {
				scale = max(scale, math.Abs(float64(x)))
			}
			for j := r * v; j < (r+1)*v; j++ {
				if d := math.Abs(float64(lg[j]-wantLg[j])) / scale; !(d <= 1e-5) {
					t.Fatalf("%s: logits row %d column %d: %g, one rank %g", n, r, j-r*v, lg[j], wantLg[j])
				}
			}
		}
	}
}

// TestWorkerRole: a worker's log lines name its layout (a --cp-procs worker used to
// call itself a "tp worker").
func TestWorkerRole(t *testing.T) {
	for _, c := range []struct {
		spec tpWorkerSpec
		want string
	}{{tpWorkerSpec{Size: 2}, "tp worker"}, {tpWorkerSpec{CP: 2, Model: "glm-5-flash"}, "cp worker"}, {tpWorkerSpec{DPAttention: true}, "dp worker"}} {
		if got := c.spec.role(); got != c.want {
			t.Errorf("%+v: %q, want %q", c.spec, got, c.want)
		}
	}
}

// TestCPTPIndivisible: a TP size the model's heads do not divide by is refused once,
// before the cp·tp ranks start (each rank used to print the refusal, after --cp-procs
// workers had loaded).
func TestCPTPIndivisible(t *testing.T) {
	for _, extra := range [][]string{nil, {"--cp-procs"}} {
		args := append([]string{"--model", "llama", "--random-weights", "testdata/tiny-llama/config.json", "--prompt-ids", "1,2,3", "--max-tokens", "2", "--cp", "2", "--tp", "3"}, extra...)
		_, errOut, err := runGenerate(t, args...)
		if err == nil || !strings.Contains(err.Error(), "--cp 2 --tp 3: tp: ") || !strings.Contains(err.Error(), "do not all divide by tp=3") {
			t.Errorf("%v: %v, want the TP size refused", args, err)
		}
		if strings.Contains(errOut, "rank 1") {
			t.Errorf("%v: the ranks started: %s", args, errOut)
		}
	}
}
