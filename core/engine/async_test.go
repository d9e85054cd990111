package engine_test

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/engine/enginetest"
)

func TestAsyncEngineMatchesReference(t *testing.T) {
	var pendingRows atomic.Int64
	rc := enginetest.Config{Async: true, OnPlan: func(p *engine.BatchPlan) {
		for _, tok := range p.Tokens {
			if tok == engine.PendingToken {
				pendingRows.Add(1)
			}
		}
	}}
	h := start(t, rc, engine.Config{Async: true, MaxBatchTokens: 64})
	var streams []*engine.Stream
	var prompts [][]int32
	for i := 0; i < 12; i++ {
		p := prompt(40+i, 5+11*i)
		prompts = append(prompts, p)
		st, err := h.e.Submit(context.Background(), engine.Request{Prompt: p, Sampling: engine.SamplingParams{MaxTokens: 30}})
		if err != nil {
			t.Fatal(err)
		}
		streams = append(streams, st)
	}
	for i, st := range streams {
		toks, ev, err := st.Collect(context.Background())
		if err != nil || ev.Finish != engine.FinishLength {
			t.Fatalf("request %d: %+v %v", i, ev, err)
		}
		if want := enginetest.Reference(256, prompts[i], 30, greedy()); !slices.Equal(toks, want) {
			t.Fatalf("request %d: %v, want %v", i, toks, want)
		}
	}
	if pendingRows.Load() == 0 {
		t.Fatal("no plan was built ahead with a pending token")
	}
	h.checkWhole()
}

func TestAsyncNeedsAQualifiedRunner(t *testing.T) {
	r, err := enginetest.New(enginetest.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := engine.New(r, engine.Config{Pool: r.Pool(), Async: true}); err == nil {
		t.Error("async accepted for a runner that takes no pending tokens")
	}
	// Drafts, sliding windows and recurrent groups no longer keep a runner from it.
	for name, rc := range map[string]enginetest.Config{
		"plain":          {Async: true},
		"drafts":         {Async: true, MaxDrafts: 2},
		"sliding window": {Async: true, Window: 32},
		"recurrent":      {Async: true, Recurrent: true},
	} {
		r, err := enginetest.New(rc)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := engine.New(r, engine.Config{Pool: r.Pool(), Async: true}); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestAsyncFailedStepVoidsThePlanBuiltAfterIt(t *testing.T) {
	d := newDirect(t, enginetest.Config{Async: true, Fail: func(step uint64) bool { return step == 2 }}, engine.Config{Async: true})
	a := d.add("a", prompt(1, 10), engine.SamplingParams{MaxTokens: 8}, 0)
	p1 := d.s.Schedule()
	p2 := d.s.Schedule() // built while p1 "runs"
	if p2 == nil || !slices.Contains(p2.Tokens, engine.PendingToken) {
		t.Fatal("no plan built ahead")
	}
	if d.s.Schedule() != nil {
		t.Fatal("a third plan was handed out with two pending")
	}
	res, err := d.r.Execute(context.Background(), p1)
	if err := d.s.Update(p1, res, err); err != nil {
		t.Fatal(err)
	}
	p3 := d.s.Schedule()
	res, err = d.r.Execute(context.Background(), p2) // step 2 fails
	if !errors.Is(err, enginetest.ErrInjected) {
		t.Fatalf("step 2: %v", err)
	}
	if err := d.s.Update(p2, res, err); err != nil {
		t.Fatal(err)
	}
	if d.s.Pending(p3) {
		t.Fatal("the plan built after the failed step is still pending")
	}
	if !slices.Equal(a.finishes, []engine.FinishReason{engine.FinishError}) {
		t.Fatalf("finishes %v", a.finishes)
	}
	b := d.add("b", prompt(2, 10), engine.SamplingParams{MaxTokens: 8}, 0)
	d.runAll()
	if want := enginetest.Reference(256, prompt(2, 10), 8, greedy()); !slices.Equal(b.tokens, want) {
		t.Fatalf("after the failure: %v, want %v", b.tokens, want)
	}
	d.checkWhole()
}
