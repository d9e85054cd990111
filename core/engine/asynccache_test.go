package engine_test

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/engine/enginetest"
	"github.com/resin-llm/resin/core/kvslab"
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

// forgetful is a runner that loses its whole cache at chosen steps, as an out-of-process
// runner that died and was restarted does: it calls Engine.ForgetCache from Execute,
// wipes every page and fails the step.
type forgetful struct {
	*enginetest.Runner
	e       *engine.Engine
	at      map[uint64]bool
	forgets atomic.Int32
}

var errForgot = errors.New("the runner lost its cache")

func (f *forgetful) Execute(ctx context.Context, p *engine.BatchPlan) (engine.StepResult, error) {
	if !f.at[p.Step] {
		return f.Runner.Execute(ctx, p)
	}
	f.forgets.Add(1)
	f.e.ForgetCache()
	// The whole arena (the scheduler may be building the next plan meanwhile: read only
	// the pool's geometry).
	pool := f.Pool()
	clear(pool.Arena().(kvslab.HostMemory).Bytes(0, pool.Arena().Size()))
	return engine.StepResult{}, errForgot
}

// After Engine.ForgetCache (a runner restarted with an empty cache) every request still
// finishes with its reference tokens: the running ones were preempted and recomputed,
// nothing reads a page cached before (the prefix cache was emptied and the pending copies
// dropped, with or without a plan built ahead), and the pool is whole at the end.
func TestForgetCacheRecomputesEverything(t *testing.T) {
	for _, async := range []bool{false, true} {
		r, err := enginetest.New(enginetest.Config{Async: async, Recurrent: true, Window: 16, BlockTokens: 8, Pages: 64})
		if err != nil {
			t.Fatal(err)
		}
		f := &forgetful{Runner: r, at: map[uint64]bool{4: true, 9: true, 15: true}}
		e, err := engine.New(f, engine.Config{Pool: r.Pool(), Async: async, MaxBatchTokens: 32, MaxSeqs: 6})
		if err != nil {
			t.Fatal(err)
		}
		f.e = e
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- e.Run(ctx) }()
		shared := prompt(8, 24)
		var streams []*engine.Stream
		var prompts [][]int32
		for i := range 12 {
			p := append(slices.Clone(shared), prompt(20+i, 3+i)...)
			st, err := e.Submit(context.Background(), engine.Request{Prompt: p, Sampling: engine.SamplingParams{MaxTokens: 12}})
			if err != nil {
				t.Fatal(err)
			}
			streams, prompts = append(streams, st), append(prompts, p)
		}
		for i, st := range streams {
			toks, ev, err := st.Collect(context.Background())
			if err != nil || ev.Finish != engine.FinishLength {
				t.Fatalf("async %v, request %d: %+v %v (runner: %v)", async, i, ev, err, r.Err())
			}
			if want := enginetest.Reference(256, prompts[i], 12, greedy()); !slices.Equal(toks, want) {
				t.Fatalf("async %v, request %d: %v, want %v", async, i, toks, want)
			}
		}
		cancel()
		<-done
		if f.forgets.Load() == 0 {
			t.Fatalf("async %v: the runner never lost its cache", async)
		}
		if err := r.Err(); err != nil {
			t.Fatal(err)
		}
		pool := r.Pool()
		if err := pool.Check(); err != nil || pool.OpenSeqs() != 0 || pool.PendingCopies() != 0 {
			t.Fatalf("async %v: pool %v, %d open, %d copies pending", async, err, pool.OpenSeqs(), pool.PendingCopies())
		}
		pool.ClearCache()
		if !pool.Whole() {
			t.Fatalf("async %v: pool not whole: %+v", async, pool.Stats())
		}
	}
}
