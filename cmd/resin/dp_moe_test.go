package main

import (
	"os"
	"path/filepath"
	"testing"
)

// TestGenerateDPAttentionMoE: `resin generate --model M --dp 2 --dp-attention` for both
// MoE models (the routed experts split over the two dp ranks, both exchanges) prints the
// tokens one engine prints: the one request runs on rank 0 while rank 1 idles every step,
// its idle plans meeting rank 0's MoE exchanges. deepseek-v4-flash also writes the same
// --logits-out bytes (glm-5-flash adds its routed sum to the shared experts' output in
// another order, so its logits may differ in the last bits).
func TestGenerateDPAttentionMoE(t *testing.T) {
	for _, model := range []string{"deepseek-v4-flash", "glm-5-flash"} {
		args := []string{"--model", model, "--random-weights", "../../models/" + model + "/config.json",
			"--prompt-ids", "1,2,3", "--max-tokens", "12", "--ignore-eos"}
		var want, wantLogits string
		for i, extra := range [][]string{nil, {"--dp", "2", "--dp-attention"}, {"--dp", "2", "--dp-attention", "--ep-dispatch", "all-to-all"}} {
			path := filepath.Join(t.TempDir(), "l.safetensors")
			got, errOut, err := runGenerate(t, append(append(extra, "--logits-out", path), args...)...)
			if err != nil {
				t.Fatalf("%s %v: %v (%s)", model, extra, err, errOut)
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
				t.Errorf("%s %v printed %q, one engine %q", model, extra, got, want)
			}
			if len(b) != len(wantLogits) || model == "deepseek-v4-flash" && string(b) != wantLogits {
				t.Errorf("%s %v --logits-out wrote other logits than one engine", model, extra)
			}
		}
	}
}
