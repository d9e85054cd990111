package main

import (
	"context"
	"errors"
	"math"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/cli"
	"github.com/resin-llm/resin/core/cudart/emutest"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/core/weights"
	deepseekv4flash "github.com/resin-llm/resin/models/deepseek-v4-flash"
)

// TestGenerateTPOnTheEmulatedDevice: generate --device cuda-emu --tp 2 runs llama's GPU
// runner split over two emulated GPUs, its ranks goroutines of this process
// (gpurunner.NewDenseTP) or, with --tp-procs, rank 1 a worker process of this binary
// (gpurunner.JoinDenseTP, the NCCL id over the shared-memory control communicator, the
// emulated NCCL's ranks meeting across the processes); the greedy tokens of both equal
// --tp 1's.
func TestGenerateTPOnTheEmulatedDevice(t *testing.T) {
	if emutest.Reexec(t, "RESIN_EMU_DEVICES=2") {
		return
	}
	args := []string{"--model", "llama", "--random-weights", filepath.Join("testdata", "tiny-llama", "config.json"),
		"--prompt-ids", "1,2,3", "--max-tokens", "24", "--device", "cuda-emu"}
	one, errOut, err := runGenerate(t, args...)
	if err != nil {
		t.Fatalf("--tp 1: %v\n%s", err, errOut)
	}
	for _, extra := range [][]string{{"--tp", "2"}, {"--tp", "2", "--tp-procs"}} {
		two, errOut, err := runGenerate(t, append(args, extra...)...)
		if err != nil {
			t.Fatalf("%v: %v\n%s", extra, err, errOut)
		}
		if tokensLine(two) == "" || tokensLine(two) != tokensLine(one) {
			t.Errorf("%v %q, --tp 1 %q", extra, tokensLine(two), tokensLine(one))
		}
	}
	if pids := childWorkers(t); len(pids) > 0 {
		t.Errorf("worker processes %v left after --tp-procs", pids)
	}
}

// TestGPUTPWorkerKilled: with --device cuda-emu --tp 2 --tp-procs (and --cp 2
// --cp-procs), rank 1's worker SIGKILLed fails rank 0's next step (in the emulated NCCL's first collective, which sees
// the worker's process gone) with an error naming the worker's rank, pid and signal, long
// before the collectives' deadline; StopRanks then leaves no child process.
func TestGPUTPWorkerKilled(t *testing.T) {
	if emutest.Reexec(t, "RESIN_EMU_DEVICES=2", "RESIN_EMU_NCCL_TIMEOUT=900") {
		return
	}
	dir := t.TempDir()
	cfg, err := os.ReadFile(filepath.Join("testdata", "tiny-llama", "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, kind := range []string{"tp", "cp"} {
		t.Run(kind, func(t *testing.T) { checkGPUWorkerKilled(t, dir, kind) })
	}
}

// checkGPUWorkerKilled is TestGPUTPWorkerKilled for --tp 2 --tp-procs (kind tp) or --cp
// 2 --cp-procs (cp) from the tiny llama's config in dir.
func checkGPUWorkerKilled(t *testing.T, dir, kind string) {
	f := &runtimeFlags{device: cli.DeviceFlags{Device: cli.DeviceCUDAEmu}, cacheBytes: 4 << 20}
	open := f.openTPGPU
	if kind == "tp" {
		f.tp = tpFlags{size: 2, procs: true}
	} else {
		f.tp, f.cp, open = tpFlags{size: 1}, cpFlags{size: 2, procs: true}, f.openCPGPU
	}
	r, pool, err := open("llama", dir)
	if err != nil {
		t.Fatal(err)
	}
	g := r.(*tpGPUWorkers)
	pids := childWorkers(t)
	if len(pids) != 1 {
		g.StopRanks()
		t.Fatalf("worker processes %v, want one", pids)
	}
	if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	plan := firstPlan(t, r, pool)
	start := time.Now()
	_, err = r.Execute(context.Background(), plan)
	took := time.Since(start)
	want := "worker rank 1 (pid " + strconv.Itoa(pids[0]) + ")"
	if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("step after the worker was killed: %v, want an error naming %q and the signal", err, want)
	}
	t.Logf("after %v: %v", took.Round(time.Millisecond), err)
	if err := g.StopRanks(); err == nil {
		t.Error("StopRanks after a worker was killed reported no error")
	}
	if pids := childWorkers(t); len(pids) > 0 {
		t.Errorf("worker processes %v left after StopRanks", pids)
	}
}

// TestGPUWorkerHangs: NCCL waits for good for a peer that died or hangs in a
// collective; RESIN_EMU_NCCL_HANG=1 makes the emulated NCCL wait the same way, and
// RESIN_EMU_NCCL_STALL_RANK=1 hangs worker rank 1 in its first collective, mid-step, of
// llama's --tp 2 --tp-procs (gpurunner.TPRank) and deepseek-v4-flash's GPU layout --ep 2
// --tp-procs (gpurunner.ProcRank). Killed there, rank 0's step, waiting in the same
// collective, fails at once naming the worker's rank, pid and signal (abortOnExit aborts
// rank 0's communicator; the watchdog's timeout is ten minutes). Left hanging, the step
// fails at the watchdog's 2 s (--watchdog-timeout) with the communicator aborted. No
// worker process is left either way.
func TestGPUWorkerHangs(t *testing.T) {
	if emutest.Reexec(t, "RESIN_EMU_DEVICES=2", "RESIN_EMU_NCCL_HANG=1", "RESIN_EMU_NCCL_STALL_RANK=1") {
		return
	}
	const llamaConfig, v4Config = "testdata/tiny-llama/config.json", "../../models/deepseek-v4-flash/config.json"
	t.Run("llama-tp", func(t *testing.T) {
		checkGPUWorkerHangs(t, llamaConfig, func(dir string, dog time.Duration) (engine.Runner, *kvslab.Pool, error) {
			f := &runtimeFlags{device: cli.DeviceFlags{Device: cli.DeviceCUDAEmu, Watchdog: dog}, cacheBytes: 4 << 20, tp: tpFlags{size: 2, procs: true}}
			return f.openTPGPU("llama", dir)
		})
	})
	t.Run("deepseek-v4-flash-ep", func(t *testing.T) {
		checkGPUWorkerHangs(t, v4Config, func(dir string, dog time.Duration) (engine.Runner, *kvslab.Pool, error) {
			f := &runtimeFlags{tp: tpFlags{size: 1, ep: 2, procs: true, dispatch: "gather"}, device: cli.DeviceFlags{Device: cli.DeviceCUDAEmu, Watchdog: dog}, cacheBytes: 4 << 20}
			return f.openLayoutGPU(deepseekv4flash.Name, dir)
		})
	})
	// The ranks goroutines of this process (gpurunner.Group): rank 1 hangs, and the
	// watchdogs of both end the step.
	t.Run("deepseek-v4-flash-ep-in-process", func(t *testing.T) {
		f := &runtimeFlags{tp: tpFlags{size: 1, ep: 2, dispatch: "gather"}, device: cli.DeviceFlags{Device: cli.DeviceCUDAEmu, Watchdog: 2 * time.Second}, cacheBytes: 4 << 20}
		r, pool, err := f.openLayoutGPU(deepseekv4flash.Name, configDir(t, v4Config))
		if err != nil {
			t.Fatal(err)
		}
		stop := r.(interface{ StopRanks() error }).StopRanks
		defer stop()
		err = awaitStep(t, startStep(t, r, pool))
		// Both watchdogs fire at 2 s. If rank 1's fires first, the emulated NCCL fails
		// rank 0's collective at once naming rank 1's abort (real NCCL would leave it to
		// rank 0's own watchdog), and the group's stop gives rank 1's reason.
		if err == nil || !strings.Contains(err.Error(), "ran past the watchdog's 2s") && !strings.Contains(err.Error(), "communicator was aborted (ncclCommAbort)") {
			t.Fatalf("the step whose rank 1 hangs: %v, want the watchdog's abort", err)
		}
		t.Logf("the step: %v", err)
		stopped := stop()
		if stopped == nil || !strings.Contains(stopped.Error(), "rank 1 of 2: step 1 ran past the watchdog's 2s") {
			t.Fatalf("StopRanks after rank 1 hung: %v, want rank 1's watchdog abort", stopped)
		}
		t.Logf("stop: %v", stopped)
	})
}

// configDir is a new directory holding the model config at path as its config.json.
func configDir(t *testing.T, path string) string {
	t.Helper()
	dir := t.TempDir()
	cfg, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// startStep runs the first step of a 3-token prompt on r (its pool pool) on a goroutine
// and returns the step's error's channel.
func startStep(t *testing.T, r engine.Runner, pool *kvslab.Pool) <-chan error {
	t.Helper()
	plan := firstPlan(t, r, pool)
	done := make(chan error, 1)
	go func() {
		_, err := r.Execute(context.Background(), plan)
		done <- err
	}()
	return done
}

// awaitStep is startStep's error, failing the test if the step has not returned within
// five minutes (it waits in a collective).
func awaitStep(t *testing.T, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(5 * time.Minute):
		t.Fatal("rank 0's step still waits in its collective")
		return nil
	}
}

// checkGPUWorkerHangs is TestGPUWorkerHangs for the group open opens from the model
// config at cfgPath with the watchdog's timeout given: one worker process, whose rank 1
// hangs in its first collective.
func checkGPUWorkerHangs(t *testing.T, cfgPath string, open func(dir string, watchdog time.Duration) (engine.Runner, *kvslab.Pool, error)) {
	dir := configDir(t, cfgPath)
	for _, kill := range []bool{true, false} {
		name, timeout := "killed", 10*time.Minute
		if !kill {
			name, timeout = "hung", 2*time.Second
		}
		t.Run(name, func(t *testing.T) {
			mark := filepath.Join(t.TempDir(), "stalled")
			t.Setenv("RESIN_EMU_NCCL_STALL_MARK", mark) // the workers' environment
			r, pool, err := open(dir, timeout)
			if err != nil {
				t.Fatal(err)
			}
			stop := r.(interface{ StopRanks() error })
			pids := childWorkers(t)
			if len(pids) != 1 {
				stop.StopRanks()
				t.Fatalf("worker processes %v, want one", pids)
			}
			done := startStep(t, r, pool)
			if kill {
				awaitStall(t, mark)
				if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
			}
			err = awaitStep(t, done)
			if kill {
				want := "worker rank 1 (pid " + strconv.Itoa(pids[0]) + ") exited: signal: killed"
				if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "aborted") {
					t.Fatalf("the step whose worker was killed mid-collective: %v, want the abort naming %q", err, want)
				}
			} else if err == nil || !strings.Contains(err.Error(), "the NCCL communicator was aborted") {
				t.Fatalf("the step whose worker hangs: %v, want the watchdog's abort", err)
			}
			var p interface{ Permanent() bool }
			if !errors.As(err, &p) || !p.Permanent() {
				t.Errorf("%v is not permanent (the server would run on)", err)
			}
			t.Logf("%v", err)
			stop.StopRanks()
			if pids := childWorkers(t); len(pids) > 0 {
				t.Errorf("worker processes %v left after StopRanks", pids)
			}
		})
	}
}

// awaitStall waits (up to five minutes) for the file the emulated NCCL's stall creates
// (RESIN_EMU_NCCL_STALL_MARK): the stalled rank is then inside its collective.
func awaitStall(t *testing.T, mark string) {
	t.Helper()
	for start := time.Now(); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(mark); err == nil {
			return
		}
		if time.Since(start) > 5*time.Minute {
			t.Fatal("worker rank 1 never reached its stall")
		}
	}
}

// TestGenerateTPGPUCheckpointLogitsOut: from a bf16 checkpoint, generate --device cuda-emu
// --tp 2 (each rank reading only its slices, gpurunner.ReadDense; the tiny llama's 1025
// tokens split 544 + 481 over the vocab-parallel embedding and head, decode graphs on)
// prints --tp 1's tokens, and its --logits-out file holds --tp 1's logits within 1e-5 of
// the largest (on the emulated device they came out bit-identical); with --tp-procs (rank
// 1 reading its slices in its worker process) too.
func TestGenerateTPGPUCheckpointLogitsOut(t *testing.T) {
	if emutest.Reexec(t, "RESIN_EMU_DEVICES=2") {
		return
	}
	dir, c := tinyLlamaCheckpoint(t, 3, weights.BF16)
	out := t.TempDir()
	run := func(tp string, extra ...string) (string, []float32, []int) {
		path := filepath.Join(out, "tp"+tp+strings.Join(extra, ""), "l.safetensors")
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		got, errOut, err := runGenerate(t, append([]string{"--model", "llama", "--weights", dir, "--device", "cuda-emu", "--tp", tp, "--cache-bytes", "4000000",
			"--prompt-ids", "5,9,17,33,2,8", "--max-tokens", "12", "--ignore-eos", "--logits-out", path}, extra...)...)
		if err != nil {
			t.Fatalf("--tp %s: %v\n%s", tp, err, errOut)
		}
		lg, shape := readLogits(t, path)
		return got, lg, shape
	}
	oneOut, one, oneShape := run("1")
	for _, extra := range [][]string{nil, {"--tp-procs"}} {
		twoOut, two, twoShape := run("2", extra...)
		if tokensLine(twoOut) == "" || tokensLine(twoOut) != tokensLine(oneOut) {
			t.Fatalf("--tp 2 %v %q, --tp 1 %q", extra, tokensLine(twoOut), tokensLine(oneOut))
		}
		if !slices.Equal(oneShape, twoShape) || len(oneShape) != 2 || oneShape[1] != c.VocabSize {
			t.Fatalf("--logits-out shapes: --tp 1 %v, --tp 2 %v %v (vocab %d)", oneShape, extra, twoShape, c.VocabSize)
		}
		scale, diff := 0.0, 0.0
		for i, b := range one {
			scale = max(scale, math.Abs(float64(b)))
			diff = max(diff, math.Abs(float64(two[i]-b)))
		}
		if diff > 1e-5*scale {
			t.Fatalf("--logits-out: --tp 2 %v differs from --tp 1 by %.3g of %.3g", extra, diff, scale)
		}
		t.Logf("--tp 2 %v on 2 emulated GPUs from a bf16 checkpoint: tokens equal, %v logits within %.3g of %.3g", extra, twoShape, diff, scale)
	}
}

// TestGenerateTPGPUNodes: generate --device cuda-emu --tp 2 over two "nodes" (this
// process node 0, a child of this binary node 1 with torchrun's environment) meeting over
// TCP at --dist-init-addr, rank 0 handing the NCCL id to rank 1 on that control
// communicator (the emulated NCCL then meets them in this host's shared memory, as real
// NCCL's bootstrap would across hosts), prints --tp 1's tokens; node 1 ends when node 0
// stops it.
func TestGenerateTPGPUNodes(t *testing.T) {
	if emutest.Reexec(t, "RESIN_EMU_DEVICES=1") {
		return
	}
	args := []string{"--model", "llama", "--random-weights", filepath.Join("testdata", "tiny-llama", "config.json"), "--device", "cuda-emu",
		"--prompt-ids", "1,2,3", "--max-tokens", "16", "--ignore-eos"}
	want, errOut, err := runGenerate(t, args...)
	if err != nil {
		t.Fatalf("--tp 1: %v\n%s", err, errOut)
	}
	addr := rendezvousAddr(t)
	host, port, _ := net.SplitHostPort(addr)
	kill, wait := startNode(t, append([]string{"--tp", "2"}, args...), "MASTER_ADDR="+host, "MASTER_PORT="+port, "RANK=1", "WORLD_SIZE=2")
	got, errOut, err := runGenerate(t, append([]string{"--tp", "2", "--nnodes", "2", "--node-rank", "0", "--dist-init-addr", addr, "--dist-timeout", "2m"}, args...)...)
	if err != nil {
		kill()
		t.Fatalf("node 0: %v (%s)", err, errOut)
	}
	wait()
	if tokensLine(got) == "" || tokensLine(got) != tokensLine(want) {
		t.Fatalf("two nodes %q, --tp 1 %q", tokensLine(got), tokensLine(want))
	}
}

// TestGenerateTPGPUOneNodeTwoRanks: with --dist-init-addr a node runs its share of the
// GPU ranks, each on its own GPU (--gpu + its index on the node): --tp 2 on one node, both
// ranks of this process joining over the TCP rendezvous and NCCL, prints --tp 1's tokens.
func TestGenerateTPGPUOneNodeTwoRanks(t *testing.T) {
	if emutest.Reexec(t, "RESIN_EMU_DEVICES=2") {
		return
	}
	args := []string{"--model", "llama", "--random-weights", filepath.Join("testdata", "tiny-llama", "config.json"), "--device", "cuda-emu",
		"--prompt-ids", "1,2,3", "--max-tokens", "12", "--ignore-eos"}
	want, errOut, err := runGenerate(t, args...)
	if err != nil {
		t.Fatalf("--tp 1: %v\n%s", err, errOut)
	}
	got, errOut, err := runGenerate(t, append([]string{"--tp", "2", "--nnodes", "1", "--dist-init-addr", rendezvousAddr(t), "--dist-timeout", "2m"}, args...)...)
	if err != nil {
		t.Fatalf("--tp 2 on one node: %v\n%s", err, errOut)
	}
	if tokensLine(got) == "" || tokensLine(got) != tokensLine(want) {
		t.Fatalf("--tp 2 on one node %q, --tp 1 %q", tokensLine(got), tokensLine(want))
	}
}

// TestGPUTPRefusedOnce: a --tp llama's heads do not divide is refused once, naming the
// sizes, before any rank starts: each rank's runner refused it, the message printed once
// per rank, and with --tp-procs only after the worker processes had started (their exit
// was the error).
func TestGPUTPRefusedOnce(t *testing.T) {
	if emutest.Reexec(t, "RESIN_EMU_DEVICES=3") {
		return
	}
	args := []string{"--model", "llama", "--random-weights", filepath.Join("testdata", "tiny-llama", "config.json"),
		"--prompt-ids", "1,2,3", "--max-tokens", "2", "--device", "cuda-emu", "--tp", "3"}
	const why = "do not all divide by tp=3"
	for _, extra := range [][]string{nil, {"--tp-procs"}} {
		_, errOut, err := runGenerate(t, append(args, extra...)...)
		if err == nil || strings.Count(err.Error(), why) != 1 || strings.Contains(err.Error()+errOut, "rank ") {
			t.Errorf("%v: %v (%s), want %q once, before any rank", extra, err, errOut, why)
		}
	}
	if pids := childWorkers(t); len(pids) > 0 {
		t.Errorf("worker processes %v left", pids)
	}
}

// TestGPUProcsLayoutNamed: --tp-procs or --dist-init-addr on the GPU with a layout the
// model has no GPU ranks for (llama's --ep) is refused naming the model and what runs; the
// MoE models' GPU layouts with the all-to-all dispatch and TP of another size than EP are
// refused naming the dispatch.
func TestGPUProcsLayoutNamed(t *testing.T) {
	llama := []string{"--model", "llama", "--random-weights", filepath.Join("testdata", "tiny-llama", "config.json"), "--prompt-ids", "1,2", "--max-tokens", "2", "--device", "cuda-emu"}
	for _, extra := range [][]string{{"--ep", "2", "--tp-procs"}, {"--tp", "2", "--ep", "2", "--dist-init-addr", "127.0.0.1:1", "--nnodes", "2"}} {
		_, errOut, err := runGenerate(t, append(llama, extra...)...)
		if err == nil || !strings.Contains(err.Error(), "llama has no such GPU layout") {
			t.Errorf("%v: %v (%s), want the refusal naming llama's GPU layouts", extra, err, errOut)
		}
	}
	glm := []string{"--model", "glm-5-flash", "--random-weights", "../../models/glm-5-flash/config.json", "--prompt-ids", "1,2", "--max-tokens", "2", "--device", "cuda-emu"}
	for _, extra := range [][]string{{"--tp", "2", "--ep", "4", "--tp-procs", "--ep-dispatch", "all-to-all"}, {"--tp", "4", "--ep", "2", "--ep-dispatch", "all-to-all"}} {
		_, errOut, err := runGenerate(t, append(glm, extra...)...)
		if err == nil || !strings.Contains(err.Error(), "dispatch by gather") {
			t.Errorf("%v: %v (%s), want the refusal naming the dispatch", extra, err, errOut)
		}
	}
}

// TestGPUWorkerStopped: a worker process that lives but no longer runs (SIGSTOP: a wedged
// process, not a dead one; the emulated NCCL waits for good, RESIN_EMU_NCCL_HANG=1) under
// deepseek-v4-flash's GPU layout --ep 2 --tp-procs: rank 0's steps fail, at the
// watchdog's timeout (2 s) in NCCL or at twice it handing the plan over (stepLimit, which
// kills the workers and names them), and StopRanks returns with no worker left (it had
// waited for good to tell the stopped worker to end).
func TestGPUWorkerStopped(t *testing.T) {
	if emutest.Reexec(t, "RESIN_EMU_DEVICES=2", "RESIN_EMU_NCCL_HANG=1") {
		return
	}
	f := &runtimeFlags{tp: tpFlags{size: 1, ep: 2, procs: true, dispatch: "gather"}, device: cli.DeviceFlags{Device: cli.DeviceCUDAEmu, Watchdog: 2 * time.Second}, cacheBytes: 4 << 20}
	r, pool, err := f.openLayoutGPU(deepseekv4flash.Name, configDir(t, "../../models/deepseek-v4-flash/config.json"))
	if err != nil {
		t.Fatal(err)
	}
	stop := r.(interface{ StopRanks() error })
	defer stop.StopRanks()
	pids := childWorkers(t)
	if len(pids) != 1 {
		t.Fatalf("worker processes %v, want one", pids)
	}
	if err := syscall.Kill(pids[0], syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	// The first step fails at the watchdog (the worker stopped in its collective) or at
	// the limit (stopped before it took the plan); the next one waits to hand its plan
	// over, and fails at the limit naming the worker, which is killed.
	named := false
	for i := range 2 {
		err = awaitStep(t, startStep(t, r, pool))
		if err == nil {
			t.Fatalf("step %d with its worker stopped succeeded", i)
		}
		pid := strconv.Itoa(pids[0])
		named = named || strings.Contains(err.Error(), "pid "+pid) || strings.Contains(err.Error(), "process "+pid)
		t.Logf("step %d: %v", i, err)
	}
	if !named {
		t.Errorf("no step's error named the stopped worker (pid %d)", pids[0])
	}
	if err := stop.StopRanks(); err == nil {
		t.Log("StopRanks: nil")
	}
	if pids := childWorkers(t); len(pids) > 0 {
		t.Errorf("worker processes %v left after StopRanks", pids)
	}
}
