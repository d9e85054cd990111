package engine_test

import (
	"context"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/engine/enginetest"
)

// A prompt prefilled in chunks, each planned while the one before runs (Config.Async),
// leaves the same recurrent checkpoints in the prefix cache as without Async: the hit of
// a later prompt that shares the first chunk is as long.
func TestAsyncChunkedPrefillKeepsCheckpointHits(t *testing.T) {
	var hits [2]uint64
	for k, async := range []bool{false, true} {
		d := newDirect(t, enginetest.Config{Async: async, Recurrent: true, BlockTokens: 8, Pages: 128},
			engine.Config{Async: async, MaxBatchTokens: 48})
		a := prompt(1, 100)
		d.add("a", a, engine.SamplingParams{MaxTokens: 2}, 0)
		ahead := 0
		for p := d.s.Schedule(); p != nil; {
			next := d.s.Schedule() // built while p "runs" (nil without Async)
			if next != nil {
				ahead++
			}
			d.run(p)
			if p = next; p == nil {
				p = d.s.Schedule()
			}
		}
		if async && ahead == 0 {
			t.Fatal("no chunk was planned ahead")
		}
		b := append(slices.Clone(a[:48]), prompt(2, 5)...)
		d.add("b", b, engine.SamplingParams{MaxTokens: 2}, 0)
		d.runAll()
		hits[k] = d.s.Counters().PrefixHits
		d.checkWhole()
	}
	if hits[0] != 48 || hits[1] != hits[0] {
		t.Fatalf("prefix hits: %d without Async, %d with; want 48 both", hits[0], hits[1])
	}
}

// Run stopped while a step is in flight (Config.Async) and started again continues where
// the requests were: a step that ran to completion before Run noticed its context was
// cancelled is applied, not rolled back, since it already moved each sequence's recurrent
// state (which a rollback cannot undo) and the runner's sampled tokens.
func TestAsyncRunRestartAfterCancelKeepsRecurrentState(t *testing.T) {
	for _, rc := range []enginetest.Config{
		{Async: true, Recurrent: true, BlockTokens: 8},
		{Async: true, Recurrent: true, BlockTokens: 8, EngineCacheOps: true},
	} {
		var cancel context.CancelFunc
		var cancelAt atomic.Uint64
		cancelAt.Store(6)
		rc.OnPlan = func(p *engine.BatchPlan) {
			if p.Step == cancelAt.Load() {
				cancel()
				// Let Run see the cancellation while this step still runs (the window the
				// test is about; without it the step is usually applied before Run looks).
				time.Sleep(20 * time.Millisecond)
			}
		}
		r, err := enginetest.New(rc)
		if err != nil {
			t.Fatal(err)
		}
		e, err := engine.New(r, engine.Config{Pool: r.Pool(), Async: true})
		if err != nil {
			t.Fatal(err)
		}
		ctx, c := context.WithCancel(context.Background())
		cancel = c
		done := make(chan error, 1)
		go func() { done <- e.Run(ctx) }()
		p := prompt(4, 20)
		st, err := e.Submit(context.Background(), engine.Request{Prompt: p, Sampling: engine.SamplingParams{MaxTokens: 30}})
		if err != nil {
			t.Fatal(err)
		}
		<-done
		cancelAt.Store(0)
		ctx2, cancel2 := context.WithCancel(context.Background())
		go func() { done <- e.Run(ctx2) }()
		toks, ev, err := st.Collect(context.Background())
		cancel2()
		<-done
		if err != nil || ev.Finish != engine.FinishLength {
			t.Fatalf("%+v %v (runner: %v)", ev, err, r.Err())
		}
		if want := enginetest.Reference(256, p, 30, greedy()); !slices.Equal(toks, want) {
			t.Fatalf("%v, want %v", toks, want)
		}
		if err := r.Err(); err != nil {
			t.Fatal(err)
		}
		if err := r.Pool().Check(); err != nil || r.Pool().OpenSeqs() != 0 {
			t.Fatalf("pool %v, %d open", err, r.Pool().OpenSeqs())
		}
	}
}
