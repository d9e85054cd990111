package engine_test

import (
	"context"
	"testing"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
)

// TestContextCapOfASlidingWindowPool: a pool of 32 sliding-window layers (a 4096-token
// window) and 4 full ones, 2 GiB at 4096 bytes per token and layer (here scaled down 64
// times: 32 MiB at 64 bytes, the same pages and slabs), caps the context at 96,256 tokens
// with the default 8192-token step, with Async too: what one token in flight needs, not
// 30,720 as when the cap counted a whole step's chunk besides the window. A lone request
// that long runs to its end.
func TestContextCapOfASlidingWindowPool(t *testing.T) {
	groups := []kvslab.GroupSpec{
		{Name: "full", Kind: kvslab.Full, Layers: 4, BytesPerToken: 64, PageTokens: 16},
		{Name: "swa", Kind: kvslab.SlidingWindow, Layers: 32, BytesPerToken: 64, PageTokens: 16, Window: 4096},
	}
	for _, async := range []bool{false, true} {
		pool, err := engine.NewHostPool(groups, 32<<20)
		if err != nil {
			t.Fatal(err)
		}
		model := &standIn{}
		info := model.Info()
		info.CacheGroups, info.AsyncTokens = groups, async
		s, err := engine.NewScheduler(info, engine.Config{Pool: pool, Async: async})
		if err != nil {
			t.Fatal(err)
		}
		const want = 96_256
		if got := s.MaxContext(); got != want {
			t.Fatalf("async %v: context capped to %d tokens, want %d", async, got, want)
		}
		o := &recorder{}
		if err := s.Add(engine.Request{ID: "long", Prompt: prompt(1, want-40), Sampling: engine.SamplingParams{MaxTokens: 40}}, o); err != nil {
			t.Fatal(err)
		}
		for p := s.Schedule(); p != nil; {
			next := s.Schedule() // nil without Async: p is pending
			res, err := model.Execute(context.Background(), p)
			if err := s.Update(p, res, err); err != nil {
				t.Fatal(err)
			}
			if p = next; p == nil {
				p = s.Schedule()
			}
		}
		if len(o.finishes) != 1 || o.finishes[0] != engine.FinishLength || len(o.tokens) != 40 {
			t.Fatalf("async %v: the request at the cap ended %v after %d tokens: %v (restarts %d)", async, o.finishes, len(o.tokens), o.err, s.Counters().Restarts)
		}
		t.Logf("async %v: %d restarts", async, s.Counters().Restarts)
	}
}
