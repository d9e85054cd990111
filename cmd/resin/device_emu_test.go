package main

import (
	"path/filepath"
	"testing"

	"github.com/resin-llm/resin/core/cudart/emutest"
)

// TestGenerateOnTheEmulatedDevice: generate --device cuda-emu runs each model that has a
// GPU runner through core/gpurunner's kit on the emulated CUDA device, and its greedy
// tokens equal the CPU runner's (deepseek-v4-flash was not reachable from --device before:
// its GPU runner had no entry in gpuOpeners; glm-5-flash had no GPU runner), with MTP
// drafts on the device too for the two MoE models.
func TestGenerateOnTheEmulatedDevice(t *testing.T) {
	if emutest.Reexec(t) {
		return
	}
	for _, c := range []struct{ model, cfg string }{
		{"llama", filepath.Join("testdata", "tiny-llama", "config.json")},
		{"deepseek-v4-flash", filepath.Join("..", "..", "models", "deepseek-v4-flash", "config.json")},
		{"glm-5-flash", filepath.Join("..", "..", "models", "glm-5-flash", "config.json")},
	} {
		args := []string{"--model", c.model, "--random-weights", c.cfg, "--prompt-ids", "1,2,3,4,5", "--max-tokens", "6"}
		cpu, errOut, err := runGenerate(t, args...)
		if err != nil {
			t.Fatalf("%s on the CPU: %v\n%s", c.model, err, errOut)
		}
		gpu, errOut, err := runGenerate(t, append(args, "--device", "cuda-emu")...)
		if err != nil {
			t.Fatalf("%s --device cuda-emu: %v\n%s", c.model, err, errOut)
		}
		if tokensLine(gpu) == "" || tokensLine(gpu) != tokensLine(cpu) {
			t.Errorf("%s: emulated device %q, CPU %q", c.model, tokensLine(gpu), tokensLine(cpu))
		}
		if c.model == "llama" {
			continue
		}
		// The MoE models' own MTP heads draft on the device; greedy output is unchanged
		// (glm-5-flash had no entry in gpuSpecOpeners and was refused).
		spec, errOut, err := runGenerate(t, append(args, "--device", "cuda-emu", "--num-speculative-tokens", "2")...)
		if err != nil {
			t.Fatalf("%s --device cuda-emu --num-speculative-tokens 2: %v\n%s", c.model, err, errOut)
		}
		if tokensLine(spec) != tokensLine(cpu) {
			t.Errorf("%s with MTP on the emulated device %q, CPU without %q", c.model, tokensLine(spec), tokensLine(cpu))
		}
	}
}
