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
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/gpurunner"
	"github.com/resin-llm/resin/core/kvslab"
	deepseekv4flash "github.com/resin-llm/resin/models/deepseek-v4-flash"
	glm5flash "github.com/resin-llm/resin/models/glm-5-flash"
)

// gpuLayoutJoiners are the models of gpuLayoutOpeners whose GPU layout also runs as a
// worker process per rank (--tp-procs): rank ctl.Rank() of tp × ep ranks joining the
// others over ctl (the NCCL id, the plans) and data (the model's CPU part).
var gpuLayoutJoiners = map[string]func(dir string, cacheBytes int64, opts gpurunner.Options, tp, ep, dispatch int, cp bool, drafts int, ctl, data dist.Communicator) (*gpurunner.ProcRank, engine.RunnerInfo, error){
	deepseekv4flash.Name: func(dir string, cacheBytes int64, opts gpurunner.Options, tp, ep, dispatch int, cp bool, drafts int, ctl, data dist.Communicator) (*gpurunner.ProcRank, engine.RunnerInfo, error) {
		return deepseekv4flash.JoinGPULayout(dir, cacheBytes, opts, deepseekv4flash.Layout{TP: tp, EP: ep, Dispatch: deepseekv4flash.Dispatch(dispatch), CP: cp}, drafts, ctl, data)
	},
	glm5flash.Name: func(dir string, cacheBytes int64, opts gpurunner.Options, tp, ep, dispatch int, cp bool, drafts int, ctl, data dist.Communicator) (*gpurunner.ProcRank, engine.RunnerInfo, error) {
		return glm5flash.JoinGPULayout(dir, cacheBytes, opts, glm5flash.Layout{TP: tp, EP: ep, Dispatch: glm5flash.Dispatch(dispatch), CP: cp}, drafts, ctl, data)
	},
}

// gpuCPJoiners are the models whose GPU runner runs prefill context parallelism (--cp N
// with --device cuda) as a worker process per rank (--cp-procs) or across nodes: rank
// ctl.Rank() of ctl.Size() joining the others over ctl (the NCCL id, the plans).
var gpuCPJoiners = map[string]func(dir string, cacheBytes int64, opts gpurunner.Options, ctl dist.Communicator) (*gpurunner.ProcRank, engine.RunnerInfo, error){
	deepseekv4flash.Name: deepseekv4flash.JoinGPUCP,
	glm5flash.Name:       glm5flash.JoinGPUCP,
}

// gpuJoin opens this process's rank of a MoE model's GPU layout, joining the others
// over ctl and data.
type gpuJoin func(dir string, cacheBytes int64, opts gpurunner.Options, ctl, data dist.Communicator) (*gpurunner.ProcRank, engine.RunnerInfo, error)

// layoutJoin is model's gpuJoin: with cp above 1 alone its prefill CP's (gpuCPJoiners),
// else its tp × ep layout's by dispatch (with cp, prefill CP over the ep ranks), drafting
// drafts a step (gpuLayoutJoiners); nil when the model has none.
func layoutJoin(model string, tp, ep, dispatch, cp, drafts int) gpuJoin {
	if cp > 1 && ep <= 1 {
		join := gpuCPJoiners[model]
		if join == nil {
			return nil
		}
		return func(dir string, cacheBytes int64, opts gpurunner.Options, ctl, _ dist.Communicator) (*gpurunner.ProcRank, engine.RunnerInfo, error) {
			return join(dir, cacheBytes, opts, ctl)
		}
	}
	join := gpuLayoutJoiners[model]
	if join == nil {
		return nil
	}
	return func(dir string, cacheBytes int64, opts gpurunner.Options, ctl, data dist.Communicator) (*gpurunner.ProcRank, engine.RunnerInfo, error) {
		return join(dir, cacheBytes, opts, tp, ep, dispatch, cp > 1, drafts, ctl, data)
	}
}

// layoutWhat names the layout of f for errors: its --cp, or its --tp and --ep.
func (f *runtimeFlags) layoutWhat() string {
	if f.cp.size > 1 && f.tp.ep > 1 {
		return fmt.Sprintf("--cp %d --ep %d", f.cp.size, f.tp.ep)
	}
	if f.cp.size > 1 {
		return fmt.Sprintf("--cp %d", f.cp.size)
	}
	return layoutSpelling(f.tp.size, f.tp.ep, 1)
}

// openLayoutGPUProcs is openLayoutGPU with ranks 1..N-1 as worker processes of this
// binary, rank r on GPU --gpu+r (all on --gpu where fewer are seen), each bound to its
// GPU's NUMA node, meeting rank 0 (this process, the engine's) in shared memory; the
// step of a dead worker fails naming its rank, pid and signal.
func (f *runtimeFlags) openLayoutGPUProcs(name, dir string, cacheBytes int64, opts gpurunner.Options) (engine.Runner, *kvslab.Pool, error) {
	d, err := dispatchOf(f.tp.dispatch)
	if err != nil {
		return nil, nil, err
	}
	join := layoutJoin(name, f.tp.size, f.tp.ep, d, f.cp.size, f.specTokens)
	size := f.tp.ranks()
	what := f.layoutWhat() + " --tp-procs"
	if f.cp.size > 1 {
		what = f.layoutWhat() + " --cp-procs"
	}
	if err := gpurunner.Available(opts.Ordinal); err != nil {
		return nil, nil, fmt.Errorf("%s on the GPU: %w", name, err)
	}
	ordinals, err := gpurunner.RankOrdinals(opts.Ordinal, size)
	if err != nil {
		return nil, nil, err
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, nil, err
	}
	spec := tpWorkerSpec{Name: fmt.Sprintf("resin%d-gpu", os.Getpid()), Size: size, Dir: dir, Model: name, TP: f.tp.size, EP: f.tp.ep, Dispatch: d, CP: f.cp.size, Drafts: f.specTokens}
	w, err := launchGPUWorkers(exe, spec, ordinals, opts, f.device.Device == cli.DeviceCUDAEmu)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", what, err)
	}
	ctl, data, err := joinTP(spec, w.Exited())
	if err != nil {
		w.Kill()
		return nil, nil, fmt.Errorf("%s: %w", what, w.StepError(err))
	}
	opts.Ordinal = ordinals[0]
	g, info, err := join(dir, cacheBytes, opts, ctl, data)
	if err != nil {
		err = workerError(w, err)
		ctl.Close()
		data.Close()
		w.Kill()
		return nil, nil, fmt.Errorf("%s: %w", what, err)
	}
	ws := &tpWorkers{ctl: ctl, data: data, w: w}
	watch := abortOnExit(w, g.Abort)
	lead, limit := g.Leader(), newStepLimit(w, opts.Watchdog)
	step := ws.forward(lead.Lead)
	lead.Lead = func(p *engine.BatchPlan, logits []float32) error {
		return limit.run(func() error { return step(p, logits) })
	}
	if lead.LeadDraft != nil {
		draft := lead.LeadDraft
		lead.LeadDraft = func(p *engine.BatchPlan, res *engine.StepResult) error {
			return limit.run(func() error { return w.StepError(draft(p, res)) })
		}
	}
	closeAll := func() error {
		watch()
		return errors.Join(limit.stop(g.Close), w.Stop(30*time.Second), ctl.Close(), data.Close())
	}
	return &tpRunner{cpurunner.New(info, lead), closeAll, w}, g.Pool(), nil
}

// runGPULayoutWorker is a --tp-procs (or --cp-procs) worker of a MoE model's GPU
// layout: it joins rank 0, opens its rank on its GPU and follows rank 0's plans until it
// stops.
func runGPULayoutWorker(spec tpWorkerSpec) error {
	gs := spec.GPU
	join := layoutJoin(spec.Model, spec.TP, spec.EP, spec.Dispatch, spec.CP, spec.Drafts)
	if join == nil {
		return fmt.Errorf("rank %d: model %q has no GPU layout (cp %d) in worker processes", spec.Rank, spec.Model, spec.CP)
	}
	if gs.Emulate {
		if err := cudart.Emulate(); err != nil {
			return fmt.Errorf("rank %d: --device cuda-emu: %w", spec.Rank, err)
		}
	}
	ctl, data, err := joinTP(spec, nil)
	if err != nil {
		return err
	}
	defer ctl.Close()
	defer data.Close()
	opts := gpurunner.Options{Ordinal: gs.Ordinal, NUMA: gs.NUMA, Limits: gs.Limits, Eager: gs.Eager, KernelCache: gs.KernelCache, Watchdog: gs.Watchdog}
	g, _, err := join(spec.Dir, 0, opts, ctl, data)
	if err != nil {
		return err
	}
	return errors.Join(g.Follow(), g.Close())
}

// openLayoutGPUNodes is openLayoutGPU across nodes (--dist-init-addr, --nnodes,
// --node-rank or torchrun's environment): this node's share of the tp × ep ranks, each on
// GPU --gpu + its index on the node (all on --gpu where fewer are seen), joining the
// others over TCP control and data communicators at the rendezvous, rank 0 handing out
// the NCCL id there (gpurunner.JoinGroup). Node 0's first rank serves the engine; the
// other nodes follow until it stops them (errWorkerDone).
func (f *runtimeFlags) openLayoutGPUNodes(name, dir string, cacheBytes int64, opts gpurunner.Options) (engine.Runner, *kvslab.Pool, error) {
	d, err := dispatchOf(f.tp.dispatch)
	if err != nil {
		return nil, nil, err
	}
	join, t := layoutJoin(name, f.tp.size, f.tp.ep, d, f.cp.size, f.specTokens), &f.tp
	size := t.ranks()
	first, n := t.nodeRanks()
	type rank struct {
		g         *gpurunner.ProcRank
		info      engine.RunnerInfo
		ctl, data dist.Communicator
	}
	open := func(r int) (*rank, error) {
		ctl, err := dist.JoinTCP(t.initAddr, r, size, dist.Options{Timeout: 100 * 365 * 24 * time.Hour, JoinTimeout: t.joinTimeout(), Group: "gpu-layout-ctl"})
		if err != nil {
			return nil, err
		}
		data, err := dist.JoinTCP(t.initAddr, r, size, dist.Options{Timeout: time.Minute, JoinTimeout: t.joinTimeout(), Group: "gpu-layout-data"})
		if err != nil {
			ctl.Close()
			return nil, err
		}
		o := opts
		if c, err := cudart.DeviceCount(); err == nil && opts.Ordinal+t.localRank+n <= c {
			o.Ordinal += t.localRank + r - first
		} // else every rank of this node on --gpu (NCCL_MULTI_RANK_GPU_ENABLE=1), as in-process ranks are
		g, info, err := join(dir, cacheBytes, o, ctl, data)
		if err == nil {
			err = data.Barrier() // every rank has read dir (a --random-weights copy is removed after)
			if err != nil {
				g.Close()
			}
		}
		if err != nil {
			ctl.Close()
			data.Close()
			return nil, fmt.Errorf("on GPU %d: %w", o.Ordinal, err)
		}
		return &rank{g, info, ctl, data}, nil
	}
	follow := func(r int) error {
		k, err := open(r)
		if err != nil {
			return err
		}
		defer k.ctl.Close()
		defer k.data.Close()
		return errors.Join(k.g.Follow(), k.g.Close())
	}
	wait := withLocalRanks(first, n, follow)
	if first != 0 {
		if err := follow(first); err != nil {
			return nil, nil, fmt.Errorf("worker node %d: rank %d: %w", t.nodeRank, first, err)
		}
		if err := wait(); err != nil {
			return nil, nil, fmt.Errorf("worker node %d: %w", t.nodeRank, err)
		}
		return nil, nil, errWorkerDone
	}
	k, err := open(0)
	if err != nil {
		return nil, nil, fmt.Errorf("node 0: %w", err)
	}
	stop := func() error {
		err := k.g.Close() // stops the followers first
		k.ctl.Close()
		k.data.Close()
		return errors.Join(err, wait())
	}
	return &tpRunner{cpurunner.New(k.info, k.g.Leader()), stop, nil}, k.g.Pool(), nil
}
