package main

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestNumSpeculativeTokens: --num-speculative-tokens decodes DeepSeek-V4-Flash with MTP
// drafts, and greedy output equals decoding without them; a model without a draft head,
// or no --model at all, is refused by name.
func TestNumSpeculativeTokens(t *testing.T) {
	cfg := filepath.Join("..", "..", "models", "deepseek-v4-flash", "config.json")
	args := []string{"--model", "deepseek-v4-flash", "--random-weights", cfg, "--prompt-ids", "1,2,3,4,5,6,7", "--max-tokens", "20"}
	plain, errOut, err := runGenerate(t, args...)
	if err != nil {
		t.Fatalf("%v\n%s", err, errOut)
	}
	for _, k := range []string{"1", "3"} {
		spec, errOut, err := runGenerate(t, append(args, "--num-speculative-tokens", k)...)
		if err != nil {
			t.Fatalf("k=%s: %v\n%s", k, err, errOut)
		}
		if tokensLine(spec) != tokensLine(plain) || tokensLine(plain) == "" {
			t.Errorf("k=%s: speculative %q, plain %q", k, tokensLine(spec), tokensLine(plain))
		}
	}
	llama := filepath.Join("testdata", "tiny-llama", "config.json")
	if _, _, err := runGenerate(t, "--model", "llama", "--random-weights", llama, "--prompt-ids", "1,2", "--num-speculative-tokens", "1"); err == nil || !strings.Contains(err.Error(), "no draft head") {
		t.Errorf("llama with drafts: err = %v", err)
	}
	if _, _, err := runGenerate(t, "--prompt-ids", "1,2", "--num-speculative-tokens", "1"); err == nil || !strings.Contains(err.Error(), "needs --model") {
		t.Errorf("test runner with drafts: err = %v", err)
	}
}

func tokensLine(out string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "tokens:") {
			return l
		}
	}
	return ""
}
