package main

import (
	"context"
	"encoding/json"
	"errors"
	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/dist/dp/dptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/cli"
	"github.com/resin-llm/resin/core/cudart/emutest"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
	deepseekv4flash "github.com/resin-llm/resin/models/deepseek-v4-flash"
)

// childWorkers returns the pids of this process's children that run as --tp-procs
// workers (RESIN_TP_WORKER in their environment).
func childWorkers(t *testing.T) []int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Skip("no /proc:", err)
	}
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		if len(f) < 2 || f[1] != strconv.Itoa(os.Getpid()) {
			continue
		}
		env, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if strings.Contains(string(env), "RESIN_TP_WORKER=") {
			pids = append(pids, pid)
		}
	}
	return pids
}

// workerRank is the rank in worker process pid's RESIN_TP_WORKER spec (-1: none read).
func workerRank(pid int) int {
	env, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "environ"))
	for _, kv := range strings.Split(string(env), "\x00") {
		if raw, ok := strings.CutPrefix(kv, "RESIN_TP_WORKER="); ok {
			var spec tpWorkerSpec
			if json.Unmarshal([]byte(raw), &spec) == nil {
				return spec.Rank
			}
		}
	}
	return -1
}

// TestMoEWorkerKilledNamed: deepseek-v4-flash with --ep 2 --tp-procs whose worker was
// SIGKILLed fails the next step naming the worker's rank, pid and signal, as llama's
// --tp-procs does (the MoE path's step error lacked them).
func TestMoEWorkerKilledNamed(t *testing.T) {
	checkWorkerKilledNamed(t, func(dir string) (engine.Runner, *kvslab.Pool, error) {
		return openMoEParallel(deepseekv4flash.Name, dir, 32<<20, 0, &tpFlags{size: 1, ep: 2, procs: true})
	})
}

// TestCPWorkerKilledNamed: the same for deepseek-v4-flash's --cp 2 --cp-procs, the step
// a prompt's prefill split over the two ranks.
func TestCPWorkerKilledNamed(t *testing.T) {
	checkWorkerKilledNamed(t, func(dir string) (engine.Runner, *kvslab.Pool, error) {
		return openCPModel(deepseekv4flash.Name, dir, 32<<20, 2, true, nil)
	})
}

// checkWorkerKilledNamed opens the tiny deepseek-v4-flash through open (one worker
// process), SIGKILLs the worker and checks that the next step, a 3-token prompt's, fails
// with a permanent error naming its rank, pid and signal.
func checkWorkerKilledNamed(t *testing.T, open func(dir string) (engine.Runner, *kvslab.Pool, error)) {
	dir := t.TempDir()
	cfg, err := os.ReadFile("../../models/deepseek-v4-flash/config.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	r, pool, err := open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer r.(*tpRunner).StopRanks()
	pids := childWorkers(t)
	if len(pids) != 1 {
		t.Fatalf("worker processes %v, want one", pids)
	}
	if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ { // until it is reaped
		if _, err := os.Stat(filepath.Join("/proc", strconv.Itoa(pids[0]))); err != nil {
			break
		}
		if i == 3000 {
			t.Fatal("the killed worker was not reaped")
		}
		time.Sleep(10 * time.Millisecond)
	}
	_, err = r.Execute(context.Background(), firstPlan(t, r, pool))
	want := "worker rank 1 (pid " + strconv.Itoa(pids[0]) + ")"
	if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("step after the worker was killed: %v, want an error naming %q and the signal", err, want)
	}
	// The error is permanent (engine.Engine.Err: the server reports itself unhealthy and stops).
	var p interface{ Permanent() bool }
	if !errors.As(err, &p) || !p.Permanent() {
		t.Fatalf("step after the worker was killed: %v is not permanent (the server would run on)", err)
	}
}

type discard struct{}

func (discard) Token(int32, *engine.TokenLogprob)               {}
func (discard) Finish(engine.FinishReason, error, engine.Usage) {}

// TestGPULayoutWorkerKilledNamed: the same for deepseek-v4-flash's GPU layout --ep 2
// --tp-procs on the emulated device (rank 1 a worker process on its own emulated GPU).
func TestGPULayoutWorkerKilledNamed(t *testing.T) {
	if emutest.Reexec(t, "RESIN_EMU_NCCL_TIMEOUT=900") {
		return
	}
	checkWorkerKilledNamed(t, func(dir string) (engine.Runner, *kvslab.Pool, error) {
		f := &runtimeFlags{tp: tpFlags{size: 1, ep: 2, procs: true, dispatch: "gather"}, device: cli.DeviceFlags{Device: cli.DeviceCUDAEmu}, cacheBytes: 4 << 20}
		return f.openLayoutGPU(deepseekv4flash.Name, dir)
	})
}

// TestStoppedWorkerStops: a llama --tp 2 --tp-procs worker that is alive but not running
// (SIGSTOP: wedged) fails the step at the data group's deadline (lowered here to 2 s),
// and then never takes rank 0's stop, whose wait on the control group has no deadline;
// past stopLimit (2 s here) the workers are killed, StopRanks returns saying so, and no
// worker is left. The stop waited for good.
func TestStoppedWorkerStops(t *testing.T) {
	defer func(d, s time.Duration) { tpDataTimeout, stopLimit = d, s }(tpDataTimeout, stopLimit)
	tpDataTimeout, stopLimit = 2*time.Second, 2*time.Second
	r, pool, err := openTP(configDir(t, "testdata/tiny-llama/config.json"), 4<<20, &tpFlags{size: 2, procs: true})
	if err != nil {
		t.Fatal(err)
	}
	pids := childWorkers(t)
	if len(pids) != 1 {
		r.(*tpRunner).StopRanks()
		t.Fatalf("worker processes %v, want one", pids)
	}
	if err := syscall.Kill(pids[0], syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	plan := firstPlan(t, r, pool)
	dptest.Within(t, time.Minute, "the step with a stopped worker", func() {
		if _, err := r.Execute(context.Background(), plan); err == nil || !errors.Is(err, dist.ErrTimeout) {
			t.Errorf("the step with a stopped worker: %v, want the data group's deadline", err)
		}
	})
	var stopErr error
	dptest.Within(t, time.Minute, "StopRanks with a stopped worker", func() { stopErr = r.(*tpRunner).StopRanks() })
	if stopErr == nil || !strings.Contains(stopErr.Error(), "did not take the stop within 2s and were killed") {
		t.Errorf("StopRanks: %v, want the kill named", stopErr)
	}
	if left := childWorkers(t); len(left) > 0 {
		t.Errorf("worker processes %v left", left)
	}
}

// firstPlan is the engine's first plan for a 3-token prompt (2 tokens to generate) on
// r's info and pool.
func firstPlan(t *testing.T, r engine.Runner, pool *kvslab.Pool) *engine.BatchPlan {
	t.Helper()
	s, err := engine.NewScheduler(r.Info(), engine.Config{Pool: pool})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Add(engine.Request{ID: "a", Prompt: []int32{1, 2, 3}, Sampling: engine.SamplingParams{MaxTokens: 2}}, &discard{}); err != nil {
		t.Fatal(err)
	}
	return s.Schedule()
}
