package main

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/resin-llm/resin/core/cli"
	"github.com/resin-llm/resin/core/cpurunner"
	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/dist/dp"
	"github.com/resin-llm/resin/core/dist/launch"
	"github.com/resin-llm/resin/core/dist/lockstep"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/gpurunner"
	"github.com/resin-llm/resin/core/kvslab"
	deepseekv4flash "github.com/resin-llm/resin/models/deepseek-v4-flash"
	glm5flash "github.com/resin-llm/resin/models/glm-5-flash"
)

// --dp N --dp-attention --dp-procs: one process per dp rank on this host. The
// coordinator, the dp.Group and every rank's engine stay in this process (rank 0); dp
// rank r ≥ 1's forward (its attention on its rows, its range of the routed experts) and
// its cache run in worker process r, which gets each of its rank's plans (idle ones too)
// from rank r's stepper here (dp.RemoteForward) and returns the logits rows. The expert
// exchanges meet across the processes in shared memory (dp.JoinShm's data group). Rank
// r's engine here allocates pages from a ledger pool of the worker's geometry
// (dp.LedgerPool); the worker executes each plan's CacheOps on its own pool.

// dpRank is one dp rank of a MoE model opened in this process: its forward over its own
// cache, its draft step (nil: it does not draft), the engine's info, its plans' cache
// groups and its pool.
type dpRank struct {
	forward     dp.Forward
	check       func(*engine.BatchPlan, []float32) error // the model's CheckPlan (the CPU's; nil on the GPU)
	draft       dp.Draft
	info        engine.RunnerInfo
	cacheGroups int
	pool        *kvslab.Pool
	close       func() error // a GPU rank's runner, device and NCCL end (nil on the CPU)
	closeComms  func()       // a CPU rank's: closes its communicators, its layout's groups too (nil on the GPU)
	abort       func(error)  // a GPU rank's: aborts its NCCL communicator (nil on the CPU)
	// buckets are a GPU rank's decode graph buckets (nil: eager steps), which the
	// dp.Group pads all-decode steps to (every rank opened alike replays the same).
	buckets []int
}

// openGPUDPRank opens dp rank data.Rank() of MoE model name from dir on GPU
// opts.Ordinal, in this process, for --dp-procs on the GPU: the models' JoinGPUDPRank,
// its NCCL communicator joined with the other processes' ranks over hello.
func openGPUDPRank(name, dir string, cacheBytes int64, opts gpurunner.Options, d, drafts int, hello, data dist.Communicator) (dpRank, error) {
	switch name {
	case deepseekv4flash.Name:
		g, err := deepseekv4flash.JoinGPUDPRank(dir, cacheBytes, opts, deepseekv4flash.Dispatch(d), drafts, hello, data)
		if err != nil {
			return dpRank{}, err
		}
		return dpRank{forward: g.DPForward, draft: g.DPDraft(), info: g.Info(), cacheGroups: len(g.Info().CacheGroups), pool: g.Pool, close: g.Close, abort: g.Abort, buckets: g.GraphBuckets()}, nil
	case glm5flash.Name:
		g, err := glm5flash.JoinGPUDPRank(dir, cacheBytes, opts, glm5flash.Dispatch(d), drafts, hello, data)
		if err != nil {
			return dpRank{}, err
		}
		return dpRank{forward: g.DPForward, draft: g.DPDraft(), info: g.Info(), cacheGroups: len(g.Info().CacheGroups), pool: g.Pool, close: g.Close, abort: g.Abort, buckets: g.GraphBuckets()}, nil
	}
	return dpRank{}, fmt.Errorf("--dp-procs on the GPU: model %s has no GPU DP-attention ranks (deepseek-v4-flash, glm-5-flash)", name)
}

// dpGPUProcs is how --dp-procs places its ranks on GPUs: rank r on ordinals[r] with
// rank 0's runner options (the workers get them in their spec), emulated or not.
type dpGPUProcs struct {
	opts     gpurunner.Options
	ordinals []int
	emulate  bool
}

// openDPRank opens dp rank comm.Rank() of comm.Size() of MoE model name from dir, its
// expert exchange d, with a pool of cacheBytes, drafting drafts tokens a step with the
// model's MTP head (0: none). With tp above 1 comm's ranks are dp ranks of tp ranks each
// (attention TP), comm.Rank() tp rank comm.Rank()%tp of dp rank comm.Rank()/tp.
func openDPRank(name, dir string, cacheBytes int64, d, drafts, tp int, comm dist.Communicator) (dpRank, error) {
	switch name {
	case deepseekv4flash.Name:
		run, pool, err := deepseekv4flash.OpenDPTPRank(dir, deepseekv4flash.Options{Drafts: drafts}, deepseekv4flash.Dispatch(d), tp, comm, cacheBytes)
		if err != nil {
			return dpRank{}, err
		}
		r := dpRank{forward: run.DPForward, check: run.CheckPlan, closeComms: run.CloseComms, info: run.Info(), cacheGroups: len(run.CacheGroups()), pool: pool}
		if drafts > 0 {
			r.draft = run.DPDraft
		}
		return r, nil
	case glm5flash.Name:
		run, pool, err := glm5flash.OpenDPTPRank(dir, glm5flash.RankOptions{CacheBytes: cacheBytes, Drafts: drafts}, glm5flash.Dispatch(d), tp, comm)
		if err != nil {
			return dpRank{}, err
		}
		r := dpRank{forward: run.DPForward, check: run.CheckPlan, closeComms: run.CloseComms, info: run.Info(), cacheGroups: len(run.CacheGroups()), pool: pool}
		if drafts > 0 {
			r.draft = run.DPDraft
		}
		return r, nil
	}
	return dpRank{}, fmt.Errorf("--dp-procs: model %s has no DP-attention ranks (deepseek-v4-flash, glm-5-flash)", name)
}

// dpJoinOptions are the data group's (each expert exchange waits up to a minute), rank
// 0's bound on a worker's answer to one step (--step-timeout; a worker's own wait for its
// next plan has none) and, for the rendezvous, how long the processes wait for each
// other to start.
func dpJoinOptions(cancel <-chan struct{}, step time.Duration) dist.Options {
	return dist.Options{Timeout: tpDataTimeout, StepTimeout: step, JoinTimeout: 10 * time.Minute, Cancel: cancel}
}

// openDPProcs opens --dp n --dp-attention --dp-procs for MoE model name from dir: it
// starts dp ranks 1..n-1 as worker processes, opens rank 0 here, and returns rank 0's
// runner (whose StopRanks stops and reaps the workers) and pool, and the other ranks'
// runners and ledger pools under one dp.Group. A dead worker's rank, pid and signal go
// on the error of every step it failed. With gpu, each rank is a GPU runner on its GPU
// (openGPUDPRank), the workers started bound to their GPUs' NUMA nodes. With tp above 1
// (attention TP, the CPU's) there are n·tp processes, process w tp rank w%tp of dp rank
// w/tp (this one dp rank 0's first), each plan of a dp rank sent to its tp processes at
// once (dp.RemoteTPRanks).
func openDPProcs(name, dir string, cacheBytes int64, dispatch string, n, tp, drafts int, stepTimeout time.Duration, gpu *dpGPUProcs) (engine.Runner, *kvslab.Pool, *cli.DPRanks, error) {
	tp = max(tp, 1)
	what := fmt.Sprintf("--dp %d --dp-attention --dp-procs", n)
	if tp > 1 {
		what = fmt.Sprintf("--dp %d --dp-attention --tp %d --dp-procs", n, tp)
	}
	d, err := dispatchOf(dispatch)
	if err != nil {
		return nil, nil, nil, err
	}
	// Refused here once, before any worker starts (each would refuse it again).
	if err := checkMoELayout(name, dir, tp, n*tp, d); err != nil {
		return nil, nil, nil, fmt.Errorf("%s: %w", what, err)
	}
	if tp > 1 && drafts > 0 {
		return nil, nil, nil, fmt.Errorf("%s --num-speculative-tokens %d: DP-attention with attention TP does not draft yet", what, drafts)
	}
	spec := tpWorkerSpec{Name: fmt.Sprintf("resin%d-dp", os.Getpid()), Size: n * tp, TP: tp, Dir: dir, Model: name, Dispatch: d, CacheBytes: cacheBytes, DPAttention: true, Drafts: drafts}
	var w *launch.Workers
	if gpu != nil {
		exe, xerr := os.Executable()
		if xerr != nil {
			return nil, nil, nil, xerr
		}
		w, err = launchGPUWorkers(exe, spec, gpu.ordinals, gpu.opts, gpu.emulate)
	} else {
		w, err = launchWorkers(spec)
	}
	if err != nil {
		return nil, nil, nil, fmt.Errorf("%s: %w", what, err)
	}
	ctl, data, hello, err := dp.JoinShm(spec.Name, 0, n*tp, dpJoinOptions(w.Exited(), stepTimeout))
	if err != nil {
		err = workerError(w, err)
		w.Kill()
		return nil, nil, nil, fmt.Errorf("%s: %w", what, err)
	}
	return leadDP(what, name, dir, cacheBytes, d, drafts, tp, ctl, data, hello, gpu, w, nil)
}

// leadDP is dp rank 0 of a group whose other ranks are processes (workers w, or ranks on
// other nodes, w nil; wait, when not nil, returns once this node's other ranks have
// ended): it opens rank 0 on data (on gpu's first GPU where gpu is set), waits for every
// rank to have loaded, and returns rank 0's runner (whose StopRanks stops the others
// through ctl, reaps w and waits) and pool, and the other ranks' runners and ledger
// pools under one dp.Group. With tp above 1 ctl's processes are dp ranks of tp each
// (attention TP: dp.RemoteTPRanks).
func leadDP(what, name, dir string, cacheBytes int64, d, drafts, tp int, ctl []dist.Communicator, data, hello dist.Communicator, gpu *dpGPUProcs, w *launch.Workers, wait func() error) (engine.Runner, *kvslab.Pool, *cli.DPRanks, error) {
	tp = max(tp, 1)
	n := len(ctl) / tp
	var r0 dpRank
	var err error
	watch := func() {} // abortOnExit's, once rank 0 has opened on a GPU
	fail := func(err error) (engine.Runner, *kvslab.Pool, *cli.DPRanks, error) {
		watch()
		err = workerError(w, err) // before the kill, which stops recording exits
		w.Kill()
		for _, c := range ctl[1:] {
			c.Close()
		}
		if r0.close != nil {
			r0.close()
		}
		data.Close()
		if hello != nil {
			hello.Close()
		}
		if wait != nil {
			err = errors.Join(err, wait())
		}
		return nil, nil, nil, fmt.Errorf("%s: %w", what, err)
	}
	if gpu != nil {
		opts := gpu.opts
		opts.Ordinal = gpu.ordinals[0]
		r0, err = openGPUDPRank(name, dir, cacheBytes, opts, d, drafts, hello, data)
	} else {
		r0, err = openDPRank(name, dir, cacheBytes, d, drafts, tp, data)
	}
	if err == nil {
		// Every rank has read dir (which the caller may remove once this returns).
		err = hello.Barrier()
	}
	if err != nil {
		return fail(err)
	}
	hello.Close() // every rank has opened
	hello = nil
	if r0.abort != nil && w != nil {
		watch = abortOnExit(w, r0.abort)
	}
	// Rank 0's failed step kills the workers as well as closing its communicators: a
	// worker stopped mid-step (it failed rank 0's exchange at the deadline) would hold
	// the other dp ranks' replies until --step-timeout, and the stop after it.
	failed := r0
	failed.closeComms = func() {
		if r0.closeComms != nil {
			r0.closeComms()
		}
		w.Kill()
	}
	ranks, err := dp.RemoteTPRanks(closeOnFailure(failed, data), r0.check, ctl, tp, r0.cacheGroups, dist.Options{Timeout: time.Minute})
	if err != nil {
		return fail(err)
	}
	if drafts > 0 { // every rank drafts: rank 0 here, the others in their workers
		for r := range ranks {
			ranks[r].Draft, ranks[r].MaxDrafts = r0.draft, drafts
			if r > 0 {
				ranks[r].Draft = dp.RemoteDraft(ctl[r], r)
			}
		}
	}
	group, err := dp.NewGroup(ranks, dp.Options{GraphBuckets: r0.buckets})
	if err != nil {
		return fail(err)
	}
	runners := make([]engine.Runner, n)
	pools := make([]*kvslab.Pool, n)
	pools[0] = r0.pool
	for r := range n {
		if r > 0 {
			if pools[r], err = dp.LedgerPool(r0.pool); err != nil {
				return fail(err)
			}
		}
		runners[r] = cpurunner.New(r0.info, workerErrors{group.Runner(r), w})
	}
	stop := func() error {
		// The steppers end first (core/cli's Stop has closed the group already; on a
		// failed start none ran), so that no step uses a pair while it is stopped. A
		// worker alive but not running (stopped, wedged) never answers: past stopLimit
		// the workers are killed, which ends those waits.
		watch()
		t := time.AfterFunc(stopLimit, w.Kill)
		err := errors.Join(group.Close(), dp.StopRemote(ctl))
		t.Stop()
		err = errors.Join(err, w.Stop(30*time.Second))
		if wait != nil {
			err = errors.Join(err, wait())
		}
		if r0.close != nil {
			err = errors.Join(err, r0.close())
		}
		data.Close()
		return err
	}
	runners[0] = &tpRunner{runners[0].(*cpurunner.Runner), stop, w}
	return runners[0], pools[0], &cli.DPRanks{Runners: runners[1:], Pools: pools[1:], Group: group}, nil
}

// openDPNodes opens --dp n --dp-attention across nodes (--dist-init-addr with --nnodes
// and --node-rank, or the launchers' environment) for MoE model name: node k holds dp
// ranks k·n/nnodes ... (k+1)·n/nnodes−1 (tpFlags.nodeRanks), each a rank of its own on
// the TCP rendezvous (dp.JoinTCP: rank 0's control pair with each rank, and the data
// group the MoE exchanges run on), on GPU --gpu+i (+ LOCAL_RANK) of its node with
// --device cuda|cuda-emu, else on the CPU. Node 0 runs every engine and the coordinator
// (leadDP); its other ranks and the other nodes' serve their plans on goroutines
// (serveDPRank) until rank 0 stops them, and the other nodes then end the command
// (errWorkerDone).
func (f *runtimeFlags) openDPNodes(name, dir string) (engine.Runner, *kvslab.Pool, *cli.DPRanks, error) {
	t, n, tp := &f.tp, f.dp.size, max(f.tp.size, 1)
	what := fmt.Sprintf("--dp %d --dp-attention over %d nodes", n, t.nnodes)
	if tp > 1 {
		what = fmt.Sprintf("--dp %d --dp-attention --tp %d over %d nodes", n, tp, t.nnodes)
	}
	d, err := dispatchOf(t.dispatch)
	if err != nil {
		return nil, nil, nil, err
	}
	if err := checkMoELayout(name, dir, tp, n*tp, d); err != nil {
		return nil, nil, nil, fmt.Errorf("%s: %w", what, err)
	}
	if tp > 1 && f.specTokens > 0 {
		return nil, nil, nil, fmt.Errorf("%s --num-speculative-tokens %d: DP-attention with attention TP does not draft yet", what, f.specTokens)
	}
	first, local := t.nodeRanks() // of the n·tp world ranks (dpFlags.check)
	o := dpJoinOptions(nil, f.dp.stepTimeout)
	o.JoinTimeout = t.joinTimeout()
	open := func(cacheBytes int64, gpu *dpGPUProcs) (engine.Runner, *kvslab.Pool, *cli.DPRanks, error) {
		cancel := make(chan struct{}) // closed when rank 0 could not join: this node's other ranks stop trying
		lo := o
		lo.Cancel = cancel
		serve := func(rank int) error {
			ctl, data, hello, err := dp.JoinTCP(t.initAddr, rank, n*tp, lo)
			if err != nil {
				return err
			}
			spec := tpWorkerSpec{Rank: rank, Size: n * tp, TP: tp, Dir: dir, Model: name, Dispatch: d, CacheBytes: cacheBytes, DPAttention: true, Drafts: f.specTokens}
			var opts *gpurunner.Options
			if gpu != nil {
				o := gpu.opts
				o.Ordinal = gpu.ordinals[rank-first]
				opts = &o
			}
			return serveDPRank(spec, ctl[0], data, hello, opts)
		}
		wait := withLocalRanks(first, local, serve)
		if first != 0 {
			if err := serve(first); err != nil {
				return nil, nil, nil, fmt.Errorf("dp worker: rank %d: %w", first, errors.Join(err, wait()))
			}
			if err := wait(); err != nil {
				return nil, nil, nil, fmt.Errorf("dp worker: %w", err)
			}
			return nil, nil, nil, errWorkerDone
		}
		ctl, data, hello, err := dp.JoinTCP(t.initAddr, 0, n*tp, o)
		if err != nil {
			// Not waiting for this node's other ranks, as the TP nodes do not: where rank 0
			// could not listen (the port in use) they may have reached another listener
			// there and wait on its reply, which the cancel does not end, until
			// --dist-timeout. The cancel stops those still dialing; all end with the process.
			close(cancel)
			return nil, nil, nil, fmt.Errorf("%s: %w", what, err)
		}
		return leadDP(what, name, dir, cacheBytes, d, f.specTokens, tp, ctl, data, hello, gpu, nil, wait)
	}
	if !f.device.CUDA() {
		return open(f.cacheBytes, nil)
	}
	return f.openGPUDP(name, dir, what, local, func(cacheBytes int64, opts gpurunner.Options) (engine.Runner, *kvslab.Pool, *cli.DPRanks, error) {
		// This node's ranks on GPUs --gpu+LOCAL_RANK+i where the driver sees that many,
		// else all on --gpu (NCCL_MULTI_RANK_GPU_ENABLE=1), as the TP nodes' are.
		ordinals, err := gpurunner.RankOrdinals(opts.Ordinal+t.localRank, local)
		if err != nil {
			return nil, nil, nil, err
		}
		return open(cacheBytes, &dpGPUProcs{opts: opts, ordinals: ordinals})
	})
}

// workerErrors is a dp rank's runner whose step errors carry the exit of the worker
// process that died (launch.Workers.StepError), its drafts (when the rank drafts) too.
type workerErrors struct {
	dp.RankRunner
	w *launch.Workers
}

func (r workerErrors) Forward(p *engine.BatchPlan, logits []float32) error {
	return r.w.StepError(r.RankRunner.Forward(p, logits))
}

func (r workerErrors) Draft(p *engine.BatchPlan, res *engine.StepResult) error {
	return r.w.StepError(r.RankRunner.Draft(p, res))
}

// runDPWorker is a --dp-procs worker: dp rank spec.Rank's forward, over its own cache, on
// every plan rank 0's stepper for it sends, until rank 0 stops it.
func runDPWorker(spec tpWorkerSpec) error {
	ctl, data, hello, err := dp.JoinShm(spec.Name, spec.Rank, spec.Size, dpJoinOptions(nil, 0))
	if err != nil {
		return err
	}
	var opts *gpurunner.Options
	if gs := spec.GPU; gs != nil {
		if gs.Emulate {
			if err := cudart.Emulate(); err != nil {
				ctl[0].Close()
				data.Close()
				hello.Close()
				return fmt.Errorf("dp rank %d: --device cuda-emu: %w", spec.Rank, err)
			}
		}
		opts = &gpurunner.Options{Ordinal: gs.Ordinal, NUMA: gs.NUMA, Limits: gs.Limits, Eager: gs.Eager, KernelCache: gs.KernelCache, Watchdog: gs.Watchdog, Log: os.Stderr}
	}
	return serveDPRank(spec, ctl[0], data, hello, opts)
}

// serveDPRank opens dp rank spec.Rank of MoE model spec.Model on data (on the GPU opts
// names, when not nil, meeting the others on hello while it opens) and runs every plan
// rank 0's stepper sends on ctl, over its own cache, until rank 0 stops it; it closes
// ctl, data, hello and the rank.
func serveDPRank(spec tpWorkerSpec, ctl, data, hello dist.Communicator, opts *gpurunner.Options) error {
	defer ctl.Close()
	defer data.Close()
	defer hello.Close()
	var r dpRank
	var err error
	if opts != nil {
		r, err = openGPUDPRank(spec.Model, spec.Dir, spec.CacheBytes, *opts, spec.Dispatch, spec.Drafts, hello, data)
	} else {
		r, err = openDPRank(spec.Model, spec.Dir, spec.CacheBytes, spec.Dispatch, spec.Drafts, spec.TP, data)
	}
	if err != nil {
		return fmt.Errorf("dp rank %d: %w", spec.Rank, err)
	}
	if r.close != nil {
		defer r.close()
	}
	if err := hello.Barrier(); err != nil { // rank 0 waits for every rank to have loaded
		return fmt.Errorf("dp rank %d: %w", spec.Rank, err)
	}
	return dp.ServeRank(ctl, r.info.VocabSize, dp.Forward(lockstep.WithCacheOps(r.pool, lockstep.Forward(closeOnFailure(r, data)))), r.draft)
}

// closeOnFailure is r's forward, which closes the rank's communicators when it fails
// (closeComms: data and its model's layout groups split from it; on the GPU data alone,
// its NCCL collectives aborted by its watchdog): a step that failed mid-way leaves the
// group done (rank 0 stops it), and the peers that wait for this rank in an exchange or a
// TP all-reduce then fail at once ("peer gone") instead of at their deadline, which kept
// the stop waiting.
func closeOnFailure(r dpRank, data dist.Communicator) dp.Forward {
	return func(p *engine.BatchPlan, logits []float32) error {
		err := r.forward(p, logits)
		if err != nil {
			if r.closeComms != nil {
				r.closeComms()
			}
			data.Close()
		}
		return err
	}
}
