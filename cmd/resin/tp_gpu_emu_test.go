package main

import (
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/cudart/emutest"
	"github.com/resin-llm/resin/core/weights"
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

// TestGenerateTPGPUCheckpointLogitsOut: from a bf16 checkpoint, generate --device cuda-emu
// --tp 2 (each rank reading only its slices, gpurunner.ReadDense; the tiny llama's 1025
// tokens split 544 + 481 over the vocab-parallel embedding and head, decode graphs on)
// prints --tp 1's tokens, and its --logits-out file holds --tp 1's logits within 1e-5 of
// the largest (on the emulated device they came out bit-identical).
func TestGenerateTPGPUCheckpointLogitsOut(t *testing.T) {
	if emutest.Reexec(t, "RESIN_EMU_DEVICES=2") {
		return
	}
	dir, c := tinyLlamaCheckpoint(t, 3, weights.BF16)
	out := t.TempDir()
	run := func(tp string) (string, []float32, []int) {
		path := filepath.Join(out, "tp"+tp, "l.safetensors")
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		got, errOut, err := runGenerate(t, "--model", "llama", "--weights", dir, "--device", "cuda-emu", "--tp", tp, "--cache-bytes", "4000000",
			"--prompt-ids", "5,9,17,33,2,8", "--max-tokens", "12", "--ignore-eos", "--logits-out", path)
		if err != nil {
			t.Fatalf("--tp %s: %v\n%s", tp, err, errOut)
		}
		lg, shape := readLogits(t, path)
		return got, lg, shape
	}
	oneOut, one, oneShape := run("1")
	twoOut, two, twoShape := run("2")
	if tokensLine(twoOut) == "" || tokensLine(twoOut) != tokensLine(oneOut) {
		t.Fatalf("--tp 2 %q, --tp 1 %q", tokensLine(twoOut), tokensLine(oneOut))
	}
	if !slices.Equal(oneShape, twoShape) || len(oneShape) != 2 || oneShape[1] != c.VocabSize {
		t.Fatalf("--logits-out shapes: --tp 1 %v, --tp 2 %v (vocab %d)", oneShape, twoShape, c.VocabSize)
	}
	scale, diff := 0.0, 0.0
	for i, b := range one {
		scale = max(scale, math.Abs(float64(b)))
		diff = max(diff, math.Abs(float64(two[i]-b)))
	}
	if diff > 1e-5*scale {
		t.Fatalf("--logits-out: --tp 2 differs from --tp 1 by %.3g of %.3g", diff, scale)
	}
	t.Logf("--tp 2 on 2 emulated GPUs from a bf16 checkpoint: tokens equal, %v logits within %.3g of %.3g", twoShape, diff, scale)
}
