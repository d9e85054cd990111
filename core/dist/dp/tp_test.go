package dp_test

import (
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/dist/dp"
	"github.com/resin-llm/resin/core/dist/dp/dptest"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/models/llama"
)

// TestAttentionTPFailures: under AttentionTP (2 dp ranks of 2 TP ranks, every rank's
// forward an all-reduce over the world, as the MoE exchanges are) a plan the first rank's
// Check refuses reaches no other rank of its dp rank; and a follower whose forward fails
// closes its world communicator, so the other ranks' collectives fail at once rather than
// at their (here hour-long) deadline.
func TestAttentionTPFailures(t *testing.T) {
	world, err := dist.NewInProcess(4, dist.Options{Timeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	m := tiny(t)
	var ran [4]atomic.Int32
	ranks := make([]dp.TPRank, 4)
	for w := range ranks {
		var pool *kvslab.Pool
		if w%2 != 0 {
			if pool, err = engine.NewHostPool(llama.CacheGroups(m.Config, 4), 1<<20); err != nil {
				t.Fatal(err)
			}
		}
		ranks[w] = dp.TPRank{Pool: pool, World: world[w], Forward: func(p *engine.BatchPlan, logits []float32) error {
			ran[w].Add(1)
			if w == 1 && p.Step == 2 {
				return errors.New("rank 1 fails")
			}
			return dist.AllReduceF32(world[w], make([]float32, 4))
		}}
	}
	ranks[0].Check = func(p *engine.BatchPlan, logits []float32) error { return errors.New("refused") }
	a, err := dp.StartAttentionTP(2, ranks, 8)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	defer func() { // first, should the test fail: the ranks left waiting then return
		for _, c := range world {
			c.Close()
		}
	}()
	busy := engine.BatchPlan{Step: 1, QueryStart: []int32{0, 1}, Tokens: []int32{1}, Positions: []int32{0}, ReqIDs: []uint64{1}, Computed: []int32{0}}
	if err := a.Forward(0)(&busy, nil); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("a refused plan: %v", err)
	}
	if ran[0].Load()+ran[1].Load() != 0 {
		t.Fatalf("a plan the check refused ran on %d and %d ranks", ran[0].Load(), ran[1].Load())
	}
	idle := engine.BatchPlan{Step: 2, QueryStart: []int32{0}, LogitsStart: []int32{0}}
	errs := bothDPRanks(t, a, idle, "the dp ranks' step with a failed follower")
	if errs[0] == nil || errs[1] == nil {
		t.Fatalf("a failed follower: dp rank 0 %v, dp rank 1 %v; want both to fail", errs[0], errs[1])
	}
}

// TestAttentionTPClosesSplitGroups: a rank whose forward fails before its TP group's
// all-reduce (a group its model split from World, here each dp rank's pair) closes it
// through TPRank.CloseComms, so its TP peer, waiting there, fails at once rather than at
// the group's (hour-long) deadline; closing World alone does not reach a split group.
func TestAttentionTPClosesSplitGroups(t *testing.T) {
	world, err := dist.NewInProcess(4, dist.Options{Timeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	tps := make([]dist.Communicator, 4)
	if err := dist.OnEveryRank(world, func(w int, c dist.Communicator) (err error) {
		tps[w], err = c.Split(w/2, w)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	m := tiny(t)
	ranks := make([]dp.TPRank, 4)
	for w := range ranks {
		var pool *kvslab.Pool
		if w%2 != 0 {
			if pool, err = engine.NewHostPool(llama.CacheGroups(m.Config, 4), 1<<20); err != nil {
				t.Fatal(err)
			}
		}
		ranks[w] = dp.TPRank{Pool: pool, World: world[w], CloseComms: func() { tps[w].Close() }, Forward: func(p *engine.BatchPlan, logits []float32) error {
			if w == 1 {
				return errors.New("rank 1 fails")
			}
			if err := dist.AllReduceF32(tps[w], make([]float32, 4)); err != nil {
				return err
			}
			return dist.AllReduceF32(world[w], make([]float32, 4))
		}}
	}
	a, err := dp.StartAttentionTP(2, ranks, 8)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	defer func() { // first, should the test fail: the ranks left waiting then return
		for _, c := range append(tps, world...) {
			c.Close()
		}
	}()
	idle := engine.BatchPlan{Step: 1, QueryStart: []int32{0}, LogitsStart: []int32{0}}
	errs := bothDPRanks(t, a, idle, "the dp ranks' step with a failed TP rank")
	if errs[0] == nil || !errors.Is(errs[0], dist.ErrPeerGone) {
		t.Fatalf("dp rank 0, whose second TP rank failed: %v, want its TP all-reduce's peer gone", errs[0])
	}
}

// bothDPRanks runs plan on both dp ranks of a at once, within the test's 30 s deadline
// (what names the step), and returns their errors.
func bothDPRanks(t *testing.T, a *dp.AttentionTP, plan engine.BatchPlan, what string) []error {
	t.Helper()
	errs := make([]error, 2)
	dptest.Within(t, 30*time.Second, what, func() {
		var wg sync.WaitGroup
		for d := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				p := plan
				errs[d] = a.Forward(d)(&p, nil)
			}()
		}
		wg.Wait()
	})
	return errs
}
