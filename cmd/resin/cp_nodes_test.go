package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/resin-llm/resin/core/cudart/emutest"
)

// TestGenerateCPNodes: prefill CP across two nodes (one cp rank each, the control and
// data groups over the TCP rendezvous, joinCPNodes) gives --cp 1's tokens and
// --logits-out: llama within 1e-5 (a 7-token prompt split 4+3, and in plans of 4 with
// --max-batch-tokens 4) and deepseek-v4-flash (its KV side all-gathered over the data
// group), the --cp 1 logits file byte for byte for llama; and llama's --cp 2 --tp 2, a
// cp rank's TP group a node, rank 0 sending the others its cache geometry.
func TestGenerateCPNodes(t *testing.T) {
	for _, c := range []struct {
		model, cfg string
		extra      []string
		layout     []string
	}{
		{"llama", filepath.Join("testdata", "tiny-llama", "config.json"), nil, []string{"--cp", "2"}},
		{"llama", filepath.Join("testdata", "tiny-llama", "config.json"), []string{"--max-batch-tokens", "4"}, []string{"--cp", "2"}},
		{"deepseek-v4-flash", filepath.Join("..", "..", "models", "deepseek-v4-flash", "config.json"), nil, []string{"--cp", "2"}},
		// CP over TP groups: a cp rank's TP group on each node (its two ranks goroutines).
		{"llama", filepath.Join("testdata", "tiny-llama", "config.json"), []string{"--max-batch-tokens", "4"}, []string{"--cp", "2", "--tp", "2"}},
	} {
		args := append([]string{"--model", c.model, "--random-weights", c.cfg, "--prompt-ids", "1,2,3,4,5,6,7", "--max-tokens", "6", "--ignore-eos"}, c.extra...)
		oneLg := filepath.Join(t.TempDir(), "one.safetensors")
		one, errOut, err := runGenerate(t, append(append([]string{}, args...), "--logits-out", oneLg)...)
		if err != nil {
			t.Fatalf("%s --cp 1: %v\n%s", c.model, err, errOut)
		}
		got, lg := generateOverTwoNodes(t, args, c.layout)
		if tokensLine(got) == "" || tokensLine(got) != tokensLine(one) {
			t.Errorf("%s %v %v over two nodes: %q, --cp 1 %q", c.model, c.extra, c.layout, tokensLine(got), tokensLine(one))
		}
		wantLg, wantShape := readLogits(t, oneLg)
		g, shape := readLogitsBytes(t, lg)
		logitsClose(t, fmt.Sprintf("%s %v over two nodes", c.model, c.layout), g, shape, wantLg, wantShape)
	}
}

// TestGenerateCPGPUNodes: llama's, deepseek-v4-flash's and glm-5-flash's GPU prefill CP
// across two nodes on the emulated device (openDenseGPUNode with gpurunner.JoinDenseCP;
// openLayoutGPUNodes with the MoE models' JoinGPUCP: rank 0's NCCL id over the TCP
// rendezvous; the emulated NCCL meets the ranks in this host's shared memory, as real
// NCCL's bootstrap would across hosts) print --cp 1's tokens and its --logits-out byte
// for byte.
func TestGenerateCPGPUNodes(t *testing.T) {
	if emutest.Reexec(t, "RESIN_EMU_DEVICES=1") {
		return
	}
	for _, model := range []struct{ name, cfg string }{
		{"llama", filepath.Join("testdata", "tiny-llama", "config.json")},
		{"deepseek-v4-flash", filepath.Join("..", "..", "models", "deepseek-v4-flash", "config.json")},
		{"glm-5-flash", filepath.Join("..", "..", "models", "glm-5-flash", "config.json")},
	} {
		args := []string{"--model", model.name, "--random-weights", model.cfg, "--device", "cuda-emu",
			"--prompt-ids", "1,2,3,4,5,6,7", "--max-tokens", "6", "--ignore-eos"}
		oneLg := filepath.Join(t.TempDir(), "one.safetensors")
		one, errOut, err := runGenerate(t, append(append([]string{}, args...), "--logits-out", oneLg)...)
		if err != nil {
			t.Fatalf("%s --cp 1: %v\n%s", model.name, err, errOut)
		}
		got, lg := generateOverTwoNodes(t, args, []string{"--cp", "2"})
		if tokensLine(got) == "" || tokensLine(got) != tokensLine(one) {
			t.Errorf("%s --cp 2 over two GPU nodes: %q, --cp 1 %q", model.name, tokensLine(got), tokensLine(one))
		}
		if want, err := os.ReadFile(oneLg); err != nil || !bytes.Equal(lg, want) {
			t.Errorf("%s --cp 2 over two GPU nodes: --logits-out differs from --cp 1's (%d and %d bytes, %v)", model.name, len(lg), len(want), err)
		}
	}
}

// readLogitsBytes is readLogits on a --logits-out file's bytes.
func readLogitsBytes(t *testing.T, b []byte) ([]float32, []int) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "logits.safetensors")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return readLogits(t, path)
}
