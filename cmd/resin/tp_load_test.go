package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/resin-llm/resin/core/weights"
	"github.com/resin-llm/resin/models/llama"
)

// TestGenerateTPCheckpoint: on a saved llama checkpoint (bf16, so the rows and columns
// read are decoded too), `--tp 2` with ranks in this process and with --tp-procs (each
// rank reading only its slices: core/dist/tp's TestLoadShardReadsItsSlices counts them)
// prints what one rank prints.
func TestGenerateTPCheckpoint(t *testing.T) {
	cfg, err := os.ReadFile(tinyLlama)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "config.json"), cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := llama.LoadConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := llama.RandomWeights(c, 3).Save(c, dir, weights.BF16); err != nil {
		t.Fatal(err)
	}
	args := []string{"--model", "llama", "--weights", dir, "--cache-bytes", "4000000",
		"--prompt-ids", "5,9,17,33,2,8", "--max-tokens", "16", "--ignore-eos"}
	want, errOut, err := runGenerate(t, args...)
	if err != nil {
		t.Fatalf("%v (%s)", err, errOut)
	}
	for _, extra := range [][]string{{"--tp", "2"}, {"--tp", "2", "--tp-procs"}} {
		got, errOut, err := runGenerate(t, append(extra, args...)...)
		if err != nil {
			t.Fatalf("%v: %v (%s)", extra, err, errOut)
		}
		if withoutTiming(got) != withoutTiming(want) {
			t.Fatalf("%v printed %q, one rank %q", extra, got, want)
		}
	}
}
