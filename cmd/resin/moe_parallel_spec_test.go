package main

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestGenerateMoEParallelMTP: `resin generate --num-speculative-tokens 2` under --tp 2,
// --ep 2 --tp-procs (rank 1 a worker process, which drafts on each step's broadcast
// result too) and --tp 2 --ep 2 prints, for both MoE models, what one rank prints without
// drafts; llama's TP, which does not draft, refuses it by name.
func TestGenerateMoEParallelMTP(t *testing.T) {
	for _, model := range []string{"deepseek-v4-flash", "glm-5-flash"} {
		t.Run(model, func(t *testing.T) {
			args := func(extra ...string) []string {
				return append([]string{"--model", model, "--random-weights", filepath.Join("../../models", model, "config.json"),
					"--prompt-ids", "1,2,3", "--max-tokens", "12", "--ignore-eos"}, extra...)
			}
			want, errOut, err := runGenerate(t, args()...)
			if err != nil {
				t.Fatalf("%v (%s)", err, errOut)
			}
			for _, l := range [][]string{{"--tp", "2"}, {"--ep", "2", "--tp-procs"}, {"--tp", "2", "--ep", "2"}} {
				name := strings.Join(l, " ")
				got, errOut, err := runGenerate(t, args(append(l, "--num-speculative-tokens", "2")...)...)
				if err != nil {
					t.Fatalf("%s: %v (%s)", name, err, errOut)
				}
				if beforeFinish(got) != beforeFinish(want) || !strings.Contains(got, "speculative: ") {
					t.Fatalf("%s with MTP printed %q, one rank without %q", name, got, want)
				}
			}
		})
	}
	_, _, err := runGenerate(t, "--model", "llama", "--random-weights", tinyLlama, "--tp", "2", "--num-speculative-tokens", "2", "--max-tokens", "2", "hi")
	if err == nil || !strings.Contains(err.Error(), "only deepseek-v4-flash and glm-5-flash draft under a parallel layout") {
		t.Fatalf("llama --tp 2 --num-speculative-tokens 2: %v", err)
	}
}

// beforeFinish is generate's output up to its finish line (then timing and the
// speculative-decoding figures).
func beforeFinish(out string) string {
	before, _, _ := strings.Cut(out, "\nfinish: ")
	return before
}
