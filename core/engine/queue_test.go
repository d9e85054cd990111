package engine_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"testing"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/engine/enginetest"
)

// TestWaitingQueueRemoval aborts and stops waiting requests out of order, under both
// policies, and checks that the rest are admitted in their order and finish normally.
func TestWaitingQueueRemoval(t *testing.T) {
	for _, policy := range []engine.Policy{engine.PolicyFCFS, engine.PolicyPriority} {
		t.Run(fmt.Sprint(policy), func(t *testing.T) {
			d := newDirect(t, enginetest.Config{BlockTokens: 16}, engine.Config{MaxSeqs: 2, Policy: policy})
			outs := make([]*recorder, 300)
			for i := range outs {
				outs[i] = d.add(strconv.Itoa(i), prompt(i, 8), engine.SamplingParams{MaxTokens: 2}, i%3)
			}
			if d.s.NumWaiting() != 300 {
				t.Fatalf("waiting %d", d.s.NumWaiting())
			}
			removed := map[int]bool{}
			for i := len(outs) - 1; i >= 0; i -= 2 { // every other one, from the back
				if !d.s.Abort(strconv.Itoa(i)) {
					t.Fatalf("abort %d: not in flight", i)
				}
				removed[i] = true
			}
			for i := 0; i < 100; i += 4 {
				if !d.s.Stop(strconv.Itoa(i)) {
					t.Fatalf("stop %d: not in flight", i)
				}
				removed[i] = true
			}
			if d.s.Abort("1") || d.s.NumWaiting() != 300-len(removed) {
				t.Fatalf("a removed request is still queued: waiting %d, want %d", d.s.NumWaiting(), 300-len(removed))
			}
			d.runAll()
			for i, o := range outs {
				want := engine.FinishLength
				switch {
				case removed[i] && i%2 == 1:
					want = engine.FinishAbort
				case removed[i]:
					want = engine.FinishStop
				}
				if !slices.Equal(o.finishes, []engine.FinishReason{want}) {
					t.Fatalf("request %d finishes %v, want %v", i, o.finishes, want)
				}
				if !removed[i] && len(o.tokens) != 2 {
					t.Fatalf("request %d: %d tokens", i, len(o.tokens))
				}
			}
			d.checkWhole()
		})
	}
}

// TestPoolCapsContext: a pool that cannot hold one sequence of the runner's maximum
// context caps the context, so a request beyond the pool is refused at Add.
func TestPoolCapsContext(t *testing.T) {
	r, err := enginetest.New(enginetest.Config{BlockTokens: 16, Pages: 4, MaxContext: 4096})
	if err != nil {
		t.Fatal(err)
	}
	s, err := engine.NewScheduler(r.Info(), engine.Config{Pool: r.Pool()})
	if err != nil {
		t.Fatal(err)
	}
	if s.MaxContext() != 64 {
		t.Fatalf("max context %d, want 64 (4 pages of 16 tokens)", s.MaxContext())
	}
	err = s.Add(engine.Request{ID: "big", Prompt: prompt(1, 60), Sampling: engine.SamplingParams{MaxTokens: 10}}, &recorder{})
	if !errors.Is(err, engine.ErrContextTooLong) {
		t.Fatalf("got %v, want ErrContextTooLong", err)
	}
	e, err := engine.New(r, engine.Config{Pool: r.Pool()})
	if err != nil {
		t.Fatal(err)
	}
	if e.Info().MaxContext != 64 {
		t.Fatalf("engine reports max context %d", e.Info().MaxContext)
	}
}

// BenchmarkAbortWaiting fills the waiting queue with 100,000 requests (the engine is not
// running) and measures ending them all: "close" is Close's abort-all, "each" aborts
// them one by one, newest first (the worst order for a linear scan). It reports the
// time of one whole wave as ms/100k.
func BenchmarkAbortWaiting(b *testing.B) {
	const n = 100_000
	for _, mode := range []string{"close", "each"} {
		b.Run(mode, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				r, err := enginetest.New(enginetest.Config{})
				if err != nil {
					b.Fatal(err)
				}
				e, err := engine.New(r, engine.Config{Pool: r.Pool()})
				if err != nil {
					b.Fatal(err)
				}
				ids := make([]string, n)
				for j := range ids {
					st, err := e.Submit(context.Background(), engine.Request{Prompt: []int32{int32(j % 256), 1, 2}, Sampling: engine.SamplingParams{MaxTokens: 4}})
					if err != nil {
						b.Fatal(err)
					}
					ids[j] = st.ID()
				}
				b.StartTimer()
				if mode == "close" {
					e.Close()
				} else {
					for j := n - 1; j >= 0; j-- {
						if !e.Abort(ids[j]) {
							b.Fatalf("abort %s: not in flight", ids[j])
						}
					}
				}
				b.StopTimer()
				if st := e.Stats(); st.Waiting != 0 {
					b.Fatalf("%d still waiting", st.Waiting)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/100k")
		})
	}
}
