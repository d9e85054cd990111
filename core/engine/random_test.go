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
// (also while a step is in flight), runner failures, drafts and both policies over full
// and sliding-window caches, checking the bookkeeping against the pool after every step
// and every finished request's tokens against the reference.
func TestRandomOperations(t *testing.T) {
	for _, tc := range []struct {
		window int
		policy engine.Policy
		async  bool
	}{{0, engine.PolicyFCFS, false}, {0, engine.PolicyPriority, false}, {12, engine.PolicyFCFS, false}, {12, engine.PolicyPriority, false},
		{0, engine.PolicyFCFS, true}, {0, engine.PolicyPriority, true}} {
		t.Run(fmt.Sprintf("window%d-policy%d-async%v", tc.window, tc.policy, tc.async), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(tc.window), uint64(tc.policy)))
			var failNext bool
			pages := 40
			if tc.window > 0 {
				pages = 14 // a 12-token window holds at most 3 pages per sequence
			}
			drafts := 2
			if tc.async {
				drafts = 0
			}
			rc := enginetest.Config{BlockTokens: 8, Pages: pages, Window: tc.window, MaxDrafts: drafts, EOS: []int32{3}, Async: tc.async,
				WrongDraft: func(pos, j int) bool { return (pos+j)%4 == 0 },
				Fail:       func(uint64) bool { f := failNext; failNext = false; return f }}
			d := newDirect(t, rc, engine.Config{MaxBatchTokens: 48, MaxSeqs: 6, Policy: tc.policy, Async: tc.async})
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
				res, err := d.r.Execute(context.Background(), p)
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
				res, err := d.r.Execute(context.Background(), inflight)
				if err := d.s.Update(inflight, res, err); err != nil {
					t.Fatal(err)
				}
			}
			if tc.async && ahead < 100 {
				t.Fatalf("only %d plans were built ahead", ahead)
			}
			d.runAll()
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
