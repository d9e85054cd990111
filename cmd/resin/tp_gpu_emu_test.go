package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/cudart/emutest"
)

// TestGenerateTPOnTheEmulatedDevice: generate --device cuda-emu --tp 2 runs llama's GPU
// runner split over two emulated GPUs (gpurunner.NewDenseTP) and its greedy tokens equal
// --tp 1's; the layouts the GPU path does not cover are refused by name (before, every
// --tp with --device cuda was).
func TestGenerateTPOnTheEmulatedDevice(t *testing.T) {
	if emutest.Reexec(t, "RESIN_EMU_DEVICES=2") {
		return
	}
	args := []string{"--model", "llama", "--random-weights", filepath.Join("testdata", "tiny-llama", "config.json"),
		"--prompt-ids", "1,2,3", "--max-tokens", "24", "--device", "cuda-emu"}
	one, errOut, err := runGenerate(t, args...)
	if err != nil {
		t.Fatalf("--tp 1: %v\n%s", err, errOut)
	}
	two, errOut, err := runGenerate(t, append(args, "--tp", "2")...)
	if err != nil {
		t.Fatalf("--tp 2: %v\n%s", err, errOut)
	}
	if tokensLine(two) == "" || tokensLine(two) != tokensLine(one) {
		t.Errorf("--tp 2 %q, --tp 1 %q", tokensLine(two), tokensLine(one))
	}
	_, errOut, err = runGenerate(t, append(args, "--tp", "2", "--tp-procs")...)
	if err == nil || !strings.Contains(err.Error()+errOut, "in-process ranks only") {
		t.Errorf("--tp 2 --tp-procs --device cuda-emu: %v %s, want a refusal naming in-process ranks", err, errOut)
	}
}
