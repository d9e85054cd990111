package glm5flash

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/cpurunner"
	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/dist/dp"
	"github.com/resin-llm/resin/core/dist/dp/dptest"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kernels/ref"
)

// TestDPAttentionMTP: DP-attention 2 × EP 2 with every rank drafting 2 tokens per step
// from its MTP layer (the layer's routed experts split over the ranks too), by either
// exchange, with the layer's own drafts and with drafts forced right but at every third
// position, gives every request the tokens one engine gives without drafts (greedy and
// seeded), with rank 1 idle for several steps while the first request runs alone: its
// idle draft steps run the MTP layer's exchanges with rank 0's rows. Without the idle
// rank's exchanges (DPDraft) the busy rank's draft rounds would wait for it until the
// data group's deadline.
func TestDPAttentionMTP(t *testing.T) {
	m := tinyTextModel(t)
	reqs := dpRequests(m.Config.VocabSize)
	want := dpWant(t, reqs)
	full := map[int][]int32{}
	for _, q := range reqs {
		full[len(q.Prompt)] = append(slices.Clone(q.Prompt), want[q.ID]...)
	}
	v := int32(m.Config.VocabSize)
	forced := func(promptLen, pos, _ int, logits []float32) int32 {
		if seq := full[promptLen]; pos < len(seq) && pos%3 != 0 {
			return seq[pos]
		}
		return (int32(ref.Argmax(logits)) + 1) % v
	}
	for _, tc := range []struct {
		d      Dispatch
		forced bool
	}{{DispatchGather, false}, {DispatchAllToAll, true}, {DispatchGather, true}} {
		t.Run(fmt.Sprintf("dispatch%d-forced%v", tc.d, tc.forced), func(t *testing.T) {
			const size = 2
			ctl, err := dist.NewInProcess(size, dist.Options{Timeout: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			data, err := dist.NewInProcess(size, dist.Options{Timeout: 30 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			opts := tinyOpts
			opts.Drafts = 2
			runners, pools, err := OpenDPRanks(tinyDir(t), opts, tc.d, data)
			if err != nil {
				t.Fatal(err)
			}
			reached, release := make(chan struct{}), make(chan struct{})
			var idleDrafts [size]atomic.Int32
			ranks := make([]dp.Rank, size)
			for r, run := range runners {
				if lo, hi := run.Model.experts(); hi-lo >= run.Model.Config.NRoutedExperts {
					t.Fatalf("rank %d holds experts [%d, %d): not split", r, lo, hi)
				}
				if tc.forced {
					run.forceDraft = forced
				}
				forward := func(p *engine.BatchPlan, logits []float32) error {
					if r == 0 && p.Step == 4 && p.NumTokens() > 0 {
						close(reached)
						<-release
					}
					return run.DPForward(p, logits)
				}
				draft := func(p *engine.BatchPlan, res *engine.StepResult) error {
					if p.NumSeqs() == 0 {
						idleDrafts[r].Add(1)
					}
					return run.DPDraft(p, res)
				}
				ranks[r] = dp.Rank{Forward: forward, Draft: draft, MaxDrafts: opts.Drafts, CacheGroups: len(run.CacheGroups()), Ctl: ctl[r], Data: data[r]}
			}
			g, err := dp.NewGroup(ranks, dp.Options{})
			if err != nil {
				t.Fatal(err)
			}
			engines := make([]*engine.Engine, size)
			for r, run := range runners {
				cr := cpurunner.New(run.Info(), g.Runner(r))
				if cr.Info().MaxDrafts != 2 {
					t.Fatalf("rank %d's runner drafts %d", r, cr.Info().MaxDrafts)
				}
				if engines[r], err = engine.New(cr, engine.Config{Pool: pools[r], MaxBatchTokens: 16}); err != nil {
					t.Fatal(err)
				}
			}
			c, err := dp.NewCoordinator(g, engines)
			if err != nil {
				t.Fatal(err)
			}
			c.Start(context.Background())
			dptest.RunHeld(t, c, reqs, reached, release, want)
			var proposed, accepted uint64
			for _, e := range engines {
				proposed += e.Counters().DraftsProposed
				accepted += e.Counters().DraftsAccepted
			}
			if err := c.Close(); err != nil {
				t.Fatal(err)
			}
			if n := idleDrafts[1].Load(); n < 3 {
				t.Errorf("rank 1 drafted idle %d times while the first request ran alone, want at least 3", n)
			}
			if proposed == 0 || tc.forced && (accepted == 0 || accepted == proposed) {
				t.Errorf("%d drafts proposed, %d accepted", proposed, accepted)
			}
			t.Logf("%d drafts proposed, %d accepted; rank 1 drafted idle %d times", proposed, accepted, idleDrafts[1].Load())
		})
	}
}
