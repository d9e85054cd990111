package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/cudart/emutest"
	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/dist/dp"
	"github.com/resin-llm/resin/core/dist/dp/dptest"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/gpurunner"
	"github.com/resin-llm/resin/core/kvslab"
	glm5flash "github.com/resin-llm/resin/models/glm-5-flash"
)

// TestDPProcsWorkerKilled: glm-5-flash under --dp 2 --dp-attention --dp-procs whose
// worker was SIGKILLed fails the next request's step naming the worker's rank, pid and
// signal (launch's exit on the dp group's error), within the test's deadline, and rank
// 0's Health (serve's /health) reports it before that request; stopping
// the ranks then returns and leaves no worker process behind.
func TestDPProcsWorkerKilled(t *testing.T) { checkDPProcsWorkerKilled(t, "", 1, nil) }

// TestDPTPProcsWorkerKilled is TestDPProcsWorkerKilled under --dp 2 --dp-attention --tp 2
// --dp-procs (three workers, dp.RemoteTPRanks): the worker killed is rank 1, dp rank 0's
// second tp rank, with whose attention all-reduces rank 0's own forward meets.
func TestDPTPProcsWorkerKilled(t *testing.T) { checkDPProcsWorkerKilled(t, "", 2, nil) }

// TestGPUDPProcsWorkerKilled is TestDPProcsWorkerKilled on two emulated GPUs (--device
// cuda-emu --dp 2 --dp-attention --dp-procs: rank 1's worker process on GPU 1, the
// experts' rows exchanged over the emulated NCCL across the processes, which sees the
// killed worker's process gone), by both exchanges (the all-to-all's sends and receives
// across the processes too), leaving no message file in /dev/shm.
func TestGPUDPProcsWorkerKilled(t *testing.T) {
	if emutest.Reexec(t, "RESIN_EMU_DEVICES=2") {
		return
	}
	for _, dispatch := range []string{"gather", "all-to-all"} {
		t.Run(dispatch, func(t *testing.T) {
			checkDPProcsWorkerKilled(t, dispatch, 1, &dpGPUProcs{opts: gpurunner.Options{KernelCache: os.Getenv("RESIN_KERNEL_CACHE")}, ordinals: []int{0, 1}, emulate: true})
		})
	}
	// The emulated NCCL's message files to or from the killed worker went with the
	// communicators.
	if left, _ := filepath.Glob("/dev/shm/resin-emu-nccl-*-p2p-*"); len(left) > 0 {
		t.Errorf("point-to-point message files left in /dev/shm: %v", left)
	}
}

// checkDPProcsWorkerKilled is TestDPProcsWorkerKilled's run by exchange dispatch ("":
// the default), with attention TP tp, its ranks on gpu's GPUs where gpu is not nil.
func checkDPProcsWorkerKilled(t *testing.T, dispatch string, tp int, gpu *dpGPUProcs) {
	r0, c, pids, stop := startDPProcs(t, dispatch, tp, gpu)
	defer stop()
	// Health (serve's /health) reports the dead worker before any request steps: it said
	// ok until the next request's step failed.
	h, ok := r0.(interface{ Health() error })
	if !ok || h.Health() != nil {
		t.Fatalf("rank 0's runner %T: no Health, or unhealthy before the kill", r0)
	}
	if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	dptest.Within(t, time.Minute, "Health to report the killed worker", func() {
		for h.Health() == nil {
			time.Sleep(10 * time.Millisecond)
		}
	})
	if err := h.Health(); !strings.Contains(err.Error(), "pid "+strconv.Itoa(pids[0])) {
		t.Fatalf("Health after the kill: %v, want the worker's pid", err)
	}
	// Refused at once (rank 0's engine took the exit as its runner's death:
	// engine.RunnerDeath), or failed by its step where the request reached another rank.
	err := requestErr(t, c, "the request after the worker was killed")
	want := "worker rank 1 (pid " + strconv.Itoa(pids[0]) + ")"
	if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("the request after the worker was killed: %v, want an error naming %q and the signal", err, want)
	}
	stopDeadGroup(t, c, stop)
}

// requestErr submits a 3-token request through c and returns its error: Submit's, the
// stream's or its last event's (nil: it finished), within the test's minute (what names
// the wait).
func requestErr(t *testing.T, c *dp.Coordinator, what string) (err error) {
	t.Helper()
	dptest.Within(t, time.Minute, what, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		var s *engine.Stream
		if s, err = c.Submit(ctx, engine.Request{ID: "a", Prompt: []int32{1, 2, 3}, Sampling: engine.SamplingParams{MaxTokens: 4, IgnoreEOS: true}}); err == nil {
			var ev engine.Event
			if _, ev, err = s.Collect(ctx); err == nil {
				err = ev.Err
			}
		}
	})
	return err
}

// stopDeadGroup closes c and stops the ranks (stop) within the test's minute, and fails t
// if a worker process is left.
func stopDeadGroup(t *testing.T, c *dp.Coordinator, stop func()) {
	t.Helper()
	dptest.Within(t, time.Minute, "closing the dead group and stopping the ranks", func() {
		c.Close()
		stop()
	})
	if left := childWorkers(t); len(left) > 0 {
		t.Fatalf("worker processes %v left after the ranks stopped", left)
	}
}

// startDPProcs opens the tiny glm-5-flash under --dp 2 --dp-attention --dp-procs by
// exchange dispatch, with attention TP tp (on gpu's GPUs where gpu is not nil), and
// starts a coordinator over the two engines. It returns rank 0's runner, the coordinator,
// the workers' pids (worker rank 1's first) and what stops the ranks (once; the test's
// cleanup calls it too).
func startDPProcs(t *testing.T, dispatch string, tp int, gpu *dpGPUProcs) (engine.Runner, *dp.Coordinator, []int, func()) {
	t.Helper()
	r0, pool0, ranks, err := openDPProcs(glm5flash.Name, configDir(t, "../../models/glm-5-flash/config.json"), 32<<20, dispatch, 2, tp, 0, 5*time.Minute, gpu)
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	stop := func() { once.Do(func() { r0.(*tpRunner).StopRanks() }) }
	t.Cleanup(stop)
	pids := childWorkers(t)
	if len(pids) != 2*tp-1 {
		t.Fatalf("worker processes %v, want %d", pids, 2*tp-1)
	}
	slices.SortFunc(pids, func(a, b int) int { return workerRank(a) - workerRank(b) })
	runners := append([]engine.Runner{r0}, ranks.Runners...)
	pools := append([]*kvslab.Pool{pool0}, ranks.Pools...)
	engines := make([]*engine.Engine, len(runners))
	for r := range runners {
		if engines[r], err = engine.New(runners[r], engine.Config{Pool: pools[r]}); err != nil {
			t.Fatal(err)
		}
	}
	c, err := dp.NewCoordinator(ranks.Group, engines)
	if err != nil {
		t.Fatal(err)
	}
	c.Start(context.Background())
	return r0, c, pids, stop
}

// TestGPUDPProcsWorkerHangs: under --device cuda-emu --dp 2 --dp-attention --dp-procs,
// with the emulated NCCL waiting as NCCL does (RESIN_EMU_NCCL_HANG=1), worker rank 1
// hangs in its first collective, an expert exchange mid-step (RESIN_EMU_NCCL_STALL_RANK),
// and is SIGKILLed there: rank 0's forward, waiting in the same exchange, is aborted at
// once (abortOnExit, the watchdog's timeout being ten minutes), the request fails naming
// the worker's rank, pid and signal, and no worker process is left.
func TestGPUDPProcsWorkerHangs(t *testing.T) {
	if emutest.Reexec(t, "RESIN_EMU_DEVICES=2", "RESIN_EMU_NCCL_HANG=1", "RESIN_EMU_NCCL_STALL_RANK=1") {
		return
	}
	mark := filepath.Join(t.TempDir(), "stalled")
	t.Setenv("RESIN_EMU_NCCL_STALL_MARK", mark) // the worker's environment
	gpu := &dpGPUProcs{opts: gpurunner.Options{KernelCache: os.Getenv("RESIN_KERNEL_CACHE"), Watchdog: 10 * time.Minute}, ordinals: []int{0, 1}, emulate: true}
	_, c, pids, stop := startDPProcs(t, "gather", 1, gpu)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s, err := c.Submit(ctx, engine.Request{ID: "a", Prompt: []int32{1, 2, 3}, Sampling: engine.SamplingParams{MaxTokens: 4, IgnoreEOS: true}})
	if err != nil {
		t.Fatal(err)
	}
	awaitStall(t, mark)
	if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_, ev, err := s.Collect(ctx)
	if err == nil {
		err = ev.Err
	}
	want := "worker rank 1 (pid " + strconv.Itoa(pids[0]) + ")"
	if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "killed") || ctx.Err() != nil {
		t.Fatalf("the request whose worker was killed mid-exchange: %v, want an error naming %q and the signal, before the deadline", err, want)
	}
	t.Logf("%v", err)
	stopDeadGroup(t, c, stop)
}

// TestDPTPProcsWorkerStopped: under --dp 2 --dp-attention --tp 2 --dp-procs, worker rank
// 2 (dp rank 1's first TP rank) stopped (SIGSTOP: alive, wedged) fails the next request
// at the expert exchange's deadline (lowered here to 2 s) naming rank 2, and the stop
// then returns, leaving no worker: rank 0's failed step kills the workers. The request
// waited for the stopped worker's reply until --step-timeout, and the stop for good.
func TestDPTPProcsWorkerStopped(t *testing.T) {
	defer func(d, s time.Duration) { tpDataTimeout, stopLimit = d, s }(tpDataTimeout, stopLimit)
	tpDataTimeout, stopLimit = 2*time.Second, 2*time.Second
	_, c, pids, stop := startDPProcs(t, "", 2, nil)
	if err := syscall.Kill(pids[1], syscall.SIGSTOP); err != nil { // worker rank 2
		t.Fatal(err)
	}
	err := requestErr(t, c, "the request with a stopped worker")
	if err == nil || !strings.Contains(err.Error(), "rank 2") || !errors.Is(err, dist.ErrTimeout) {
		t.Errorf("the request with worker rank 2 stopped: %v, want rank 2 named at the exchange's deadline", err)
	}
	stopDeadGroup(t, c, stop)
}
