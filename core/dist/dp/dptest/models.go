//go:build unix

package dptest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/cpurunner"
	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/dist/dp"
	"github.com/resin-llm/resin/core/dist/lockstep"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
)

// The process tests a MoE model runs under DP-attention (models/deepseek-v4-flash,
// models/glm-5-flash): dp ranks 1.. are children of the test binary, each serving its
// rank's forward (its attention, its share of the routed experts, its cache) to rank 0's
// engines. The model gives a Model and names its worker test; the checks are here.

// Rank is one dp rank of a model opened for the process tests.
type Rank struct {
	Forward dp.Forward // the rank's DP-attention forward (the model's DPForward)
	Pool    *kvslab.Pool
	Info    engine.RunnerInfo
	Groups  int // the runner's cache groups
	Vocab   int
}

// Model is what a model's dp process tests give the harness.
type Model struct {
	// Worker is the name of the model's test that calls ServeWorker.
	Worker string
	// Dir is the checkpoint every rank opens (the parent's; the children read it from
	// their environment).
	Dir string
	// Open opens dp rank's runner on dir with the expert exchange dispatch (the model's
	// Dispatch as an int), its experts exchanged over data.
	Open func(dir string, dispatch int, data dist.Communicator) (Rank, error)
	// Dispatches are the model's exchanges CheckProcesses runs (gather, then all-to-all);
	// the last one is CheckWorkerKilled's.
	Dispatches []int
}

// Env names of what a model's worker child reads beyond StartProcs' own.
const (
	envDir      = "RESIN_DPTEST_DIR"
	envDispatch = "RESIN_DPTEST_DISPATCH"
	envDie      = "RESIN_DPTEST_DIE" // R:N: dp rank R's process kills itself on its N-th plan, before running it
)

// ServeWorker is the body of a model's worker test: when the test runs as a StartProcs
// child it joins the group, opens its rank with m.Open and serves its forward until rank
// 0 stops it; else it skips.
func ServeWorker(t *testing.T, m Model) {
	rank, name, size, ok := WorkerEnv()
	if !ok {
		t.Skip("a dp rank of the dp process tests; runs only as their child")
	}
	ctl, data, hello, err := dp.JoinShm(name, rank, size, dist.Options{Timeout: 20 * time.Second, JoinTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	hello.Close()
	defer ctl[0].Close()
	defer data.Close()
	d, _ := strconv.Atoi(os.Getenv(envDispatch))
	r, err := m.Open(os.Getenv(envDir), d, data)
	if err != nil {
		t.Fatal(err)
	}
	forward := lockstep.WithCacheOps(r.Pool, lockstep.Forward(r.Forward))
	var dies, n int
	if _, err := fmt.Sscanf(os.Getenv(envDie), "%d:%d", &dies, &n); err == nil && dies == rank {
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
	if err := dp.ServeForward(ctl[0], r.Vocab, dp.Forward(forward)); err != nil {
		t.Fatal(err)
	}
}

// processes is rank 0's end of a dp group of size processes (exchange d): the Group's
// ranks (rank 0's forward here, the others dp.RemoteRanks), rank 0's rank and the
// children, which the caller stops (Procs.Stop).
func processes(t *testing.T, m Model, size, d int, env ...string) ([]dp.Rank, Rank, *Procs) {
	t.Helper()
	procs := StartProcs(t, size, m.Worker, append(env, envDir+"="+m.Dir, fmt.Sprintf("%s=%d", envDispatch, d))...)
	r0, err := m.Open(m.Dir, d, procs.Data)
	if err != nil {
		procs.Stop(t, true)
		t.Fatal(err)
	}
	ranks, err := dp.RemoteRanks(r0.Forward, procs.Ctl, r0.Groups, dist.Options{Timeout: 20 * time.Second})
	if err != nil {
		procs.Stop(t, true)
		t.Fatal(err)
	}
	return ranks, r0, procs
}

// engines are the engines and coordinator of g's ranks: rank 0's on its own pool, the
// others' on ledger pools of its geometry (their caches live in the workers).
func engines(t *testing.T, g *dp.Group, r0 Rank) *dp.Coordinator {
	t.Helper()
	es := make([]*engine.Engine, g.Size())
	for r := range es {
		pool := r0.Pool
		if r > 0 {
			var err error
			if pool, err = dp.LedgerPool(r0.Pool); err != nil {
				t.Fatal(err)
			}
		}
		cr := cpurunner.New(r0.Info, cpurunner.ForwardFunc(g.Forward(r)))
		var err error
		if es[r], err = engine.New(cr, engine.Config{Pool: pool, MaxBatchTokens: 16}); err != nil {
			t.Fatal(err)
		}
	}
	c, err := dp.NewCoordinator(g, es)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// CheckProcesses checks DP-attention 2 × EP 2 with dp rank 1 a worker process (its
// attention, its half of the routed experts and its cache there; its engine in this
// process), by each of m.Dispatches (the second with graph-bucket padding): reqs (at
// least two; reqs[1] has ID "seeded") give exactly want, one engine's tokens, with rank 1
// idle for several steps while reqs[0] runs alone: its idle plans go to the worker, which
// runs the MoE exchanges with rank 0's rows. The worker then stops cleanly.
func CheckProcesses(t *testing.T, m Model, reqs []engine.Request, want map[string][]int32) {
	for i, d := range m.Dispatches {
		var o dp.Options
		if i > 0 {
			o.GraphBuckets = []int{1, 2, 4}
		}
		t.Run(fmt.Sprintf("dispatch%d-buckets%v", d, o.GraphBuckets), func(t *testing.T) {
			const size = 2
			ranks, r0, procs := processes(t, m, size, d)
			reached, release := make(chan struct{}), make(chan struct{})
			var steps [size]stepCounts
			for r := range ranks {
				ranks[r].Forward = held(r, ranks[r].Forward, reached, release, &steps[r])
			}
			g, err := dp.NewGroup(ranks, o)
			if err != nil {
				t.Fatal(err)
			}
			c := engines(t, g, r0)
			c.Start(context.Background())
			on := RunHeld(t, c, reqs, reached, release, want)
			var err2 error
			Within(t, time.Minute, "the group's Close", func() { err2 = c.Close() })
			if err2 != nil {
				t.Fatal(err2)
			}
			procs.Stop(t, false)
			if on[reqs[0].ID] != 0 || on[reqs[1].ID] != 1 {
				t.Errorf("routed to ranks %v: the second request should go to the rank without work", on)
			}
			if n := steps[1].idle.Load(); n < 3 {
				t.Errorf("rank 1 ran %d idle plans while the first request ran alone, want at least 3", n)
			}
			if steps[0].busy.Load() == 0 || steps[1].busy.Load() == 0 {
				t.Errorf("busy steps: rank 0 %d, rank 1 %d", steps[0].busy.Load(), steps[1].busy.Load())
			}
		})
	}
}

// CheckWorkerKilled checks DP 3 × EP 3 (the last of m.Dispatches) with dp rank 1's worker
// SIGKILLed in its third step (an idle one: the request runs on rank 0): the request's
// step fails with an error naming rank 1 as gone (not a deadline), within the test's
// deadline; the group is dead, its Close returns, and every worker has exited (the killed
// one reaped, rank 2's on its own once stopped): no orphan.
func CheckWorkerKilled(t *testing.T, m Model) {
	ranks, r0, procs := processes(t, m, 3, m.Dispatches[len(m.Dispatches)-1], envDie+"=1:3")
	g, err := dp.NewGroup(ranks, dp.Options{})
	if err != nil {
		t.Fatal(err)
	}
	c := engines(t, g, r0)
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
	Within(t, time.Minute, "the dead group's Close", func() { c.Close() })
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
