package engine_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"testing"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/engine/enginetest"
)

// A recurrent runner continues from its state page: a prefix hit restores it from a
// checkpoint through the plan's cache ops, executed by the runner itself or, when the
// runner leaves them, by the engine before Execute.
func TestCacheOpsRestoreRecurrentState(t *testing.T) {
	for _, engineOps := range []bool{false, true} {
		t.Run(fmt.Sprintf("engine executes ops %v", engineOps), func(t *testing.T) {
			h := start(t, enginetest.Config{BlockTokens: 8, Recurrent: true, EngineCacheOps: engineOps}, engine.Config{})
			shared := prompt(3, 40)
			for i := 0; i < 4; i++ {
				p := append(slices.Clone(shared), prompt(10+i, 5)...)
				toks, ev := h.generate(engine.Request{Prompt: p, Sampling: engine.SamplingParams{MaxTokens: 12}})
				if want := enginetest.Reference(256, p, 12, greedy()); !slices.Equal(toks, want) {
					t.Fatalf("request %d: %v (%s), want %v", i, toks, ev.Finish, want)
				}
			}
			if c := h.e.Counters(); c.PrefixHits == 0 {
				t.Fatal("no prefix hit")
			}
			if ops, released := h.r.CacheOps(); ops < 3 || released < 3 {
				t.Fatalf("%d cache ops and %d releases for three hits after three finished requests", ops, released)
			}
			h.checkWhole()
		})
	}
}

// Released names each request whose pages were freed since the previous plan, once, with
// why: finished, aborted (or failed), preempted.
func TestReleasedAnnouncesFreedRequests(t *testing.T) {
	var released []engine.Release
	handles := map[uint64]bool{}
	rc := enginetest.Config{BlockTokens: 4, Pages: 12, OnPlan: func(p *engine.BatchPlan) {
		released = append(released, p.Released...)
		for _, id := range p.ReqIDs {
			handles[id] = true
		}
	}}
	d := newDirect(t, rc, engine.Config{MaxBatchTokens: 64})
	a := d.add("a", prompt(1, 6), engine.SamplingParams{MaxTokens: 2}, 0)
	d.step() // a's prompt
	d.step() // a's second token: a finishes
	if len(a.finishes) != 1 {
		t.Fatalf("a: %v", a.finishes)
	}
	b := d.add("b", prompt(2, 6), engine.SamplingParams{MaxTokens: 30}, 0)
	c := d.add("c", prompt(3, 6), engine.SamplingParams{MaxTokens: 30}, 0)
	d.step()
	if len(released) != 1 || released[0].Reason != engine.ReleaseFinished {
		t.Fatalf("after a finished: %+v", released)
	}
	d.s.Abort("b")
	// c grows until the 12-page pool preempts someone; the rest runs to the end.
	w := d.add("w", prompt(4, 20), engine.SamplingParams{MaxTokens: 20}, 0)
	d.runAll()
	if len(b.finishes) != 1 || len(c.finishes) != 1 || len(w.finishes) != 1 {
		t.Fatalf("finishes b %v c %v w %v", b.finishes, c.finishes, w.finishes)
	}
	d.add("z", prompt(5, 3), engine.SamplingParams{MaxTokens: 1}, 0)
	d.runAll() // a last plan, which announces the last releases
	reasons := map[engine.ReleaseReason]int{}
	seen := map[uint64]int{}
	for _, r := range released {
		reasons[r.Reason]++
		seen[r.ReqID]++
		if !handles[r.ReqID] {
			t.Fatalf("release of request %d, which no plan had", r.ReqID)
		}
	}
	if reasons[engine.ReleaseAborted] != 1 || reasons[engine.ReleasePreempted] == 0 || reasons[engine.ReleaseFinished] < 3 {
		t.Fatalf("releases %+v", released)
	}
	if d.s.Counters().Preemptions != uint64(reasons[engine.ReleasePreempted]) {
		t.Fatalf("%d preemptions, %d preempted releases", d.s.Counters().Preemptions, reasons[engine.ReleasePreempted])
	}
	d.checkWhole()
}

// A plan that never ran (Rollback) gives its cache ops and releases to the next plan,
// before anything newer.
func TestRollbackReissuesCacheOps(t *testing.T) {
	var ops [][]engine.CacheOp
	rc := enginetest.Config{BlockTokens: 8, Recurrent: true, OnPlan: func(p *engine.BatchPlan) {
		ops = append(ops, slices.Clone(p.CacheOps))
	}}
	d := newDirect(t, rc, engine.Config{})
	shared := prompt(7, 24)
	d.add("a", append(slices.Clone(shared), 1, 2), engine.SamplingParams{MaxTokens: 3}, 0)
	d.runAll()
	b := d.add("b", append(slices.Clone(shared), 3, 4), engine.SamplingParams{MaxTokens: 3}, 0)
	p := d.s.Schedule()
	if len(p.CacheOps) == 0 || len(p.Released) != 1 {
		t.Fatalf("the hit's plan: %d ops, %d releases", len(p.CacheOps), len(p.Released))
	}
	want, wantRel := slices.Clone(p.CacheOps), slices.Clone(p.Released)
	if err := d.s.Rollback(p); err != nil {
		t.Fatal(err)
	}
	q := d.s.Schedule()
	if !slices.Equal(q.CacheOps, want) || !slices.Equal(q.Released, wantRel) {
		t.Fatalf("after the rollback: ops %+v releases %+v, want %+v %+v", q.CacheOps, q.Released, want, wantRel)
	}
	res, err := d.r.Execute(context.Background(), q)
	if err := d.s.Update(q, res, err); err != nil {
		t.Fatal(err)
	}
	d.runAll()
	if ref := enginetest.Reference(256, append(slices.Clone(shared), 3, 4), 3, greedy()); !slices.Equal(b.tokens, ref) {
		t.Fatalf("b: %v, want %v", b.tokens, ref)
	}
	d.checkWhole()
}

// With a drafting runner, Async builds a plan ahead only while the plan in flight
// samples nothing: over prompt chunks, not over steps whose acceptance decides where
// the sequences continue.
func TestAsyncDraftsPlanAheadOnlyOverPromptChunks(t *testing.T) {
	d := newDirect(t, enginetest.Config{Async: true, MaxDrafts: 2}, engine.Config{Async: true, MaxBatchTokens: 8})
	a := d.add("a", prompt(1, 20), engine.SamplingParams{MaxTokens: 6}, 0)
	p1 := d.s.Schedule() // tokens 0..7: samples nothing
	p2 := d.s.Schedule() // tokens 8..15, built while p1 "runs"
	if p1 == nil || p2 == nil || len(p1.LogitsIndices) != 0 {
		t.Fatalf("no plan built ahead over a prompt chunk: %v %v", p1, p2)
	}
	d.run(p1)
	p3 := d.s.Schedule() // tokens 16..19: samples, built while p2 runs
	if p3 == nil || len(p3.LogitsIndices) == 0 {
		t.Fatal("the prompt's last chunk was not planned")
	}
	d.run(p2)
	if d.s.Schedule() != nil {
		t.Fatal("a plan was built ahead of a step that samples with drafts")
	}
	d.run(p3)
	d.runAll()
	if want := enginetest.Reference(256, prompt(1, 20), 6, greedy()); !slices.Equal(a.tokens, want) {
		t.Fatalf("%v, want %v", a.tokens, want)
	}
	d.checkWhole()
}

// With Async on, a runner with drafts, a sliding-window group and a recurrent group
// generates exactly what it does with Async off.
func TestAsyncEqualsSync(t *testing.T) {
	for name, rc := range map[string]enginetest.Config{
		"drafts":         {MaxDrafts: 3, WrongDraft: func(pos, j int) bool { return (pos+j)%4 == 0 }},
		"sliding window": {Window: 12, Mirror: true},
		"recurrent":      {Recurrent: true},
		"hybrid":         {Window: 12, Recurrent: true, MaxDrafts: 2, WrongDraft: func(pos, j int) bool { return pos%3 == 0 }},
	} {
		t.Run(name, func(t *testing.T) {
			var outs [2][][]int32
			for k, async := range []bool{false, true} {
				rc := rc
				rc.Async, rc.BlockTokens, rc.Pages = async, 8, 48
				var pending int
				rc.OnPlan = func(p *engine.BatchPlan) {
					if slices.Contains(p.Tokens, engine.PendingToken) {
						pending++
					}
				}
				h := start(t, rc, engine.Config{Async: async, MaxBatchTokens: 48, MaxSeqs: 8})
				shared := prompt(99, 30)
				var streams []*engine.Stream
				for i := 0; i < 16; i++ {
					p := prompt(i, 3+5*i%37)
					if i%2 == 0 {
						p = append(slices.Clone(shared), p...)
					}
					st, err := h.e.Submit(context.Background(), engine.Request{Prompt: p, Sampling: engine.SamplingParams{MaxTokens: 10 + i%7}})
					if err != nil {
						t.Fatal(err)
					}
					streams = append(streams, st)
				}
				for i, st := range streams {
					toks, ev, err := st.Collect(context.Background())
					if err != nil || ev.Finish != engine.FinishLength {
						t.Fatalf("async %v, request %d: %+v %v", async, i, ev, err)
					}
					outs[k] = append(outs[k], toks)
				}
				if async && rc.MaxDrafts == 0 && pending == 0 {
					t.Fatal("no plan was built ahead")
				}
				c := h.e.Counters()
				t.Logf("async %v: preemptions %d, prefix hits %d, drafts %d/%d", async, c.Preemptions, c.PrefixHits, c.DraftsAccepted, c.DraftsProposed)
				if c.PrefixHits == 0 {
					// The second wave of requests sharing a prompt head is admitted after
					// the first has committed it (sliding windows included: their blocks
					// stay until committed, kvslab.ReserveInFlight).
					t.Fatalf("async %v: no prefix hit", async)
				}
				h.checkWhole()
			}
			for i := range outs[0] {
				if !slices.Equal(outs[0][i], outs[1][i]) {
					t.Fatalf("request %d: async %v, sync %v", i, outs[1][i], outs[0][i])
				}
			}
		})
	}
}

// Steady steps whose plans carry cache ops (prefix hits on a recurrent group) and
// releases (finished requests) allocate nothing in Schedule, the runner or Update: the
// plans' CacheOps and Released arrays and the pool's copy queue are reused.
func TestStepsWithCacheOpsAllocateNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under the race detector")
	}
	r, err := enginetest.New(enginetest.Config{BlockTokens: 8, Pages: 256, Recurrent: true})
	if err != nil {
		t.Fatal(err)
	}
	s, err := engine.NewScheduler(r.Info(), engine.Config{Pool: r.Pool(), MaxBatchTokens: 64, MaxSeqs: 8})
	if err != nil {
		t.Fatal(err)
	}
	shared := prompt(5, 32)
	outs := make([]*countOutput, 0, 1024)
	n := 0
	add := func() {
		p := append(slices.Clone(shared), prompt(n, 4)...)
		o := &countOutput{}
		outs = append(outs, o)
		if err := s.Add(engine.Request{ID: fmt.Sprint(n), Prompt: p, Sampling: engine.SamplingParams{MaxTokens: 5}}, o); err != nil {
			t.Fatal(err)
		}
		n++
	}
	ctx := context.Background()
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1)) // as testing.AllocsPerRun: count this goroutine's
	var ms runtime.MemStats
	var mallocs, ops, released uint64
	for step := 0; step < 600; step++ {
		for s.Len() < 8 {
			add()
		}
		runtime.ReadMemStats(&ms)
		before := ms.Mallocs
		p := s.Schedule()
		if p == nil {
			t.Fatal("nothing to run")
		}
		o, rel := len(p.CacheOps), len(p.Released)
		res, err := r.Execute(ctx, p)
		if err := s.Update(p, res, err); err != nil {
			t.Fatal(err)
		}
		runtime.ReadMemStats(&ms)
		if step >= 200 {
			mallocs += ms.Mallocs - before
			ops += uint64(o)
			released += uint64(rel)
		}
	}
	if err := r.Err(); err != nil {
		t.Fatal(err)
	}
	if ops == 0 || released == 0 {
		t.Fatalf("the measured steps carried %d cache ops and %d releases", ops, released)
	}
	// An allocation in the steady path shows once per step or per admission: hundreds
	// here. The runtime's background work (a GC cycle ending in the window) can add a
	// stray one, which testing.AllocsPerRun's per-call average also absorbs.
	if mallocs > 2 {
		t.Fatalf("400 steps with %d cache ops and %d releases allocated %d times", ops, released, mallocs)
	}
}

type countOutput struct {
	tokens   int
	finished bool
}

func (o *countOutput) Token(int32, *engine.TokenLogprob)               { o.tokens++ }
func (o *countOutput) Finish(engine.FinishReason, error, engine.Usage) { o.finished = true }

// A request aborted while the plan that restores its recurrent state is pending frees
// its pages at once; when that step then fails or is rolled back, the copy meant for it
// is dropped, not handed out again: the next plan carries no copy onto a page the pool
// may since have given to another sequence, and the pool is whole once the rest ends.
func TestAbortedRequestsCopyIsNotReissued(t *testing.T) {
	for _, how := range []string{"fail", "rollback"} {
		t.Run(how, func(t *testing.T) {
			var ops [][]engine.CacheOp
			rc := enginetest.Config{BlockTokens: 8, Recurrent: true, OnPlan: func(p *engine.BatchPlan) {
				ops = append(ops, slices.Clone(p.CacheOps))
			}}
			d := newDirect(t, rc, engine.Config{})
			shared := prompt(7, 24)
			d.add("a", append(slices.Clone(shared), 1, 2), engine.SamplingParams{MaxTokens: 3}, 0)
			d.runAll()
			d.add("b", append(slices.Clone(shared), 3, 4), engine.SamplingParams{MaxTokens: 3}, 0)
			p := d.s.Schedule()
			if len(p.CacheOps) == 0 {
				t.Fatal("the hit's plan carries no cache op")
			}
			d.s.Abort("b")
			switch how {
			case "fail":
				if err := d.s.Update(p, engine.StepResult{}, errors.New("step failed")); err != nil {
					t.Fatal(err)
				}
			case "rollback":
				if err := d.s.Rollback(p); err != nil {
					t.Fatal(err)
				}
			}
			if n := d.r.Pool().PendingCopies(); n != 0 {
				t.Fatalf("%d copies pending for an aborted request with nothing in flight", n)
			}
			ops = ops[:0]
			c := d.add("c", prompt(9, 20), engine.SamplingParams{MaxTokens: 3}, 0)
			d.runAll()
			for i, o := range ops {
				if len(o) != 0 {
					t.Fatalf("plan %d after the abort carries cache ops %+v", i, o)
				}
			}
			if ref := enginetest.Reference(256, prompt(9, 20), 3, greedy()); !slices.Equal(c.tokens, ref) {
				t.Fatalf("c: %v, want %v", c.tokens, ref)
			}
			d.checkWhole()
		})
	}
}
