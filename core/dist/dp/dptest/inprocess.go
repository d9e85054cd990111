package dptest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
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

// InProcessRank is one dp rank of a MoE model opened in this process, drafting or not.
type InProcessRank struct {
	Forward dp.Forward // the model's DPForward
	Draft   dp.Draft   // the model's DPDraft; nil without drafts
	Pool    *kvslab.Pool
	Info    engine.RunnerInfo
	Groups  int // the runner's cache groups
	// Split reports whether the rank holds fewer than all the routed experts.
	Split bool
	// Check is the model's CheckPlan, for WithAttentionTP's dp ranks (nil: none).
	Check func(p *engine.BatchPlan, logits []float32) error
}

// InProcessModel is what a model gives CheckMatchesSingleEngine and CheckMTP.
type InProcessModel struct {
	// Dispatches are the model's exchanges (gather, then all-to-all).
	Dispatches []int
	// Open opens the model's len(data) dp ranks, each drafting drafts tokens a step (0:
	// none) with exchange dispatch over data; forced, when not nil, chooses the drafts of
	// a greedy request (the model's test hook) instead of the MTP head.
	Open func(dispatch, drafts int, forced func(promptLen, pos int, logits []float32) int32, data []dist.Communicator) ([]InProcessRank, error)
}

// stepCounts counts one rank's plans: without tokens, with some, padded to a graph bucket.
type stepCounts struct{ idle, busy, padded atomic.Int32 }

// held is rank r's forward counted in n, rank 0's fourth plan with tokens held (reached
// closed, then a wait for release) so that the checks can submit the other requests while
// the first runs alone.
func held(r int, forward dp.Forward, reached, release chan struct{}, n *stepCounts) dp.Forward {
	return func(p *engine.BatchPlan, logits []float32) error {
		if r == 0 && p.Step == 4 && p.NumTokens() > 0 {
			close(reached)
			<-release
		}
		if p.NumTokens() == 0 {
			n.idle.Add(1)
		} else {
			n.busy.Add(1)
		}
		if p.DP.Pad > 0 {
			n.padded.Add(1)
		}
		return forward(p, logits)
	}
}

// inProcessRun is what one run of the DP group did.
type inProcessRun struct {
	on                 map[string]int // the rank each request ran on
	idle, busy, padded [2]int32       // plans of no tokens, of some, padded to a graph bucket
	idleDrafts         [2]int32       // draft steps of no sequence
	proposed, accepted uint64
}

// runInProcess runs reqs through DP-attention 2 × EP 2 of m's ranks in goroutines
// (exchange d, drafts a step, forced drafts or the head's, options o), with rank 0's
// fourth step held until every request is in, so that reqs[0] runs alone for several
// steps with rank 1 idle; every request must give want.
func runInProcess(t *testing.T, m InProcessModel, d, drafts int, forced func(promptLen, pos int, logits []float32) int32, o dp.Options, reqs []engine.Request, want map[string][]int32) inProcessRun {
	const size = 2
	ctl, err := dist.NewInProcess(size, dist.Options{Timeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	data, err := dist.NewInProcess(size, dist.Options{Timeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	runners, err := m.Open(d, drafts, forced, data)
	if err != nil {
		t.Fatal(err)
	}
	reached, release := make(chan struct{}), make(chan struct{})
	var steps [size]stepCounts
	var idleDrafts [size]atomic.Int32
	ranks := make([]dp.Rank, size)
	for r, run := range runners {
		if !run.Split {
			t.Fatalf("rank %d holds every routed expert: not split", r)
		}
		forward := held(r, run.Forward, reached, release, &steps[r])
		ranks[r] = dp.Rank{Forward: forward, CacheGroups: run.Groups, Ctl: ctl[r], Data: data[r]}
		if drafts > 0 {
			ranks[r].MaxDrafts = drafts
			ranks[r].Draft = func(p *engine.BatchPlan, res *engine.StepResult) error {
				if p.NumSeqs() == 0 {
					idleDrafts[r].Add(1)
				}
				return run.Draft(p, res)
			}
		}
	}
	g, err := dp.NewGroup(ranks, o)
	if err != nil {
		t.Fatal(err)
	}
	engines := make([]*engine.Engine, size)
	for r, run := range runners {
		cr := cpurunner.New(run.Info, g.Runner(r))
		if cr.Info().MaxDrafts != drafts {
			t.Fatalf("rank %d's runner drafts %d, want %d", r, cr.Info().MaxDrafts, drafts)
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
	var res inProcessRun
	res.on = RunHeld(t, c, reqs, reached, release, want)
	for _, e := range engines {
		res.proposed += e.Counters().DraftsProposed
		res.accepted += e.Counters().DraftsAccepted
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	for r := range size {
		res.idle[r], res.busy[r], res.padded[r], res.idleDrafts[r] = steps[r].idle.Load(), steps[r].busy.Load(), steps[r].padded.Load(), idleDrafts[r].Load()
	}
	return res
}

// CheckMatchesSingleEngine checks DP-attention 2 × EP 2 (each rank attending its own
// requests, the routed experts split over the two ranks), by each exchange and the
// all-to-all one with graph-bucket padding too: reqs (at least two) give want, the tokens
// one engine gives (greedy and seeded), reqs[1] routed to the rank without work, rank 1
// idle for several steps while reqs[0] runs alone (its idle plans run the MoE exchanges
// with rank 0's rows), and steps padded exactly when there are graph buckets.
func CheckMatchesSingleEngine(t *testing.T, m InProcessModel, reqs []engine.Request, want map[string][]int32) {
	gather, all := m.Dispatches[0], m.Dispatches[len(m.Dispatches)-1]
	for _, tc := range []struct {
		d int
		o dp.Options
	}{{gather, dp.Options{}}, {all, dp.Options{}}, {all, dp.Options{GraphBuckets: []int{1, 2, 4}}}} {
		checkMatches(t, m, tc.d, tc.o, reqs, want)
	}
}

// CheckGraphs is CheckMatchesSingleEngine for ranks that replay CUDA graphs of decode
// batches of buckets (m's Open opening them so): by the gather exchange (m.Dispatches[0])
// with the Group padding all-decode steps to those buckets, reqs give want, with rank 1
// idle for several steps (its idle plans running, as graphs of padding rows, the
// collectives the busy rank's graphs replay) and some steps padded.
func CheckGraphs(t *testing.T, m InProcessModel, buckets []int, reqs []engine.Request, want map[string][]int32) {
	checkMatches(t, m, m.Dispatches[0], dp.Options{GraphBuckets: buckets}, reqs, want)
}

func checkMatches(t *testing.T, m InProcessModel, d int, o dp.Options, reqs []engine.Request, want map[string][]int32) {
	t.Run(fmt.Sprintf("dispatch%d-buckets%v", d, o.GraphBuckets), func(t *testing.T) {
		res := runInProcess(t, m, d, 0, nil, o, reqs, want)
		if res.on[reqs[0].ID] != 0 || res.on[reqs[1].ID] != 1 {
			t.Errorf("routed to ranks %v: the second request should go to the rank without work", res.on)
		}
		if res.idle[1] < 3 {
			t.Errorf("rank 1 ran %d idle plans while the first request ran alone, want at least 3", res.idle[1])
		}
		if res.busy[0] == 0 || res.busy[1] == 0 {
			t.Errorf("busy steps: rank 0 %d, rank 1 %d", res.busy[0], res.busy[1])
		}
		if p := res.padded[0] + res.padded[1]; (len(o.GraphBuckets) > 0) != (p > 0) {
			t.Errorf("%d padded steps with graph buckets %v", p, o.GraphBuckets)
		}
	})
}

// CheckMTP checks DP-attention 2 × EP 2 with every rank drafting 2 tokens per step from
// its MTP head (the head's routed experts split over the ranks too), by either exchange,
// with the head's own drafts and with drafts forced right but at every third position:
// reqs give want, the tokens one engine gives without drafts (greedy and seeded), with
// rank 1 idle for several steps while reqs[0] runs alone; its idle draft steps run the
// MTP head's exchanges with rank 0's rows (without them the busy rank's draft rounds wait
// for it until the data group's deadline).
func CheckMTP(t *testing.T, m InProcessModel, vocab int, reqs []engine.Request, want map[string][]int32) {
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
			var f func(promptLen, pos int, logits []float32) int32
			if tc.forced {
				f = forced
			}
			res := runInProcess(t, m, tc.d, 2, f, dp.Options{}, reqs, want)
			if res.idleDrafts[1] < 3 {
				t.Errorf("rank 1 drafted idle %d times while the first request ran alone, want at least 3", res.idleDrafts[1])
			}
			if res.proposed == 0 || tc.forced && (res.accepted == 0 || res.accepted == res.proposed) {
				t.Errorf("%d drafts proposed, %d accepted", res.proposed, res.accepted)
			}
			t.Logf("%d drafts proposed, %d accepted; rank 1 drafted idle %d times", res.proposed, res.accepted, res.idleDrafts[1])
		})
	}
}

// Alone returns a forward that runs each plan on dp rank busy of len(ranks) (its
// DPStep saying that rank has the plan's tokens and every other rank none) while every
// other rank runs an idle plan at the same time, as core/dist/dp's Group would step
// them, every rank padded to p.DP.Pad: for checking that a rank running alone gives one
// rank's logits, its idle peers meeting its exchanges.
func Alone(busy int, ranks []dp.Forward) func(p *engine.BatchPlan, logits []float32) error {
	return func(p *engine.BatchPlan, logits []float32) error {
		toks := make([]int32, len(ranks))
		toks[busy] = int32(p.NumTokens())
		errs := make(chan error, len(ranks))
		for r, forward := range ranks {
			if r == busy {
				continue
			}
			idle := &engine.BatchPlan{QueryStart: []int32{0}, LogitsStart: []int32{0}, Groups: make([]engine.GroupPlan, len(p.Groups)),
				DP: engine.DPStep{Rank: int32(r), Tokens: toks, Pad: p.DP.Pad}}
			for i := range idle.Groups {
				idle.Groups[i].PageTableStart = []int32{0}
			}
			go func() { errs <- forward(idle, nil) }()
		}
		q := *p
		q.DP = engine.DPStep{Rank: int32(busy), Tokens: toks, Pad: p.DP.Pad}
		err := ranks[busy](&q, logits)
		for range len(ranks) - 1 {
			err = errors.Join(err, <-errs)
		}
		return err
	}
}

// CheckRefusalAgreed runs bad (a plan rank 1 refuses: p.DP as the test sets it; its
// logits rows into logits) on rank 1 of ranks while rank 0 runs an idle plan of the same step (DPStep{0, bad.DP.Tokens}),
// and checks that both return within a deadline, rank 1's error containing want and rank
// 0's naming rank 1's refusal: one rank refusing a step makes every rank refuse it, so
// none waits in a collective the other never calls.
func CheckRefusalAgreed(t *testing.T, ranks []dp.Forward, bad *engine.BatchPlan, logits []float32, want string) {
	t.Helper()
	idle := &engine.BatchPlan{QueryStart: []int32{0}, LogitsStart: []int32{0}, Groups: make([]engine.GroupPlan, len(bad.Groups)),
		DP: engine.DPStep{Rank: 0, Tokens: bad.DP.Tokens, Pad: bad.DP.Pad}}
	for i := range idle.Groups {
		idle.Groups[i].PageTableStart = []int32{0}
	}
	var errs [2]error
	Within(t, time.Minute, "a step rank 1 refuses", func() {
		done := make(chan error, 1)
		go func() { done <- ranks[0](idle, nil) }()
		errs[1] = ranks[1](bad, logits)
		errs[0] = <-done
	})
	if errs[1] == nil || !strings.Contains(errs[1].Error(), want) {
		t.Errorf("rank 1's plan (DP %+v): %v, want an error containing %q", bad.DP, errs[1], want)
	}
	if errs[0] == nil || !strings.Contains(errs[0].Error(), "dp rank 1 refused") {
		t.Errorf("rank 0, idle while rank 1 refused: %v, want rank 1's refusal named", errs[0])
	}
}

// WithAttentionTP is the InProcessModel of a model's DP-attention with attention TP: each
// of the checks' dp ranks is tp ranks of this process, open opening every rank of the
// world (tp·dp communicators, world rank w in dp rank w/tp) by exchange d and returning
// each one's InProcessRank; a dp rank's forward is its TP group's under core/dist/dp's
// AttentionTP (its first rank's plans broadcast to the others, run on their pools), its
// pool, info and split its first rank's. The groups stop when t ends. It does not draft.
func WithAttentionTP(t *testing.T, tp int, dispatches []int, vocab int, open func(d int, world []dist.Communicator) ([]InProcessRank, error)) InProcessModel {
	return InProcessModel{
		Dispatches: dispatches,
		Open: func(d, drafts int, _ func(promptLen, pos int, logits []float32) int32, data []dist.Communicator) ([]InProcessRank, error) {
			if drafts > 0 {
				return nil, fmt.Errorf("dptest: attention TP does not draft")
			}
			world, err := dist.NewInProcess(tp*len(data), dist.Options{Timeout: 30 * time.Second})
			if err != nil {
				return nil, err
			}
			all, err := open(d, world)
			if err != nil {
				return nil, err
			}
			tpRanks := make([]dp.TPRank, len(all))
			for w, r := range all {
				tpRanks[w] = dp.TPRank{Forward: r.Forward, Check: r.Check, Pool: r.Pool, World: world[w]}
			}
			a, err := dp.StartAttentionTP(tp, tpRanks, vocab)
			if err != nil {
				return nil, err
			}
			t.Cleanup(func() {
				if err := a.Close(); err != nil {
					t.Error(err)
				}
			})
			ranks := make([]InProcessRank, len(data))
			for r := range ranks {
				ranks[r] = all[r*tp]
				ranks[r].Forward = a.Forward(r)
			}
			return ranks, nil
		},
	}
}
