package dptest

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
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kernels/ref"
	"github.com/resin-llm/resin/core/kvslab"
)

// DraftRank is one dp rank of a MoE model opened with its MTP head drafting.
type DraftRank struct {
	Forward dp.Forward // the model's DPForward
	Draft   dp.Draft   // the model's DPDraft (or the rank's Draft)
	Pool    *kvslab.Pool
	Info    engine.RunnerInfo
	Groups  int // the runner's cache groups
	// Split reports whether the rank holds fewer than all the routed experts.
	Split bool
}

// DraftModel is what a model gives CheckMTP.
type DraftModel struct {
	Drafts int // draft tokens a step
	// Dispatches are the model's exchanges (gather, then all-to-all).
	Dispatches []int
	// Open opens the model's len(data) dp ranks drafting Drafts tokens with exchange
	// dispatch over data; forced, when not nil, chooses the drafts of a greedy request
	// (the model's test hook) instead of the MTP head.
	Open func(dispatch int, forced func(promptLen, pos int, logits []float32) int32, data []dist.Communicator) ([]DraftRank, error)
}

// CheckMTP checks DP-attention 2 × EP 2 with every rank drafting m.Drafts tokens per step
// from its MTP head (the head's routed experts split over the ranks too), by either
// exchange, with the head's own drafts and with drafts forced right but at every third
// position: reqs give want, the tokens one engine gives without drafts (greedy and
// seeded), with rank 1 idle for several steps while reqs[0] runs alone; its idle draft
// steps run the MTP head's exchanges with rank 0's rows (without them the busy rank's
// draft rounds wait for it until the data group's deadline).
func CheckMTP(t *testing.T, m DraftModel, vocab int, reqs []engine.Request, want map[string][]int32) {
	full := map[int][]int32{}
	for _, q := range reqs {
		full[len(q.Prompt)] = append(slices.Clone(q.Prompt), want[q.ID]...)
	}
	forced := func(promptLen, pos int, logits []float32) int32 {
		if seq := full[promptLen]; pos < len(seq) && pos%3 != 0 {
			return seq[pos]
		}
		return (int32(ref.Argmax(logits)) + 1) % int32(vocab)
	}
	gather, all := m.Dispatches[0], m.Dispatches[len(m.Dispatches)-1]
	for _, tc := range []struct {
		d      int
		forced bool
	}{{gather, false}, {all, true}, {gather, true}} {
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
			var f func(promptLen, pos int, logits []float32) int32
			if tc.forced {
				f = forced
			}
			runners, err := m.Open(tc.d, f, data)
			if err != nil {
				t.Fatal(err)
			}
			reached, release := make(chan struct{}), make(chan struct{})
			var idleDrafts [size]atomic.Int32
			ranks := make([]dp.Rank, size)
			for r, run := range runners {
				if !run.Split {
					t.Fatalf("rank %d holds every routed expert: not split", r)
				}
				forward := func(p *engine.BatchPlan, logits []float32) error {
					if r == 0 && p.Step == 4 && p.NumTokens() > 0 {
						close(reached)
						<-release
					}
					return run.Forward(p, logits)
				}
				draft := func(p *engine.BatchPlan, res *engine.StepResult) error {
					if p.NumSeqs() == 0 {
						idleDrafts[r].Add(1)
					}
					return run.Draft(p, res)
				}
				ranks[r] = dp.Rank{Forward: forward, Draft: draft, MaxDrafts: m.Drafts, CacheGroups: run.Groups, Ctl: ctl[r], Data: data[r]}
			}
			g, err := dp.NewGroup(ranks, dp.Options{})
			if err != nil {
				t.Fatal(err)
			}
			engines := make([]*engine.Engine, size)
			for r, run := range runners {
				cr := cpurunner.New(run.Info, g.Runner(r))
				if cr.Info().MaxDrafts != m.Drafts {
					t.Fatalf("rank %d's runner drafts %d, want %d", r, cr.Info().MaxDrafts, m.Drafts)
				}
				if engines[r], err = engine.New(cr, engine.Config{Pool: run.Pool, MaxBatchTokens: 16}); err != nil {
					t.Fatal(err)
				}
			}
			c, err := dp.NewCoordinator(g, engines)
			if err != nil {
				t.Fatal(err)
			}
			c.Start(context.Background())
			RunHeld(t, c, reqs, reached, release, want)
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
