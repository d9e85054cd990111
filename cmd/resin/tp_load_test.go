package main

import (
	"testing"

	"github.com/resin-llm/resin/core/weights"
)

// TestGenerateTPCheckpoint: on a saved llama checkpoint (bf16, so the rows and columns
// read are decoded too), `--tp 2` with ranks in this process and with --tp-procs (each
// rank reading only its slices: core/dist/tp's TestLoadShardReadsItsSlices counts them)
// prints what one rank prints.
func TestGenerateTPCheckpoint(t *testing.T) {
	dir, _ := tinyLlamaCheckpoint(t, 3, weights.BF16)
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
