package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/resin-llm/resin/core/cli"
	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/dist/launch"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/gpurunner"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/core/weights"
	"github.com/resin-llm/resin/models/llama"
)

// openTPGPU opens llama's GPU runner split over --tp ranks (gpurunner.TPRank): rank r on
// GPU --gpu+r where the driver sees that many, else every rank on --gpu (NCCL ≥ 2.30 with
// NCCL_MULTI_RANK_GPU_ENABLE=1). The ranks are goroutines of this process
// (gpurunner.NewDenseTPShards), or with --tp-procs ranks 1..N-1 are worker processes of
// this binary (startGPUWorkers), or with --dist-init-addr a node's share of the ranks,
// each on its GPU (openTPGPUNode). From a checkpoint each rank reads only its slices
// (gpurunner.ReadDense); seeded random weights are built whole, as llama.Load builds
// them, and cut. With --device cuda-emu the emulator shows --tp GPUs unless
// RESIN_EMU_DEVICES says otherwise.
func (f *runtimeFlags) openTPGPU(name, dir string) (engine.Runner, *kvslab.Pool, error) {
	size := f.tp.size
	if f.device.Device == cli.DeviceCUDAEmu && os.Getenv("RESIN_EMU_DEVICES") == "" {
		os.Setenv("RESIN_EMU_DEVICES", strconv.Itoa(size)) // the workers inherit it
	}
	open := func(dir string, cacheBytes int64, opts gpurunner.Options) (engine.Runner, *kvslab.Pool, error) {
		if err := gpurunner.Available(opts.Ordinal); err != nil {
			return nil, nil, fmt.Errorf("%s on the GPU: %w", llama.Name, err)
		}
		shard, done, err := llamaGPUShard(dir, size)
		if err != nil {
			return nil, nil, err
		}
		defer done()
		ordinals, err := gpurunner.RankOrdinals(opts.Ordinal, size)
		if err != nil {
			return nil, nil, err
		}
		opts.CacheBytes = cacheBytes
		if f.tp.initAddr != "" {
			return openTPGPUNode(shard, opts, &f.tp)
		}
		if f.tp.procs {
			g, pool, err := startGPUWorkers(shard, dir, ordinals, opts, f.device.Device == cli.DeviceCUDAEmu, 0)
			if err != nil {
				return nil, nil, fmt.Errorf("--tp %d --tp-procs on GPUs %v: %w", size, ordinals, err)
			}
			return g, pool, nil
		}
		g, pool, err := gpurunner.NewDenseTPShards(shard, ordinals, opts)
		if err != nil {
			return nil, nil, fmt.Errorf("--tp %d on GPUs %v: %w", size, ordinals, err)
		}
		return g, pool, nil
	}
	return f.device.OpenGPU(name, open, dir, f.cacheBytes)
}

// llamaGPUShard returns the ranks' parts of the llama model in dir: cut from the seeded
// random weights, or read from the checkpoint (done closes it, after the last read). A
// size the heads, KV heads or intermediate size do not divide is refused here, once,
// before rank 0 starts any rank: each rank's runner refused it (every message printed once
// per rank), after --tp-procs had started its worker processes.
func llamaGPUShard(dir string, size int) (shard gpurunner.DenseShard, done func(), err error) {
	m, err := openLlamaTP(dir)
	if err != nil {
		return nil, nil, err
	}
	cfg, err := m.c.DenseConfig(m.info.MaxContext, 0)
	if err != nil {
		return nil, nil, err
	}
	if cfg.Heads%size != 0 || cfg.KVHeads%size != 0 || cfg.Intermediate%size != 0 {
		return nil, nil, fmt.Errorf("--tp %d: %d heads, %d kv heads and intermediate %d do not all divide by tp=%d", size, cfg.Heads, cfg.KVHeads, cfg.Intermediate, size)
	}
	if m.w != nil {
		w := &gpurunner.DenseWeights{Embed: m.w.Embed, Norm: m.w.Norm, Head: m.w.Head}
		for _, l := range m.w.Layers {
			w.Layers = append(w.Layers, gpurunner.DenseLayer(l))
		}
		return gpurunner.CutDense(cfg, w), func() {}, nil
	}
	ck, err := weights.Open(m.dir)
	if err != nil {
		return nil, nil, fmt.Errorf("load %s: %w", m.dir, err)
	}
	return gpurunner.ReadDense(cfg, ck), func() { ck.Close() }, nil
}

// gpuWorkerSpec is what a --tp-procs GPU worker needs besides tpWorkerSpec's model and
// group: rank 0's runner options (the cache's bytes come from rank 0 at the rendezvous).
type gpuWorkerSpec struct {
	Ordinal     int
	Emulate     bool // --device cuda-emu
	NUMA        cudart.NUMAMode
	Limits      gpurunner.Limits
	Eager       bool
	KernelCache string
	Watchdog    time.Duration // --watchdog-timeout
}

// tpGPUWorkers is rank 0 of a GPU TP group whose other ranks are worker processes: the
// engine's runner, whose failed steps carry the dead worker's exit, and whose StopRanks
// (core/cli calls it when the engine stops) stops and reaps the workers.
type tpGPUWorkers struct {
	*gpurunner.TPRank
	ctl   dist.Communicator
	w     *launch.Workers
	watch func()     // ends abortOnExit's watch
	limit *stepLimit // a wedged worker's bound
}

// Health is the first worker process that exited, or nil: serve's /health reports it,
// where only the next request's step found it.
func (g *tpGPUWorkers) Health() error { return g.w.Err() }

// Died implements engine.RunnerDeath: closed when a worker process exits.
func (g *tpGPUWorkers) Died() <-chan struct{} { return g.w.Exited() }

// startGPUWorkers starts ranks 1..N-1 as children of this binary (core/dist/launch: each
// dies with this process; each binds to its GPU's NUMA node as gpurunner.Options.NUMA
// says, cudart.BindNUMA, from the GPU's PCI address) and joins them as rank 0 over a
// shared-memory control communicator, on which rank 0 hands out the NCCL id
// (gpurunner.JoinDenseTP). A worker that exits before the group has formed ends the
// wait; on any failure every child is killed and reaped. With cp the group is llama's GPU
// prefill context parallelism (gpurunner.JoinDenseCP: every rank the whole model).
func startGPUWorkers(shard gpurunner.DenseShard, dir string, ordinals []int, opts gpurunner.Options, emulate bool, cp int) (*tpGPUWorkers, *kvslab.Pool, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, nil, err
	}
	size := len(ordinals)
	spec := tpWorkerSpec{Name: fmt.Sprintf("resin%d-gpu", os.Getpid()), Size: size, Dir: dir}
	if cp > 1 {
		spec.CP = cp
		if cp < size {
			spec.TP = size / cp
		}
	}
	join := denseJoiner(spec.CP, spec.TP)
	w, err := launchGPUWorkers(exe, spec, ordinals, opts, emulate)
	if err != nil {
		return nil, nil, err
	}
	ctl, err := dist.JoinShm(spec.Name+"-ctl", 0, size, dist.Options{Timeout: 100 * 365 * 24 * time.Hour, JoinTimeout: 10 * time.Minute, Cancel: w.Exited()})
	if err != nil {
		w.Kill()
		return nil, nil, w.StepError(err)
	}
	opts.Ordinal = ordinals[0]
	g, pool, err := join(shard, ctl, opts)
	if err != nil {
		err = workerError(w, err)
		ctl.Close()
		w.Kill()
		return nil, nil, err
	}
	return &tpGPUWorkers{TPRank: g, ctl: ctl, w: w, watch: abortOnExit(w, g.Abort), limit: newStepLimit(w, opts.Watchdog)}, pool, nil
}

// stepLimit bounds rank 0's steps over worker processes w at twice the watchdog's
// timeout (--watchdog-timeout, gpurunner.DefaultWatchdog unset). The watchdog bounds a
// step's NCCL collectives, but a worker that lives without running (stopped, wedged)
// also stalls rank 0 where no watchdog looks: handing it the next plan over the control
// communicator, which waits for it. Past the limit the workers are killed, which cancels
// that communicator and aborts the NCCL one (abortOnExit), and the step fails naming
// them; the group is then dead, as with a worker that died.
type stepLimit struct {
	w     *launch.Workers
	limit time.Duration
	fired atomic.Bool
}

func newStepLimit(w *launch.Workers, watchdog time.Duration) *stepLimit {
	if watchdog <= 0 {
		watchdog = gpurunner.DefaultWatchdog
	}
	return &stepLimit{w: w, limit: 2 * watchdog}
}

// run runs step under the limit.
func (l *stepLimit) run(step func() error) error {
	err := l.within(l.limit, step)
	if err != nil && l.fired.Load() {
		return fmt.Errorf("the step ran past %v (twice the watchdog's timeout) and the workers were killed: %w", l.limit, err)
	}
	return err
}

// stop runs stop (telling the workers to end, then freeing rank 0) within stopLimit: a
// worker that does not take the message is killed, and stop goes on.
func (l *stepLimit) stop(stop func() error) error { return l.within(stopLimit, stop) }

// stopLimit is how long the workers get to take rank 0's stop (a var for the tests).
var stopLimit = 30 * time.Second

// within runs f, killing the workers if it runs past d.
func (l *stepLimit) within(d time.Duration, f func() error) error {
	t := time.AfterFunc(d, func() {
		l.fired.Store(true)
		l.w.Kill()
	})
	err := f()
	t.Stop()
	return err
}

// abortOnExit calls abort (rank 0's gpurunner.Watchdog.Abort) with the worker's exit as
// soon as a worker of w exits, until the returned func is called. NCCL's collectives have
// no deadline: without it, rank 0's step would wait in a collective for the dead rank
// until the watchdog's timeout (--watchdog-timeout); with it the step fails at once,
// naming the worker's rank, pid and signal. (The emulated NCCL notices a dead peer's
// process by itself; RESIN_EMU_NCCL_HANG=1 makes it wait as NCCL does.)
func abortOnExit(w *launch.Workers, abort func(error)) func() {
	done := make(chan struct{})
	go func() {
		select {
		case <-w.Exited():
			abort(w.Err())
		case <-done:
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { close(done) }) }
}

// launchGPUWorkers starts ranks 1..len(ordinals)-1 of spec as children exe (this binary),
// rank r on GPU ordinals[r] with opts' limits, NUMA mode and kernel cache, bound to its
// GPU's NUMA node where the topology is known.
func launchGPUWorkers(exe string, spec tpWorkerSpec, ordinals []int, opts gpurunner.Options, emulate bool) (*launch.Workers, error) {
	binds := liveGPUBindings(ordinals, opts.NUMA)
	var specs []launch.Spec
	for rank := 1; rank < len(ordinals); rank++ {
		s := spec
		s.Rank = rank
		s.GPU = &gpuWorkerSpec{Ordinal: ordinals[rank], Emulate: emulate, NUMA: opts.NUMA, Limits: opts.Limits, Eager: opts.Eager, KernelCache: opts.KernelCache, Watchdog: opts.Watchdog}
		b, _ := json.Marshal(s)
		ls := launch.Spec{Rank: rank, Path: exe, Env: []string{"RESIN_TP_WORKER=" + string(b)}, Stdout: io.Discard, Stderr: os.Stderr}
		if binds != nil && binds[rank].Node >= 0 {
			ls.Binding = &binds[rank]
		}
		specs = append(specs, ls)
	}
	return launch.Start(specs)
}

// liveGPUBindings is gpuBindings on this host's topology and GPUs; nil when either cannot
// be read (the workers then bind when their runner opens, gpurunner.Options.NUMA).
func liveGPUBindings(ordinals []int, mode cudart.NUMAMode) []launch.Binding {
	top, err := cudart.ReadTopology("")
	if err != nil {
		return nil
	}
	devs, err := cudart.Devices()
	if err != nil {
		return nil
	}
	busIDs := make([]string, len(ordinals))
	for r, o := range ordinals {
		if o >= 0 && o < len(devs) {
			busIDs[r] = devs[o].PCIBusID
		}
	}
	allowed, _ := cudart.ProcessAffinity()
	return gpuBindings(top, busIDs, mode, allowed)
}

// gpuBindings plans where each GPU rank's worker process starts: the NUMA node that mode
// picks for its GPU (busIDs[r], the GPU's PCI address; cudart.PlanNUMA: the GPU's own
// node under auto), with that node's CPUs the process may use, so that the worker's
// weights are read into its GPU's node's memory before its runner opens (which binds it
// again, the same way). Node −1: not bound, the reason said.
func gpuBindings(top *cudart.Topology, busIDs []string, mode cudart.NUMAMode, allowed []int) []launch.Binding {
	out := make([]launch.Binding, len(busIDs))
	for r, bus := range busIDs {
		d, err := cudart.PlanNUMA(top, mode, bus, allowed)
		out[r] = launch.Binding{LocalRank: r, BusID: bus, Node: d.Node, CPUs: d.CPUs, Reason: d.Reason}
		if err != nil {
			out[r].Node, out[r].CPUs, out[r].Reason = -1, nil, err.Error()
		}
	}
	return out
}

// workerError is err with the exit of the worker behind it (launch.Workers.StepError).
// The emulated NCCL sees a peer's process gone before this process has reaped it, and
// its error is no dist.ErrPeerGone, so the exit is waited for here, up to a second.
func workerError(w *launch.Workers, err error) error {
	if w.Err() == nil {
		select {
		case <-w.Exited():
		case <-time.After(time.Second):
		}
	}
	return w.StepError(err)
}

// Execute is rank 0's step, with a dead worker's exit (rank, pid, signal) on its error,
// bounded by stepLimit.
func (g *tpGPUWorkers) Execute(ctx context.Context, plan *engine.BatchPlan) (engine.StepResult, error) {
	var res engine.StepResult
	err := g.limit.run(func() error {
		var err error
		if res, err = g.TPRank.Execute(ctx, plan); err != nil {
			return workerError(g.w, err)
		}
		return nil
	})
	return res, err
}

// StopRanks stops the workers, waits for them (killing any still running after a
// while), then frees rank 0's runner.
func (g *tpGPUWorkers) StopRanks() error {
	g.watch()
	err := g.limit.stop(g.TPRank.Stop)
	err = errors.Join(err, g.w.Stop(30*time.Second))
	g.ctl.Close()
	return errors.Join(err, g.TPRank.Close())
}

// openTPGPUNode joins the multi-node group at --dist-init-addr over TCP with this node's
// ranks (tpFlags.nodeRanks: the first here, the others on goroutines), local rank i on
// GPU --gpu+i (+ torchrun's LOCAL_RANK): the control communicator waits as long as the
// engine idles, and rank 0 hands the NCCL id to the others on it (gpurunner.JoinDenseTP;
// NCCL's own bootstrap then connects the ranks). Node 0 returns the engine's runner; the
// others follow rank 0's plans until it stops and then end the command (errWorkerDone).
func openTPGPUNode(shard gpurunner.DenseShard, opts gpurunner.Options, f *tpFlags) (engine.Runner, *kvslab.Pool, error) {
	return openDenseGPUNode(shard, opts, f, gpurunner.JoinDenseTP, "tp")
}

// openDenseGPUNode is openTPGPUNode for the group kind ("tp", or "cp": llama's GPU
// prefill CP, joinRank gpurunner.JoinDenseCP) over f.ranks() ranks.
func openDenseGPUNode(shard gpurunner.DenseShard, opts gpurunner.Options, f *tpFlags,
	joinRank func(gpurunner.DenseShard, dist.Communicator, gpurunner.Options) (*gpurunner.TPRank, *kvslab.Pool, error), kind string) (engine.Runner, *kvslab.Pool, error) {
	first, n := f.nodeRanks()
	join := func(rank int) (*gpurunner.TPRank, *kvslab.Pool, dist.Communicator, error) {
		ctl, err := dist.JoinTCP(f.initAddr, rank, f.ranks(), dist.Options{Timeout: 100 * 365 * 24 * time.Hour, JoinTimeout: f.joinTimeout(), Group: kind + "-gpu-ctl"})
		if err != nil {
			return nil, nil, nil, err
		}
		o := opts
		if c, err := cudart.DeviceCount(); err == nil && opts.Ordinal+f.localRank+n <= c {
			o.Ordinal += f.localRank + rank - first
		} // else every rank of this node on --gpu (NCCL_MULTI_RANK_GPU_ENABLE=1), as in-process ranks are
		g, pool, err := joinRank(shard, ctl, o)
		if err != nil {
			ctl.Close()
			return nil, nil, nil, fmt.Errorf("on GPU %d: %w", o.Ordinal, err)
		}
		return g, pool, ctl, nil
	}
	follow := func(rank int) error {
		g, _, ctl, err := join(rank)
		if err != nil {
			return err
		}
		defer ctl.Close()
		return errors.Join(g.Follow(), g.Close())
	}
	wait := withLocalRanks(first, n, follow)
	if first != 0 {
		if err := follow(first); err != nil {
			return nil, nil, fmt.Errorf("%s worker: rank %d: %w", kind, first, err)
		}
		if err := wait(); err != nil {
			return nil, nil, fmt.Errorf("%s worker: %w", kind, err)
		}
		return nil, nil, errWorkerDone
	}
	g, pool, ctl, err := join(0)
	if err != nil {
		return nil, nil, err
	}
	return &tpGPUNode{TPRank: g, ctl: ctl, wait: wait}, pool, nil
}

// tpGPUNode is node 0 of a multi-node GPU TP group: the engine's runner, whose StopRanks
// ends the other nodes' ranks.
type tpGPUNode struct {
	*gpurunner.TPRank
	ctl  dist.Communicator
	wait func() error // this node's other ranks (withLocalRanks)
}

// StopRanks stops the other nodes' ranks, then frees this node's runner.
func (g *tpGPUNode) StopRanks() error {
	err := g.TPRank.Stop()
	g.ctl.Close()
	return errors.Join(err, g.wait(), g.TPRank.Close())
}

// denseJoiner is how a rank of llama's GPU group joins it: TP's (cp ≤ 1), prefill CP's
// (tp ≤ 1: every rank the whole model) or CP × TP's, cp groups of tp ranks.
func denseJoiner(cp, tp int) func(gpurunner.DenseShard, dist.Communicator, gpurunner.Options) (*gpurunner.TPRank, *kvslab.Pool, error) {
	switch {
	case cp > 1 && tp > 1:
		return func(shard gpurunner.DenseShard, ctl dist.Communicator, opts gpurunner.Options) (*gpurunner.TPRank, *kvslab.Pool, error) {
			return gpurunner.JoinDenseCPTP(shard, ctl, cp, opts)
		}
	case cp > 1:
		return gpurunner.JoinDenseCP
	}
	return gpurunner.JoinDenseTP
}

// runGPUTPWorker is a --tp-procs worker of llama's GPU TP (or, spec.CP set, a --cp-procs
// worker of its GPU prefill CP): it opens its rank's part of the model (under CP the
// whole model) on its GPU, joins rank 0 (the NCCL id comes over the control
// communicator) and follows rank 0's plans until it stops.
func runGPUTPWorker(spec tpWorkerSpec) error {
	gs := spec.GPU
	if gs.Emulate {
		if err := cudart.Emulate(); err != nil {
			return fmt.Errorf("rank %d: --device cuda-emu: %w", spec.Rank, err)
		}
	}
	parts := spec.Size // TP's
	switch {
	case spec.CP > 1 && spec.TP > 1:
		parts = spec.TP
	case spec.CP > 1:
		parts = 1
	}
	join := denseJoiner(spec.CP, spec.TP)
	shard, done, err := llamaGPUShard(spec.Dir, parts)
	if err != nil {
		return fmt.Errorf("rank %d: %w", spec.Rank, err)
	}
	defer done()
	ctl, err := dist.JoinShm(spec.Name+"-ctl", spec.Rank, spec.Size, dist.Options{Timeout: 100 * 365 * 24 * time.Hour, JoinTimeout: 10 * time.Minute})
	if err != nil {
		return err
	}
	defer ctl.Close()
	opts := gpurunner.Options{Ordinal: gs.Ordinal, NUMA: gs.NUMA, Limits: gs.Limits, Eager: gs.Eager, KernelCache: gs.KernelCache, Watchdog: gs.Watchdog, Log: os.Stderr}
	g, _, err := join(shard, ctl, opts)
	if err != nil {
		return err
	}
	return errors.Join(g.Follow(), g.Close())
}
