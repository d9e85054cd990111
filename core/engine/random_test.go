package engine_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/engine/enginetest"
)

// TestRandomOperations drives the scheduler directly with random submissions, aborts
// (also while a step is in flight), runner failures, steps rolled back before they ran,
// drafts and both policies over full, sliding-window and recurrent caches, with and
// without Async, checking the bookkeeping against the pool (and the pool's own
// invariants, its held copy sources included) after every step and every finished
// request's tokens against the reference.
func TestRandomOperations(t *testing.T) {
	type testCase struct {
		window    int
		policy    engine.Policy
		async     bool
		recurrent bool
		drafts    int
		engineOps bool // the engine, not the runner, executes the plans' cache ops
	}
	for _, tc := range []testCase{
		{0, engine.PolicyFCFS, false, false, 2, false}, {0, engine.PolicyPriority, false, false, 2, false},
		{12, engine.PolicyFCFS, false, false, 2, false}, {12, engine.PolicyPriority, false, false, 2, false},
		{0, engine.PolicyFCFS, true, false, 0, false}, {0, engine.PolicyPriority, true, false, 0, false},
		// Async lifted for drafts, sliding windows and recurrent groups; cache ops.
		{0, engine.PolicyFCFS, true, false, 2, false}, {12, engine.PolicyFCFS, true, false, 0, false},
		{0, engine.PolicyFCFS, false, true, 2, false}, {0, engine.PolicyPriority, true, true, 0, true},
		{12, engine.PolicyFCFS, true, true, 2, false}, {12, engine.PolicyPriority, true, true, 2, true},
	} {
		name := fmt.Sprintf("window%d-policy%d-async%v", tc.window, tc.policy, tc.async)
		if tc.recurrent || tc.async && tc.drafts > 0 || tc.async && tc.window > 0 {
			name += fmt.Sprintf("-recurrent%v-drafts%d-engineops%v", tc.recurrent, tc.drafts, tc.engineOps)
		}
		t.Run(name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(tc.window)+uint64(tc.drafts)<<8, uint64(tc.policy)+uint64(b2i(tc.recurrent))<<8))
			var failNext bool
			pages := 40
			if tc.window > 0 {
				pages = 14 // a 12-token window holds at most 3 pages per sequence
			}
			if tc.recurrent {
				pages = pages / 2 // enginetest's arena grows with the groups: keep it tight
			}
			rc := enginetest.Config{BlockTokens: 8, Pages: pages, Window: tc.window, MaxDrafts: tc.drafts, EOS: []int32{3}, Async: tc.async,
				Recurrent: tc.recurrent, EngineCacheOps: tc.engineOps,
				WrongDraft: func(pos, j int) bool { return (pos+j)%4 == 0 },
				Fail:       func(uint64) bool { f := failNext; failNext = false; return f }}
			// As a runner keeping per-request state sees the plans it executes: a request
			// starts over (a preempted one recomputes, from its prefix hit) only after a
			// plan's Released named it.
			starts := map[uint64]int32{}
			var releaseErr error
			rc.OnPlan = func(p *engine.BatchPlan) {
				for _, rel := range p.Released {
					delete(starts, rel.ReqID)
				}
				for i, id := range p.ReqIDs {
					if prev, ok := starts[id]; ok && p.Computed[i] < prev && releaseErr == nil {
						releaseErr = fmt.Errorf("step %d: request %d starts over at %d (was at %d) with no release", p.Step, id, p.Computed[i], prev)
					}
					starts[id] = p.Computed[i]
				}
			}
			d := newDirect(t, rc, engine.Config{MaxBatchTokens: 48, MaxSeqs: 6, Policy: tc.policy, Async: tc.async})
			execute := func(p *engine.BatchPlan) (engine.StepResult, error) {
				if tc.engineOps {
					// What Engine.Run does for a runner that leaves the ops to it.
					if err := engine.ApplyCacheOps(d.r.Pool(), p.CacheOps); err != nil {
						t.Fatal(err)
					}
				}
				return d.r.Execute(context.Background(), p)
			}
			rollbacks := 0
			var inflight *engine.BatchPlan // async: the plan "running" while the next is built
			ahead := 0
			type sub struct {
				p   []int32
				max int
				o   *recorder
			}
			var subs []sub
			ids := 0
			for round := 0; round < 600; round++ {
				for k := rng.IntN(3); k > 0; k-- {
					p := prompt(1000+ids, 1+rng.IntN(50))
					if rng.IntN(3) == 0 && len(subs) > 0 {
						base := subs[rng.IntN(len(subs))].p
						p = append(slices.Clone(base[:min(16, len(base))]), p...)
					}
					m := 1 + rng.IntN(30)
					subs = append(subs, sub{p, m, d.add(fmt.Sprint(ids), p, engine.SamplingParams{MaxTokens: m}, rng.IntN(3))})
					ids++
				}
				if rng.IntN(8) == 0 && ids > 0 {
					d.s.Abort(fmt.Sprint(rng.IntN(ids)))
				}
				failNext = rng.IntN(40) == 0
				p := inflight
				if p == nil {
					p = d.s.Schedule()
				}
				if p == nil {
					continue
				}
				var next *engine.BatchPlan
				if tc.async {
					if next = d.s.Schedule(); next != nil {
						ahead++
					}
				}
				if rng.IntN(30) == 0 {
					// The step is cancelled before it runs: it and the plan built after it
					// are rolled back, their cache ops and releases handed out again.
					if err := d.s.Rollback(p); err != nil {
						t.Fatal(err)
					}
					rollbacks++
					inflight = nil
					if err := d.r.Pool().Check(); err != nil {
						t.Fatalf("round %d, after a rollback: %v", round, err)
					}
					continue
				}
				res, err := execute(p)
				if rng.IntN(10) == 0 && ids > 0 {
					d.s.Abort(fmt.Sprint(rng.IntN(ids))) // in flight
				}
				if err := d.s.Update(p, res, err); err != nil {
					t.Fatal(err)
				}
				inflight = next
				if next != nil && !d.s.Pending(next) {
					inflight = nil // voided by a failed step
				}
				if err := d.s.CheckBookkeeping(); err != nil {
					t.Fatalf("round %d: %v", round, err)
				}
				if err := d.r.Pool().Check(); err != nil {
					t.Fatalf("round %d: %v", round, err)
				}
			}
			if inflight != nil {
				res, err := execute(inflight)
				if err := d.s.Update(inflight, res, err); err != nil {
					t.Fatal(err)
				}
			}
			if tc.async && ahead < 100 && tc.drafts == 0 {
				t.Fatalf("only %d plans were built ahead", ahead)
			}
			if rollbacks == 0 {
				t.Fatal("no step was rolled back")
			}
			if releaseErr != nil {
				t.Fatal(releaseErr)
			}
			if ops, _ := d.r.CacheOps(); tc.recurrent && ops == 0 {
				t.Fatal("no plan carried a cache op")
			}
			for d.s.Len() > 0 {
				p := d.s.Schedule()
				if p == nil {
					t.Fatal("requests left and nothing scheduled")
				}
				res, err := execute(p)
				if err := d.s.Update(p, res, err); err != nil {
					t.Fatal(err)
				}
			}
			if err := d.r.Err(); err != nil {
				t.Fatal(err)
			}
			counts := map[engine.FinishReason]int{}
			for i, s := range subs {
				if len(s.o.finishes) != 1 {
					t.Fatalf("request %d: finishes %v", i, s.o.finishes)
				}
				counts[s.o.finishes[0]]++
				if f := s.o.finishes[0]; f == engine.FinishStop || f == engine.FinishLength {
					if want := enginetest.Reference(256, s.p, s.max, greedy(), 3); !slices.Equal(s.o.tokens, want) {
						t.Fatalf("request %d: %v, want %v", i, s.o.tokens, want)
					}
				}
			}
			if counts[engine.FinishAbort] == 0 || counts[engine.FinishError] == 0 || counts[engine.FinishLength] == 0 {
				t.Fatalf("finishes %v: the run did not exercise aborts, errors and completions", counts)
			}
			if d.s.Counters().Preemptions == 0 {
				t.Fatal("no preemption")
			}
			d.checkWhole()
		})
	}
}
