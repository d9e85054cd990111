package engine_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/engine/enginetest"
)

// TestDecodeRowsMatchGeneralPath drives two schedulers with the same random submissions,
// aborts and runner failures, one of them building every plan row through the general
// path, and checks that every plan they hand out is the same, byte for byte, and that
// every request gets the same tokens and finish. Sampling parameters and logprobs vary
// per request, so rows that keep their sampling row from two plans ago are checked too.
func TestDecodeRowsMatchGeneralPath(t *testing.T) {
	for _, tc := range []struct {
		window, drafts int
		async, mirror  bool
	}{{0, 0, false, false}, {0, 2, false, false}, {12, 0, false, false}, {0, 0, true, false},
		{0, 0, false, true}, {0, 2, false, true}} {
		t.Run(fmt.Sprintf("window%d-drafts%d-async%v-mirror%v", tc.window, tc.drafts, tc.async, tc.mirror), func(t *testing.T) {
			var ds [2]*direct
			for k := range ds {
				rc := enginetest.Config{BlockTokens: 8, Pages: 40, Window: tc.window, MaxDrafts: tc.drafts, EOS: []int32{3}, Async: tc.async, Mirror: tc.mirror,
					WrongDraft: func(pos, j int) bool { return (pos+j)%3 == 0 },
					Fail:       func(step uint64) bool { return step%53 == 0 }}
				if tc.window > 0 {
					rc.Pages = 14
				}
				ds[k] = newDirect(t, rc, engine.Config{MaxBatchTokens: 40, MaxSeqs: 6, Async: tc.async})
			}
			ds[1].s.DisableDecodeRows()
			rng := rand.New(rand.NewPCG(7, uint64(tc.window+tc.drafts)))
			var outs [2][]*recorder
			var inflight [2]*engine.BatchPlan
			ids := 0
			for round := 0; round < 400; round++ {
				for n := rng.IntN(3); n > 0; n-- {
					p := prompt(500+ids, 1+rng.IntN(40))
					sp := engine.SamplingParams{MaxTokens: 1 + rng.IntN(40), Temperature: float32(rng.IntN(3)) / 2,
						TopK: rng.IntN(5), Seed: rng.Uint64(), HasSeed: true, Logprobs: rng.IntN(4) == 0}
					for k, d := range ds {
						outs[k] = append(outs[k], d.add(fmt.Sprint(ids), p, sp, 0))
					}
					ids++
				}
				abort := rng.IntN(6) == 0
				victim := fmt.Sprint(rng.IntN(ids + 1))
				var plans [2][]byte
				for k, d := range ds {
					if abort {
						d.s.Abort(victim)
					}
					p := inflight[k]
					if p == nil {
						p = d.s.Schedule()
					}
					if p == nil {
						continue
					}
					var next *engine.BatchPlan
					if tc.async {
						next = d.s.Schedule()
					}
					for _, q := range []*engine.BatchPlan{p, next} {
						if q != nil && q != inflight[k] {
							b, err := q.MarshalBinary()
							if err != nil {
								t.Fatal(err)
							}
							plans[k] = append(plans[k], b...)
						}
					}
					res, err := d.r.Execute(context.Background(), p)
					if err := d.s.Update(p, res, err); err != nil {
						t.Fatal(err)
					}
					inflight[k] = next
					if next != nil && !d.s.Pending(next) {
						inflight[k] = nil
					}
					if err := d.s.CheckBookkeeping(); err != nil {
						t.Fatalf("round %d, scheduler %d: %v", round, k, err)
					}
				}
				if !bytes.Equal(plans[0], plans[1]) {
					t.Fatalf("round %d: the decode rows' plan differs from the general path's", round)
				}
			}
			for k, d := range ds {
				if p := inflight[k]; p != nil {
					res, err := d.r.Execute(context.Background(), p)
					if err := d.s.Update(p, res, err); err != nil {
						t.Fatal(err)
					}
				}
				d.runAll()
			}
			finished := 0
			for i := range outs[0] {
				a, b := outs[0][i], outs[1][i]
				if !slices.Equal(a.tokens, b.tokens) || !slices.Equal(a.finishes, b.finishes) {
					t.Fatalf("request %d: %v %v, general path %v %v", i, a.tokens, a.finishes, b.tokens, b.finishes)
				}
				if len(a.finishes) == 1 && a.finishes[0] == engine.FinishLength {
					finished++
				}
			}
			if finished == 0 {
				t.Fatal("no request ran to its max tokens")
			}
		})
	}
}
