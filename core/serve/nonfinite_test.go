package serve

import (
	"context"
	"encoding/json"
	"math"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/engine/enginetest"
	"github.com/resin-llm/resin/core/tokenizer"
)

// nonFiniteRunner is the test runner with its logprobs made what a model with masked or
// broken logits gives: every top alternative -inf (topInf), or every chosen token's
// logprob NaN (chosenNaN).
type nonFiniteRunner struct {
	*enginetest.Runner
	topInf, chosenNaN atomic.Bool
}

func (r *nonFiniteRunner) Execute(ctx context.Context, p *engine.BatchPlan) (engine.StepResult, error) {
	res, err := r.Runner.Execute(ctx, p)
	if r.topInf.Load() {
		for i := range res.TopLogprobs {
			res.TopLogprobs[i] = float32(math.Inf(-1))
		}
	}
	if r.chosenNaN.Load() {
		for i := range res.Logprobs {
			res.Logprobs[i] = float32(math.NaN())
		}
	}
	return res, err
}

// TestNonFiniteLogprobs: a -inf logprob is written as -9999 (vLLM's clamp) in chat and
// completion logprobs, streamed or not; a NaN one fails the request with a 500 naming
// it, and the server goes on serving with nothing left open. Before, the response was
// encoded after its 200 status was written: JSON has no NaN or infinity, so the client
// got 200 with an empty body (or, streamed, "json: unsupported value").
func TestNonFiniteLogprobs(t *testing.T) {
	var nf *nonFiniteRunner
	h := newHarness(t, harnessOpts{wrap: func(r *enginetest.Runner, _ *tokenizer.Tokenizer, _ int32) engine.Runner {
		nf = &nonFiniteRunner{Runner: r}
		return nf
	}})
	chat := map[string]any{"messages": userMsg, "max_tokens": 3, "logprobs": true, "top_logprobs": 2}
	cmpl := map[string]any{"prompt": "hello", "max_tokens": 3, "logprobs": 2}
	streamed := func(b map[string]any) map[string]any {
		out := map[string]any{"stream": true}
		for k, v := range b {
			out[k] = v
		}
		return out
	}

	nf.topInf.Store(true)
	for _, tc := range []struct {
		path string
		body map[string]any
	}{{"/v1/chat/completions", chat}, {"/v1/chat/completions", streamed(chat)}, {"/v1/completions", cmpl}, {"/v1/completions", streamed(cmpl)}} {
		code, raw := h.post(tc.path, tc.body)
		events := []string{string(raw)}
		if tc.body["stream"] == true {
			events = sseEvents(t, raw)
		}
		tops := 0
		for _, ev := range events {
			if ev == "[DONE]" {
				continue
			}
			var v any
			if err := json.Unmarshal([]byte(ev), &v); err != nil || strings.Contains(ev, `"error"`) {
				t.Fatalf("%s stream=%v with -inf top logprobs: %d %q (%v)", tc.path, tc.body["stream"], code, ev, err)
			}
			tops += strings.Count(ev, "-9999")
		}
		if code != 200 || tops == 0 {
			t.Fatalf("%s stream=%v with -inf top logprobs: %d, %d logprobs of -9999 in %s", tc.path, tc.body["stream"], code, tops, raw)
		}
	}

	nf.topInf.Store(false)
	nf.chosenNaN.Store(true)
	for _, tc := range []struct {
		path string
		body map[string]any
	}{{"/v1/chat/completions", chat}, {"/v1/chat/completions", streamed(chat)}, {"/v1/completions", cmpl}, {"/v1/completions", streamed(cmpl)}} {
		code, raw := h.post(tc.path, tc.body)
		var e errorResp
		if code != 500 || json.Unmarshal(raw, &e) != nil || !strings.Contains(e.Error.Message, "logprob NaN") {
			t.Fatalf("%s stream=%v with NaN logprobs: %d %s, want 500 naming the NaN", tc.path, tc.body["stream"], code, raw)
		}
	}
	// Without logprobs asked for there is nothing to write, and the server serves on.
	if code, raw := h.post("/v1/completions", map[string]any{"prompt": "hello", "max_tokens": 3}); code != 200 {
		t.Fatalf("after NaN logprobs, a request without logprobs: %d %s", code, raw)
	}
	nf.chosenNaN.Store(false)
	if code, raw := h.post("/v1/chat/completions", chat); code != 200 {
		t.Fatalf("after NaN logprobs: %d %s", code, raw)
	}
	h.stopAndCheck("requests failed on NaN logprobs")
}
