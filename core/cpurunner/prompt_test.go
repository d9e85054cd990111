package cpurunner_test

import (
	"context"
	"slices"
	"testing"

	"github.com/resin-llm/resin/core/cpurunner"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/runnertest"
)

// TestEnginePromptLogprobs: through the real engine, with the prompt in chunks and a
// request batched beside that does not ask, every prompt token after the first gets the
// fake model's log-softmax at it and its top alternatives, and the generated tokens are
// those of a request without prompt logprobs.
func TestEnginePromptLogprobs(t *testing.T) {
	r := cpurunner.New(info(), &fake{})
	e, stop := startEngine(t, r, engine.Config{MaxBatchTokens: 8})
	defer stop()
	p := runnertest.Prompt(21, vocab, 4)
	sp := engine.SamplingParams{MaxTokens: 4, IgnoreEOS: true, Temperature: 0.7, Seed: 3, HasSeed: true}
	plain, err := e.Submit(context.Background(), engine.Request{Prompt: p, Sampling: sp})
	if err != nil {
		t.Fatal(err)
	}
	sp.PromptLogprobs, sp.Logprobs, sp.TopLogprobs = true, true, 2
	scored, err := e.Submit(context.Background(), engine.Request{Prompt: p, Sampling: sp})
	if err != nil {
		t.Fatal(err)
	}
	want, _, err := plain.Collect(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var got []int32
	var lps []engine.TokenLogprob
	for {
		ev, err := scored.Recv(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, ev.Tokens...)
		if ev.PromptLogprobs != nil {
			lps = ev.PromptLogprobs
		}
		if ev.Finish != engine.FinishNone {
			break
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("tokens %v, want %v (as without prompt logprobs)", got, want)
	}
	if len(lps) != len(p)-1 {
		t.Fatalf("%d prompt logprobs for a prompt of %d", len(lps), len(p))
	}
	var s engine.Sampler
	logits := make([]float32, vocab)
	for k := 0; k+1 < len(p); k++ {
		tokenLogits(logits, p[k], int32(k))
		lp, top := s.Score(logits, p[k+1], 2, nil)
		if lps[k].Token != p[k+1] || lps[k].Logprob != lp || !slices.Equal(lps[k].Top, top) {
			t.Fatalf("position %d: %+v, want %v %v %v", k+1, lps[k], p[k+1], lp, top)
		}
	}
}
