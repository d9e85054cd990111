//go:build unix

package deepseekv4flash

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/cpurunner"
	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/dist/dp"
	"github.com/resin-llm/resin/core/dist/dp/dptest"
	"github.com/resin-llm/resin/core/dist/lockstep"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
)

// The dp process tests run dp ranks 1.. as children of the test binary (TestDPWorker),
// each serving its rank's forward (its attention, its experts) to rank 0's engines.

// TestDPWorker is dp rank r of a process test when run as a dptest.StartProcs child
// (RESIN_DSV4_DP_DIR, _DISPATCH; _DIE=R:N: dp rank R's process kills itself on its N-th
// plan, before running it).
func TestDPWorker(t *testing.T) {
	rank, name, size, ok := dptest.WorkerEnv()
	if !ok {
		t.Skip("a dp rank of the dp process tests; runs only as their child")
	}
	ctl, data, err := dp.JoinShm(name, rank, size, dist.Options{Timeout: 20 * time.Second, JoinTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer ctl[0].Close()
	defer data.Close()
	d, _ := strconv.Atoi(os.Getenv("RESIN_DSV4_DP_DISPATCH"))
	run, pool, err := OpenDPRank(os.Getenv("RESIN_DSV4_DP_DIR"), tinyOpts, Dispatch(d), data, 8<<20)
	if err != nil {
		t.Fatal(err)
	}
	forward := lockstep.WithCacheOps(pool, run.DPForward)
	var dies, n int
	if _, err := fmt.Sscanf(os.Getenv("RESIN_DSV4_DP_DIE"), "%d:%d", &dies, &n); err == nil && dies == rank {
		inner := forward
		forward = func(p *engine.BatchPlan, logits []float32) error {
			if n--; n == 0 {
				proc, _ := os.FindProcess(os.Getpid())
				proc.Kill()
				time.Sleep(time.Minute)
			}
			return inner(p, logits)
		}
	}
	if err := dp.ServeForward(ctl[0], run.Model.Config.VocabSize, dp.Forward(forward)); err != nil {
		t.Fatal(err)
	}
}

// dpProcesses is rank 0's end of a dp group of size processes (exchange d): the Group's
// ranks (rank 0's forward here, the others RemoteForward), rank 0's runner and pool, and
// the children, which the caller stops (Procs.Stop).
func dpProcesses(t *testing.T, size int, d Dispatch, env ...string) ([]dp.Rank, *Runner, *kvslab.Pool, *dptest.Procs) {
	t.Helper()
	dir := tinyDir(t)
	procs := dptest.StartProcs(t, size, "TestDPWorker", append(env, "RESIN_DSV4_DP_DIR="+dir, fmt.Sprintf("RESIN_DSV4_DP_DISPATCH=%d", d))...)
	run, pool, err := OpenDPRank(dir, tinyOpts, d, procs.Data, 8<<20)
	if err != nil {
		procs.Stop(t, true)
		t.Fatal(err)
	}
	ranks, err := dp.RemoteRanks(run.DPForward, procs.Ctl, len(run.CacheGroups()), dist.Options{Timeout: 20 * time.Second})
	if err != nil {
		procs.Stop(t, true)
		t.Fatal(err)
	}
	return ranks, run, pool, procs
}

// dpEngines are the engines and coordinator of g's ranks: rank 0's on its runner's pool,
// the others' on ledger pools of its geometry (their caches live in the workers).
func dpEngines(t *testing.T, g *dp.Group, run *Runner, pool0 *kvslab.Pool) *dp.Coordinator {
	t.Helper()
	engines := make([]*engine.Engine, g.Size())
	for r := range engines {
		pool := pool0
		if r > 0 {
			var err error
			if pool, err = dp.LedgerPool(pool0); err != nil {
				t.Fatal(err)
			}
		}
		cr := cpurunner.New(run.Info(), cpurunner.ForwardFunc(g.Forward(r)))
		var err error
		if engines[r], err = engine.New(cr, engine.Config{Pool: pool, MaxBatchTokens: 16}); err != nil {
			t.Fatal(err)
		}
	}
	c, err := dp.NewCoordinator(g, engines)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestDPAttentionProcesses: DP-attention 2 × EP 2 with dp rank 1 a worker process (its
// attention, its half of the routed experts and its cache there; its engine in this
// process), by either exchange and with graph-bucket padding, gives every request exactly
// the tokens one engine gives (greedy and seeded), with rank 1 idle for several steps
// while the first request runs alone: its idle plans go to the worker, which runs the MoE
// exchanges with rank 0's rows. The worker then stops cleanly.
func TestDPAttentionProcesses(t *testing.T) {
	reqs := dpRequests(tinyConfig(t).VocabSize)
	want := dpWant(t, reqs)
	for _, tc := range []struct {
		d Dispatch
		o dp.Options
	}{{DispatchGather, dp.Options{}}, {DispatchAllToAll, dp.Options{GraphBuckets: []int{1, 2, 4}}}} {
		t.Run(fmt.Sprintf("dispatch%d-buckets%v", tc.d, tc.o.GraphBuckets), func(t *testing.T) {
			const size = 2
			ranks, run, pool, procs := dpProcesses(t, size, tc.d)
			reached, release := make(chan struct{}), make(chan struct{})
			var idle, busy [size]atomic.Int32
			for r := range ranks {
				forward := ranks[r].Forward
				ranks[r].Forward = func(p *engine.BatchPlan, logits []float32) error {
					if r == 0 && p.Step == 4 && p.NumTokens() > 0 {
						close(reached)
						<-release
					}
					if p.NumTokens() == 0 {
						idle[r].Add(1)
					} else {
						busy[r].Add(1)
					}
					return forward(p, logits)
				}
			}
			g, err := dp.NewGroup(ranks, tc.o)
			if err != nil {
				t.Fatal(err)
			}
			c := dpEngines(t, g, run, pool)
			c.Start(context.Background())
			on := dptest.RunHeld(t, c, reqs, reached, release, want)
			var err2 error
			dptest.Within(t, time.Minute, "the group's Close", func() { err2 = c.Close() })
			if err2 != nil {
				t.Fatal(err2)
			}
			procs.Stop(t, false)
			if on[reqs[0].ID] != 0 || on["seeded"] != 1 {
				t.Errorf("routed to ranks %v: the second request should go to the rank without work", on)
			}
			if n := idle[1].Load(); n < 3 {
				t.Errorf("rank 1 ran %d idle plans while the first request ran alone, want at least 3", n)
			}
			if busy[0].Load() == 0 || busy[1].Load() == 0 {
				t.Errorf("busy steps: rank 0 %d, rank 1 %d", busy[0].Load(), busy[1].Load())
			}
		})
	}
}

// TestDPAttentionWorkerKilled: DP 3 × EP 3 with dp rank 1's worker SIGKILLed in its third
// step (an idle one: the request runs on rank 0) fails the request's step with an error
// naming rank 1 as gone (not a deadline), within the test's deadline; the group is dead,
// its Close returns, and every worker has exited (the killed one reaped, rank 2's on its
// own once stopped): no orphan.
func TestDPAttentionWorkerKilled(t *testing.T) {
	ranks, run, pool, procs := dpProcesses(t, 3, DispatchAllToAll, "RESIN_DSV4_DP_DIE=1:3")
	g, err := dp.NewGroup(ranks, dp.Options{})
	if err != nil {
		t.Fatal(err)
	}
	c := dpEngines(t, g, run, pool)
	c.Start(context.Background())
	s, r, err := c.SubmitRank(context.Background(), engine.Request{ID: "a", Prompt: []int32{1, 2, 3}, Sampling: engine.SamplingParams{MaxTokens: 8, IgnoreEOS: true}})
	if err != nil {
		t.Fatal(err)
	}
	if r != 0 {
		t.Fatalf("the request went to rank %d, want 0", r)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, ev, err := s.Collect(ctx)
	if err == nil {
		err = ev.Err
	}
	if err == nil || !strings.Contains(err.Error(), "rank 1") {
		t.Fatalf("the request's stream ended with %v, want an error naming rank 1", err)
	}
	select {
	case <-c.Dead():
	case <-ctx.Done():
		t.Fatal("the coordinator did not die")
	}
	gerr := c.Err()
	dptest.Within(t, time.Minute, "the dead group's Close", func() { c.Close() })
	procs.Stop(t, true)
	var pe *dist.PeerError
	if !errors.As(gerr, &pe) || pe.Peer != 1 || !errors.Is(gerr, dist.ErrPeerGone) {
		t.Fatalf("the group's error %v, want rank 1 gone", gerr)
	}
	for i, cmd := range procs.Cmds {
		if cmd.ProcessState == nil {
			t.Errorf("dp rank %d's worker was not reaped", i+1)
		}
	}
	if st := procs.Cmds[0].ProcessState; st != nil && st.Success() {
		t.Errorf("dp rank 1's worker exited cleanly: it was meant to be killed")
	}
}
