package dp_test

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
	"github.com/resin-llm/resin/core/dist/dp/dptest"
	"github.com/resin-llm/resin/core/dist/ep"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/models/llama"
)

// tiny is models/llama's config shrunk as core/dist/tp's tests shrink it, with seeded
// random weights; every call builds a model of its own (a Model's scratch buffers are
// not shared between ranks) with the same weights.
func tiny(t testing.TB) *llama.Model {
	c, err := llama.LoadConfig("../../../models/llama")
	if err != nil {
		t.Fatal(err)
	}
	group := c.NumAttentionHeads / c.NumKeyValueHeads
	c.NumKeyValueHeads = 2
	c.NumAttentionHeads = 2 * min(group, 4)
	c.HeadDim, c.HiddenSize, c.IntermediateSize, c.NumHiddenLayers = 16, 64, 96, 2
	c.VocabSize = min(c.VocabSize, 383)
	if c.Window > 0 {
		c.Window = 5
	}
	m, err := llama.NewModel(c, llama.RandomWeights(c, 7), 256)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// The test model's expert layer: the llama forward's logits are the model's, and every
// token of every rank also goes, as a row of moeHidden values, through an expert-parallel
// layer over the dp group (core/dist/ep's all-to-all, experts split over the ranks, each
// row routed to two experts with weights 1/2). The experts are the identity, so each row
// must come back exactly; the layer is there for its collectives, which meet only when
// every rank runs every step, an idle rank included.
const (
	moeHidden  = 8
	moeExperts = 3
)

var moeLayer = ep.Layer{Experts: moeExperts, Hidden: moeHidden, TopK: 2}

func identity(e int, x []float32, n int, y []float32) error { copy(y, x[:n*moeHidden]); return nil }

// rankStats counts what a rank's forward saw.
type rankStats struct {
	idle, busy, padded atomic.Int32
}

// moeForward is rank's forward: llama on its own cache, then the expert layer over data
// (the dp group) on the plan's tokens, padded with dummy rows (masked routes) to DP.Pad. hook
// (nil: none) runs before the expert layer; true skips the layer.
func moeForward(m *llama.Model, kv *llama.KVCache, data dist.Communicator, st *rankStats, hook func(*engine.BatchPlan) bool) dp.Forward {
	return func(p *engine.BatchPlan, logits []float32) error {
		if len(p.DP.Tokens) != data.Size() || int(p.DP.Rank) != data.Rank() {
			return fmt.Errorf("plan DP %+v on rank %d of %d", p.DP, data.Rank(), data.Size())
		}
		if p.NumTokens() > 0 {
			st.busy.Add(1)
			if err := m.Forward(p, kv, logits); err != nil {
				return err
			}
		} else {
			st.idle.Add(1)
		}
		if hook != nil && hook(p) {
			return nil // a rank that leaves the collective: its peers must time out
		}
		rows := p.NumTokens()
		if p.DP.Pad > 0 {
			st.padded.Add(1)
			rows = int(p.DP.Pad)
		}
		r := ep.Routes{X: make([]float32, rows*moeHidden), IDs: make([]int32, 2*rows), Weights: make([]float32, 2*rows)}
		for i := range rows {
			if i >= p.NumTokens() {
				r.IDs[2*i], r.IDs[2*i+1] = ep.Masked, ep.Masked // a dummy row: no expert
				continue
			}
			tok := p.Tokens[i]
			r.Weights[2*i], r.Weights[2*i+1] = 0.5, 0.5
			for d := range moeHidden {
				r.X[i*moeHidden+d] = float32(tok) + float32(d)/8
			}
			r.IDs[2*i], r.IDs[2*i+1] = (tok+int32(i))%moeExperts, (tok+int32(i)+1)%moeExperts
		}
		out := make([]float32, len(r.X))
		if err := ep.AllToAll(data, moeLayer, r, identity, out); err != nil {
			return err
		}
		if n := p.NumTokens() * moeHidden; !slices.Equal(out[:n], r.X[:n]) {
			return fmt.Errorf("rank %d: the expert layer changed its rows", data.Rank())
		}
		return nil
	}
}

// dpEngines starts size dp ranks of the tiny llama, each with an engine and a pool of its
// own, under a coordinator; the data communicator's collectives have timeout; hook goes
// to each rank's moeForward.
func dpEngines(t *testing.T, size int, o dp.Options, timeout time.Duration, hook func(rank int, p *engine.BatchPlan) bool) (*dp.Coordinator, []*rankStats) {
	ctl, err := dist.NewInProcess(size, dist.Options{Timeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	data, err := dist.NewInProcess(size, dist.Options{Timeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	ranks := make([]dp.Rank, size)
	stats := make([]*rankStats, size)
	runners := make([]*llama.Runner, size)
	pools := make([]*kvslab.Pool, size)
	for r := range size {
		m := tiny(t)
		runners[r] = llama.NewRunner(m, 4)
		if pools[r], err = engine.NewHostPool(runners[r].CacheGroups(), 4<<20); err != nil {
			t.Fatal(err)
		}
		kv, err := llama.NewKVCache(m.Config, pools[r])
		if err != nil {
			t.Fatal(err)
		}
		var sk func(*engine.BatchPlan) bool
		if hook != nil {
			sk = func(p *engine.BatchPlan) bool { return hook(r, p) }
		}
		stats[r] = &rankStats{}
		ranks[r] = dp.Rank{Forward: moeForward(m, kv, data[r], stats[r], sk), CacheGroups: len(runners[r].CacheGroups()), Ctl: ctl[r], Data: data[r]}
	}
	g, err := dp.NewGroup(ranks, o)
	if err != nil {
		t.Fatal(err)
	}
	engines := make([]*engine.Engine, size)
	for r := range size {
		run := cpurunner.New(runners[r].Info(), cpurunner.ForwardFunc(g.Forward(r)))
		if engines[r], err = engine.New(run, engine.Config{Pool: pools[r], MaxBatchTokens: 16}); err != nil {
			t.Fatal(err)
		}
	}
	c, err := dp.NewCoordinator(g, engines)
	if err != nil {
		t.Fatal(err)
	}
	c.Start(context.Background())
	return c, stats
}

// single is the reference: one engine on the tiny llama.
func single(t *testing.T) *engine.Engine {
	r := llama.NewRunner(tiny(t), 4)
	pool, err := r.NewPool(4 << 20)
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.New(r, engine.Config{Pool: pool, MaxBatchTokens: 16})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	t.Cleanup(func() {
		e.Close()
		cancel()
		<-done
	})
	return e
}

// requests: greedy, seeded sampling, seeded top-k; prompts of uneven lengths.
func requests(vocab int) []engine.Request {
	prompt := func(n, seed int) []int32 {
		p := make([]int32, n)
		for i := range p {
			p[i] = int32((seed*131 + i*17) % vocab)
		}
		return p
	}
	return []engine.Request{
		{ID: "greedy", Prompt: prompt(9, 1), Sampling: engine.SamplingParams{MaxTokens: 12, IgnoreEOS: true}},
		{ID: "seeded", Prompt: prompt(6, 2), Sampling: engine.SamplingParams{MaxTokens: 8, Temperature: 0.9, Seed: 11, HasSeed: true, IgnoreEOS: true}},
		{ID: "topk", Prompt: prompt(13, 3), Sampling: engine.SamplingParams{MaxTokens: 5, Temperature: 0.7, TopK: 20, Seed: 5, HasSeed: true, IgnoreEOS: true}},
	}
}

// TestDPMatchesSingleEngine: DP=2 gives every request exactly the tokens one engine
// gives (greedy and seeded), with rank 1 idle while the first request runs alone and
// rank 0 idle once it is done; with graph buckets, decode steps pad every rank to the
// bucket above the largest count.
func TestDPMatchesSingleEngine(t *testing.T) {
	for _, o := range []dp.Options{{}, {GraphBuckets: []int{1, 2, 4}}} {
		t.Run(fmt.Sprintf("buckets%v", o.GraphBuckets), func(t *testing.T) {
			ref := single(t)
			reqs := requests(ref.Info().VocabSize)
			want := map[string][]int32{}
			for _, q := range reqs {
				s, err := ref.Submit(context.Background(), q)
				if err != nil {
					t.Fatal(err)
				}
				want[q.ID] = dptest.Collect(t, s)
			}

			// Rank 0's fourth step waits until the other requests are in: the first
			// request prefills and decodes alone until then, rank 1 idling.
			reached, release := make(chan struct{}), make(chan struct{})
			gate := func(rank int, p *engine.BatchPlan) bool {
				if rank == 0 && p.Step == 4 && p.NumTokens() > 0 {
					close(reached)
					<-release
				}
				return false
			}
			c, stats := dpEngines(t, 2, o, 30*time.Second, gate)
			ctx := context.Background()
			ranks := dptest.RunHeld(t, c, reqs, reached, release, want)
			r0 := ranks[reqs[0].ID]
			// All done: the ranks pause (no step runs), and wake together for new work.
			idle0, idle1 := stats[0].idle.Load(), stats[1].idle.Load()
			busy := stats[0].busy.Load() + stats[1].busy.Load()
			time.Sleep(20 * time.Millisecond)
			if stats[1].idle.Load() != idle1 || stats[0].busy.Load()+stats[1].busy.Load() != busy {
				t.Errorf("steps ran with no work")
			}
			again := reqs[2]
			again.ID = "again"
			s, r, err := c.SubmitRank(ctx, again)
			if err != nil {
				t.Fatalf("submit after the pause: %v", err)
			}
			if got := dptest.Collect(t, s); !slices.Equal(got, want[reqs[2].ID]) {
				t.Errorf("after the pause: %v, one engine %v", got, want[reqs[2].ID])
			}
			if woke := []bool{stats[0].idle.Load() > idle0, stats[1].idle.Load() > idle1}; !woke[1-r] {
				t.Errorf("rank %d did not wake with rank %d", 1-r, r)
			}
			if err := c.Close(); err != nil {
				t.Fatal(err)
			}
			if r0 != 0 || ranks["seeded"] != 1 {
				t.Errorf("routed to ranks %v: the second request should go to the rank without work", ranks)
			}
			if n := stats[1].idle.Load(); n < 3 {
				t.Errorf("rank 1 ran %d idle plans while the first request ran alone, want at least 3", n)
			}
			if stats[0].idle.Load()+stats[1].idle.Load() == 0 || stats[0].busy.Load() == 0 || stats[1].busy.Load() == 0 {
				t.Errorf("busy/idle steps: rank 0 %d/%d, rank 1 %d/%d", stats[0].busy.Load(), stats[0].idle.Load(), stats[1].busy.Load(), stats[1].idle.Load())
			}
			padded := stats[0].padded.Load() + stats[1].padded.Load()
			if (len(o.GraphBuckets) > 0) != (padded > 0) {
				t.Errorf("%d padded steps with graph buckets %v", padded, o.GraphBuckets)
			}
		})
	}
}

// TestDPCollectiveDeadline: a rank that leaves the expert layer's collective in a step
// makes its peer's wait end at the data communicator's deadline with an error naming
// it; the request on the waiting rank fails with that error, the group stops, and
// nothing hangs.
func TestDPCollectiveDeadline(t *testing.T) {
	skip := func(rank int, p *engine.BatchPlan) bool { return rank == 1 && p.Step >= 3 }
	c, _ := dpEngines(t, 2, dp.Options{}, 300*time.Millisecond, skip)
	q := requests(383)[0]
	s, r, err := c.SubmitRank(context.Background(), q)
	if err != nil || r != 0 {
		t.Fatalf("submit: rank %d, %v", r, err)
	}
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, ev, err := s.Collect(ctx)
		done <- errors.Join(err, ev.Err)
	}()
	var reqErr error
	select {
	case reqErr = <-done:
	case <-time.After(2 * time.Minute):
		t.Fatal("the request hangs")
	}
	var pe *dist.PeerError
	if !errors.As(reqErr, &pe) || pe.Peer != 1 || !errors.Is(reqErr, dist.ErrTimeout) {
		t.Fatalf("the request ended with %v, want a deadline error naming rank 1", reqErr)
	}
	select { // the broken group makes the coordinator dead (a server over it stops)
	case <-c.Dead():
	case <-time.After(time.Minute):
		t.Fatal("Dead is not closed after the group broke")
	}
	if err := c.Err(); !errors.As(err, &pe) || pe.Peer != 1 || !strings.Contains(err.Error(), "dp group") {
		t.Fatalf("Err = %v, want the error that broke the group", err)
	}
	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	select {
	case err := <-closed:
		if !errors.As(err, &pe) || pe.Peer != 1 {
			t.Fatalf("Close: %v, want the error that broke the group", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Close hangs")
	}
	if _, err := c.Submit(context.Background(), q); err == nil {
		t.Fatal("a broken group accepted a request")
	}
}

// TestNewGroupRefuses: ranks without communicators, or with another rank's, and bad
// buckets are refused, naming the problem.
func TestNewGroupRefuses(t *testing.T) {
	cs, _ := dist.NewInProcess(2, dist.Options{})
	f := func(*engine.BatchPlan, []float32) error { return nil }
	for name, c := range map[string]struct {
		ranks []dp.Rank
		o     dp.Options
	}{
		"no communicator": {[]dp.Rank{{Forward: f}}, dp.Options{}},
		"swapped ranks":   {[]dp.Rank{{Forward: f, Ctl: cs[1], Data: cs[1]}, {Forward: f, Ctl: cs[0], Data: cs[0]}}, dp.Options{}},
		"buckets":         {[]dp.Rank{{Forward: f, Ctl: cs[0], Data: cs[0]}, {Forward: f, Ctl: cs[1], Data: cs[1]}}, dp.Options{GraphBuckets: []int{4, 2}}},
	} {
		if _, err := dp.NewGroup(c.ranks, c.o); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestReplicasMatchSingleEngine: without a group the ranks are replicas stepping on
// their own; the coordinator spreads the requests over them and each request gets one
// engine's tokens; Drain waits for them, and Close twice is fine.
func TestReplicasMatchSingleEngine(t *testing.T) {
	ref := single(t)
	reqs := requests(ref.Info().VocabSize)
	want := map[string][]int32{}
	for _, q := range reqs {
		s, err := ref.Submit(context.Background(), q)
		if err != nil {
			t.Fatal(err)
		}
		want[q.ID] = dptest.Collect(t, s)
	}
	c := replicas(t)
	c.Start(context.Background())
	streams := map[string]*engine.Stream{}
	used := map[int]bool{}
	for _, q := range reqs {
		s, r, err := c.SubmitRank(context.Background(), q)
		if err != nil {
			t.Fatal(err)
		}
		streams[q.ID], used[r] = s, true
	}
	for id, s := range streams {
		if got := dptest.Collect(t, s); !slices.Equal(got, want[id]) {
			t.Errorf("%s: %v, one engine %v", id, got, want[id])
		}
	}
	if !used[0] || !used[1] {
		t.Errorf("requests went to ranks %v only", used)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(c.Close(), c.Close()); err != nil {
		t.Fatal(err)
	}
}

// TestCoordinatorIDsAreUnique: requests submitted without an id get ids unique over the
// ranks, and aborting one leaves the other rank's request running. Each engine used to
// number its own ("req-1" on both ranks), so a client's disconnect under --dp aborted
// another client's request on the other rank.
func TestCoordinatorIDsAreUnique(t *testing.T) {
	c := replicas(t)
	c.Start(context.Background())
	defer c.Close()
	q := engine.Request{Prompt: []int32{1, 2, 3}, Sampling: engine.SamplingParams{MaxTokens: 40, IgnoreEOS: true}}
	a, ra, err := c.SubmitRank(context.Background(), q)
	if err != nil {
		t.Fatal(err)
	}
	b, rb, err := c.SubmitRank(context.Background(), q)
	if err != nil {
		t.Fatal(err)
	}
	if ra == rb || a.ID() == b.ID() {
		t.Fatalf("ranks %d and %d, ids %q and %q: want two ranks and two ids", ra, rb, a.ID(), b.ID())
	}
	c.Abort(a.ID())
	toks, ev, err := b.Collect(context.Background())
	if err != nil || len(toks) != 40 {
		t.Fatalf("the other rank's request after the abort: %d tokens, %+v, %v", len(toks), ev, err)
	}
}

// replicas is a coordinator over two replica engines of the tiny llama (not started).
func replicas(t *testing.T) *dp.Coordinator {
	t.Helper()
	var engines []*engine.Engine
	for range 2 {
		r := llama.NewRunner(tiny(t), 4)
		pool, err := r.NewPool(4 << 20)
		if err != nil {
			t.Fatal(err)
		}
		e, err := engine.New(r, engine.Config{Pool: pool, MaxBatchTokens: 16})
		if err != nil {
			t.Fatal(err)
		}
		engines = append(engines, e)
	}
	c, err := dp.NewCoordinator(nil, engines)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
