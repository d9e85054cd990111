package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/cudart/emutest"
)

// TestGenerateCPOnTheEmulatedDevice: generate --device cuda-emu --cp 2 and --cp 3 run
// llama's GPU runner with prefill context parallelism over ranks of this process
// (gpurunner.NewDenseCPShards; a 7-token prompt split 4+3 and 3+3+1) and give --cp 1's
// greedy tokens and, with --logits-out, its logits file byte for byte; --cp on the GPU
// with --cp-procs or another model is refused naming what it lacks.
func TestGenerateCPOnTheEmulatedDevice(t *testing.T) {
	if emutest.Reexec(t, "RESIN_EMU_DEVICES=3") {
		return
	}
	args := []string{"--model", "llama", "--random-weights", filepath.Join("testdata", "tiny-llama", "config.json"),
		"--prompt-ids", "1,2,3,4,5,6,7", "--max-tokens", "8", "--device", "cuda-emu"}
	dir := t.TempDir()
	run := func(cp string) (string, []byte) {
		out := filepath.Join(dir, "logits-"+cp)
		stdout, errOut, err := runGenerate(t, append(args, "--cp", cp, "--logits-out", out)...)
		if err != nil {
			t.Fatalf("--cp %s: %v\n%s", cp, err, errOut)
		}
		b, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		return tokensLine(stdout), b
	}
	one, oneLogits := run("1")
	for _, cp := range []string{"2", "3"} {
		toks, logits := run(cp)
		if toks == "" || toks != one {
			t.Errorf("--cp %s %q, --cp 1 %q", cp, toks, one)
		}
		if len(oneLogits) == 0 || !bytes.Equal(logits, oneLogits) {
			t.Errorf("--cp %s: --logits-out differs from --cp 1's (%d and %d bytes)", cp, len(logits), len(oneLogits))
		}
	}
	for _, c := range []struct {
		extra []string
		want  string
	}{
		{[]string{"--cp", "2", "--cp-procs"}, "--cp-procs is the CPU's"},
		{[]string{"--cp", "2", "--model", "glm-5-flash", "--random-weights", filepath.Join("..", "..", "models", "glm-5-flash", "config.json")}, "covers --model llama only"},
	} {
		_, errOut, err := runGenerate(t, append(args, c.extra...)...)
		if err == nil || !strings.Contains(errOut+err.Error(), c.want) {
			t.Errorf("%v: err %v, stderr %q; want it to say %q", c.extra, err, errOut, c.want)
		}
	}
}
