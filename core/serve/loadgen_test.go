package serve

import (
	"context"
	"testing"

	"github.com/resin-llm/resin/core/serve/loadgen"
)

// TestLoadGeneratorAgainstServer runs `resin bench serve`'s load generator against the
// real service: every request must complete with exactly the asked output length.
func TestLoadGeneratorAgainstServer(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	for _, chat := range []bool{false, true} {
		rep, err := loadgen.Run(context.Background(), loadgen.Config{
			BaseURL: h.ts.URL, Model: "tiny-test", Chat: chat, Requests: 24, Concurrency: 6,
			PromptLen: 20, OutputTokens: 12, IgnoreEOS: true, Seed: 3,
		})
		if err != nil {
			t.Fatal(err)
		}
		if rep.Completed != 24 || rep.Failed != 0 {
			t.Fatalf("chat=%v: %d completed, %d failed: %v", chat, rep.Completed, rep.Failed, rep.Errors)
		}
		if rep.OutputTokens != 24*12 {
			t.Fatalf("chat=%v: %d output tokens, want %d", chat, rep.OutputTokens, 24*12)
		}
		if rep.PromptTokens < 24*20 {
			t.Fatalf("chat=%v: %d prompt tokens for 24 prompts of 20 words", chat, rep.PromptTokens)
		}
	}
}
