package glm5flash

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/cpurunner"
	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/dist/dp"
	"github.com/resin-llm/resin/core/dist/dp/dptest"
	"github.com/resin-llm/resin/core/engine"
)

// dpRequests: greedy and seeded, prompts of uneven lengths.
func dpRequests(vocab int) []engine.Request {
	prompt := func(n, seed int) []int32 {
		p := make([]int32, n)
		for i := range p {
			p[i] = int32((seed*31 + i*17) % vocab)
		}
		return p
	}
	return []engine.Request{
		{ID: "greedy", Prompt: prompt(9, 1), Sampling: engine.SamplingParams{MaxTokens: 10, IgnoreEOS: true}},
		{ID: "seeded", Prompt: prompt(6, 2), Sampling: engine.SamplingParams{MaxTokens: 7, Temperature: 0.9, Seed: 11, HasSeed: true, IgnoreEOS: true}},
		{ID: "greedy2", Prompt: prompt(13, 3), Sampling: engine.SamplingParams{MaxTokens: 5, IgnoreEOS: true}},
	}
}

// dpWant is what one engine on the tiny model gives each request, run one after another.
func dpWant(t *testing.T, reqs []engine.Request) map[string][]int32 {
	t.Helper()
	r, pool := tinyTextRunner(t)
	e, err := engine.New(r, engine.Config{Pool: pool, MaxBatchTokens: 16})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	defer func() {
		e.Close()
		cancel()
		<-done
	}()
	want := map[string][]int32{}
	for _, q := range reqs {
		s, err := e.Submit(context.Background(), q)
		if err != nil {
			t.Fatal(err)
		}
		want[q.ID] = dptest.Collect(t, s)
	}
	return want
}

// TestDPAttentionMatchesSingleEngine: DP-attention 2 × EP 2 (each rank attending its own
// requests, the routed experts of the sparse layers split over the two ranks, both exchanges, with and without
// graph-bucket padding) gives every request exactly the tokens one engine gives (greedy
// and seeded), with rank 1 idle for several steps while the first request runs alone:
// its idle plans run the MoE exchanges with rank 0's rows.
func TestDPAttentionMatchesSingleEngine(t *testing.T) {
	reqs := dpRequests(tinyTextModel(t).Config.VocabSize)
	want := dpWant(t, reqs)
	for _, tc := range []struct {
		d Dispatch
		o dp.Options
	}{{DispatchGather, dp.Options{}}, {DispatchAllToAll, dp.Options{}}, {DispatchAllToAll, dp.Options{GraphBuckets: []int{1, 2, 4}}}} {
		t.Run(fmt.Sprintf("dispatch%d-buckets%v", tc.d, tc.o.GraphBuckets), func(t *testing.T) {
			const size = 2
			ctl, err := dist.NewInProcess(size, dist.Options{Timeout: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			data, err := dist.NewInProcess(size, dist.Options{Timeout: 30 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			runners, pools, err := OpenDPRanks(tinyDir(t), tinyOpts, tc.d, data)
			if err != nil {
				t.Fatal(err)
			}
			// Rank 0's fourth step waits until the other requests are in: the first
			// request prefills and decodes alone until then, rank 1 idling.
			reached, release := make(chan struct{}), make(chan struct{})
			var idle, busy, padded [size]atomic.Int32
			ranks := make([]dp.Rank, size)
			for r, run := range runners {
				if lo, hi := run.Model.experts(); hi-lo >= run.Model.Config.NRoutedExperts {
					t.Fatalf("rank %d holds experts [%d, %d): not split", r, lo, hi)
				}
				forward := func(p *engine.BatchPlan, logits []float32) error {
					if r == 0 && p.Step == 4 && p.NumTokens() > 0 {
						close(reached)
						<-release
					}
					if p.NumTokens() == 0 {
						idle[r].Add(1)
					} else {
						busy[r].Add(1)
					}
					if p.DP.Pad > 0 {
						padded[r].Add(1)
					}
					return run.DPForward(p, logits)
				}
				ranks[r] = dp.Rank{Forward: forward, CacheGroups: len(run.CacheGroups()), Ctl: ctl[r], Data: data[r]}
			}
			g, err := dp.NewGroup(ranks, tc.o)
			if err != nil {
				t.Fatal(err)
			}
			engines := make([]*engine.Engine, size)
			for r, run := range runners {
				cr := cpurunner.New(run.Info(), cpurunner.ForwardFunc(g.Forward(r)))
				if engines[r], err = engine.New(cr, engine.Config{Pool: pools[r], MaxBatchTokens: 16}); err != nil {
					t.Fatal(err)
				}
			}
			c, err := dp.NewCoordinator(g, engines)
			if err != nil {
				t.Fatal(err)
			}
			c.Start(context.Background())
			on := dptest.RunHeld(t, c, reqs, reached, release, want)
			r0 := on[reqs[0].ID]
			if err := c.Close(); err != nil {
				t.Fatal(err)
			}
			if r0 != 0 || on["seeded"] != 1 {
				t.Errorf("routed to ranks %v: the second request should go to the rank without work", on)
			}
			if n := idle[1].Load(); n < 3 {
				t.Errorf("rank 1 ran %d idle plans while the first request ran alone, want at least 3", n)
			}
			if busy[0].Load() == 0 || busy[1].Load() == 0 {
				t.Errorf("busy steps: rank 0 %d, rank 1 %d", busy[0].Load(), busy[1].Load())
			}
			if p := padded[0].Load() + padded[1].Load(); (len(tc.o.GraphBuckets) > 0) != (p > 0) {
				t.Errorf("%d padded steps with graph buckets %v", p, tc.o.GraphBuckets)
			}
		})
	}
}

// TestDPForwardRefuses: a plan of another dp rank, or whose step miscounts its tokens, is
// refused before any collective; OpenDPRanks refuses one rank, DPDraft a rank opened
// without drafts.
func TestDPForwardRefuses(t *testing.T) {
	data, err := dist.NewInProcess(2, dist.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	runners, _, err := OpenDPRanks(tinyDir(t), tinyOpts, DispatchAllToAll, data)
	if err != nil {
		t.Fatal(err)
	}
	idle := engine.BatchPlan{QueryStart: []int32{0}, LogitsStart: []int32{0}}
	for name, st := range map[string]engine.DPStep{
		"other rank": {Rank: 1, Tokens: []int32{0, 0}},
		"no dp":      {},
		"miscount":   {Rank: 0, Tokens: []int32{3, 0}},
	} {
		p := idle
		p.DP = st
		if err := runners[0].DPForward(&p, nil); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, _, err := OpenDPRanks(tinyDir(t), tinyOpts, DispatchGather, data[:1]); err == nil {
		t.Error("one dp rank accepted")
	}
	// Ranks opened without drafts have no draft step (TestDPAttentionMTP: with them).
	if err := runners[0].DPDraft(&idle, &engine.StepResult{}); err == nil || !strings.Contains(err.Error(), "not opened for DP-attention with drafts") {
		t.Errorf("DPDraft on a rank without drafts: %v", err)
	}
}
