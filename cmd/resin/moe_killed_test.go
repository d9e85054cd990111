package main

import (
	"context"
	"encoding/json"
	"errors"
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
	s, err := engine.NewScheduler(r.Info(), engine.Config{Pool: pool})
	if err != nil {
		t.Fatal(err)
	}
	o := &discard{}
	if err := s.Add(engine.Request{ID: "a", Prompt: []int32{1, 2, 3}, Sampling: engine.SamplingParams{MaxTokens: 2}}, o); err != nil {
		t.Fatal(err)
	}
	_, err = r.Execute(context.Background(), s.Schedule())
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
