package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestGenerateDPAttentionMoE: `resin generate --model deepseek-v4-flash --dp 2
// --dp-attention` (the routed experts split over the two dp ranks, both exchanges) prints
// the tokens one engine prints and writes the same --logits-out file: the one request runs
// on rank 0 while rank 1 idles every step, its idle plans meeting rank 0's MoE exchanges.
// glm-5-flash is still refused by name.
func TestGenerateDPAttentionMoE(t *testing.T) {
	args := []string{"--model", "deepseek-v4-flash", "--random-weights", "../../models/deepseek-v4-flash/config.json",
		"--prompt-ids", "1,2,3", "--max-tokens", "12", "--ignore-eos"}
	var want, wantLogits string
	for i, extra := range [][]string{nil, {"--dp", "2", "--dp-attention"}, {"--dp", "2", "--dp-attention", "--ep-dispatch", "all-to-all"}} {
		path := filepath.Join(t.TempDir(), "l.safetensors")
		got, errOut, err := runGenerate(t, append(append(extra, "--logits-out", path), args...)...)
		if err != nil {
			t.Fatalf("%v: %v (%s)", extra, err, errOut)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			want, wantLogits = withoutTiming(got), string(b)
			continue
		}
		if withoutTiming(got) != want {
			t.Errorf("%v printed %q, one engine %q", extra, got, want)
		}
		if string(b) != wantLogits {
			t.Errorf("%v --logits-out wrote other logits than one engine", extra)
		}
	}
	_, errOut, err := runGenerate(t, "--model", "glm-5-flash", "--random-weights", "../../models/glm-5-flash/config.json",
		"--prompt-ids", "1,2,3", "--max-tokens", "2", "--dp", "2", "--dp-attention")
	if err == nil || !strings.Contains(err.Error()+errOut, "--dp-attention covers --model llama and deepseek-v4-flash only") {
		t.Fatalf("glm-5-flash --dp 2 --dp-attention: %v (%s), want a refusal by name", err, errOut)
	}
}
