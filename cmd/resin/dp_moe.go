package main

import (
	"errors"
	"fmt"
	"time"

	"github.com/resin-llm/resin/core/cli"
	"github.com/resin-llm/resin/core/cpurunner"
	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/dist/dp"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/gpurunner"
	"github.com/resin-llm/resin/core/kvslab"
	deepseekv4flash "github.com/resin-llm/resin/models/deepseek-v4-flash"
	glm5flash "github.com/resin-llm/resin/models/glm-5-flash"
)

// dpAttentionMoEModels are the MoE models whose forwards read the plan's dp step: under
// --dp N --dp-attention each rank attends its own requests and the MoE layers run expert
// parallel over the N ranks (the ep group is the dp group), exchanging by --ep-dispatch.
var dpAttentionMoEModels = map[string]bool{deepseekv4flash.Name: true, glm5flash.Name: true}

// openDPAttentionMoE opens the dp ranks of MoE model name from dir for --dp-attention,
// each with a pool of cacheBytes, its MoE exchanges on data, under one dp.Group (ctl its
// clock): rank 0's runner and pool, and the others'. With drafts above 0
// (--num-speculative-tokens) every rank drafts that many tokens per step with its MTP
// head, the head's routed experts split over the ranks too, an idle rank running its
// draft step's exchanges with no rows (the models' DPDraft). With tp above 1 each dp rank
// is tp ranks of this process splitting its attention (the models' OpenDPTPRanks, a
// core/dist/dp AttentionTP group per dp rank), the routed experts split over all n·tp.
func openDPAttentionMoE(name, dir string, cacheBytes int64, dispatch string, drafts, tp int, ctl, data []dist.Communicator) (engine.Runner, *kvslab.Pool, *cli.DPRanks, error) {
	d, err := dispatchOf(dispatch)
	if err != nil {
		return nil, nil, nil, err
	}
	n, tp := len(data), max(tp, 1)
	what := fmt.Sprintf("--dp %d --dp-attention", n)
	world := data // the MoE exchanges' ranks: the dp group's, or with attention TP every rank
	if tp > 1 {
		what += fmt.Sprintf(" --tp %d", tp)
		if world, err = dist.NewInProcess(n*tp, dist.Options{Timeout: time.Minute}); err != nil {
			return nil, nil, nil, err
		}
	}
	// Each world rank's forward, draft step, plan check, info and cache groups.
	type opened struct {
		forward    dp.Forward
		draft      dp.Draft
		check      func(*engine.BatchPlan, []float32) error
		info       engine.RunnerInfo
		groups     int
		closeComms func()
	}
	var all []opened
	var pools []*kvslab.Pool
	switch name {
	case deepseekv4flash.Name:
		var runners []*deepseekv4flash.Runner
		runners, pools, err = deepseekv4flash.OpenDPTPRanks(dir, deepseekv4flash.Options{Drafts: drafts}, deepseekv4flash.Dispatch(d), tp, world, cacheBytes)
		for _, run := range runners {
			all = append(all, opened{run.DPForward, run.DPDraft, run.CheckPlan, run.Info(), len(run.CacheGroups()), run.CloseComms})
		}
	case glm5flash.Name:
		var runners []*glm5flash.TextRunner
		runners, pools, err = glm5flash.OpenDPTPRanks(dir, glm5flash.RankOptions{CacheBytes: cacheBytes, Drafts: drafts}, glm5flash.Dispatch(d), tp, world)
		for _, run := range runners {
			all = append(all, opened{run.DPForward, run.DPDraft, run.CheckPlan, run.Info(), len(run.CacheGroups()), run.CloseComms})
		}
	default:
		return nil, nil, nil, fmt.Errorf("--dp-attention: model %s's forward does not read the plan's dp step", name)
	}
	closeWorld := func() error {
		if tp > 1 {
			for _, c := range world {
				c.Close()
			}
		}
		return nil
	}
	if err != nil {
		closeWorld()
		return nil, nil, nil, fmt.Errorf("%s: %w", what, err)
	}
	forward := func(r int) dp.Forward { return all[r].forward }
	var closeTP func() error
	if tp > 1 {
		ranks := make([]dp.TPRank, len(all))
		for w, o := range all {
			ranks[w] = dp.TPRank{Forward: o.forward, Check: o.check, Pool: pools[w], World: world[w], CloseComms: o.closeComms}
		}
		a, err := dp.StartAttentionTP(tp, ranks, all[0].info.VocabSize)
		if err != nil {
			closeWorld()
			return nil, nil, nil, fmt.Errorf("%s: %w", what, err)
		}
		forward, closeTP = a.Forward, a.Close // closes world too
	}
	ranks := make([]dp.Rank, n)
	runners := make([]engine.Runner, n)
	dpPools := make([]*kvslab.Pool, n)
	for r := range n {
		lead := all[r*tp] // the dp rank's first rank: its engine's pool and info
		ranks[r] = dp.Rank{Forward: forward(r), CacheGroups: lead.groups, Ctl: ctl[r], Data: data[r]}
		if drafts > 0 {
			ranks[r].Draft, ranks[r].MaxDrafts = lead.draft, drafts
		}
		dpPools[r] = pools[r*tp]
	}
	group, err := dp.NewGroup(ranks, dp.Options{})
	if err != nil {
		return nil, nil, nil, errors.Join(err, callOr(closeTP))
	}
	for r := range n {
		runners[r] = cpurunner.New(all[r*tp].info, group.Runner(r)) // a cpurunner.Drafter when the ranks draft
	}
	return runners[0], dpPools[0], &cli.DPRanks{Runners: runners[1:], Pools: dpPools[1:], Group: group, Close: closeTP}, nil
}

// callOr calls f, when set.
func callOr(f func() error) error {
	if f == nil {
		return nil
	}
	return f()
}

// gpuDPRank is one dp rank of a model's DP-attention on a GPU: its forward (the
// model's GPURunner.DPForward), its draft step (DPDraft; nil: it does not draft) and
// runner info.
type gpuDPRank struct {
	forward dp.Forward
	draft   dp.Draft
	info    engine.RunnerInfo
}

// gpuDPOpened are the dp ranks a gpuDPOpeners entry opened: each rank's forward and info,
// their pools, what closes them all, and the decode graph buckets they replay (nil:
// eager steps), which the dp.Group pads all-decode steps to.
type gpuDPOpened struct {
	ranks   []gpuDPRank
	pools   []*kvslab.Pool
	close   func() error
	buckets []int
}

// gpuDPOpeners open the dp ranks of the MoE models whose GPU runners read the plan's dp
// step (their OpenGPUDPRanks), drafting drafts tokens a step (0: none; gpuDPDrafters).
var gpuDPOpeners = map[string]func(dir string, cacheBytes int64, opts gpurunner.Options, d, drafts int, data []dist.Communicator) (*gpuDPOpened, error){
	deepseekv4flash.Name: func(dir string, cacheBytes int64, opts gpurunner.Options, d, drafts int, data []dist.Communicator) (*gpuDPOpened, error) {
		g, err := deepseekv4flash.OpenGPUDPRanks(dir, cacheBytes, opts, deepseekv4flash.Dispatch(d), drafts, data)
		if err != nil {
			return nil, err
		}
		return &gpuDPOpened{gpuDPRanksOf(g.Runners, g.Forward, g.Draft), g.Pools, g.Close, g.GraphBuckets()}, nil
	},
	glm5flash.Name: func(dir string, cacheBytes int64, opts gpurunner.Options, d, drafts int, data []dist.Communicator) (*gpuDPOpened, error) {
		g, err := glm5flash.OpenGPUDPRanks(dir, cacheBytes, opts, glm5flash.Dispatch(d), drafts, data)
		if err != nil {
			return nil, err
		}
		return &gpuDPOpened{gpuDPRanksOf(g.Runners, g.Forward, g.Draft), g.Pools, g.Close, g.GraphBuckets()}, nil
	},
}

// gpuDPDrafters are the models of gpuDPOpeners whose GPU dp ranks draft with their MTP
// head (--num-speculative-tokens under --dp-attention on the GPU).
var gpuDPDrafters = map[string]bool{deepseekv4flash.Name: true, glm5flash.Name: true}

// gpuDPRanksOf is each runner's forward (forward(r): its DPForward under its watchdog),
// draft step (draft(r), nil or returning nil when the ranks do not draft) and info.
func gpuDPRanksOf[R interface{ Info() engine.RunnerInfo }](runners []R, forward func(r int) func(p *engine.BatchPlan, logits []float32) error,
	draft func(r int) func(p *engine.BatchPlan, res *engine.StepResult) error) []gpuDPRank {
	ranks := make([]gpuDPRank, len(runners))
	for r, run := range runners {
		ranks[r] = gpuDPRank{forward: forward(r), info: run.Info()}
		if draft != nil {
			ranks[r].draft = draft(r)
		}
	}
	return ranks
}

// openDPAttentionGPU opens --dp n --dp-attention on GPUs for MoE model name
// (gpuDPOpeners): dp rank r a GPU runner of this process on GPU --gpu+r (every rank on
// --gpu where the driver sees fewer), each with its own engine and device pool of
// cacheBytes, the routed experts split over the ranks and exchanged over NCCL by
// --ep-dispatch, under one dp.Group (ctl its clock). With --device cuda-emu the
// emulator shows as many GPUs as ranks unless RESIN_EMU_DEVICES says otherwise.
func (f *runtimeFlags) openDPAttentionGPU(name, dir string, ctl, data []dist.Communicator) (engine.Runner, *kvslab.Pool, *cli.DPRanks, error) {
	n := len(data)
	d, err := dispatchOf(f.tp.dispatch)
	if err != nil {
		return nil, nil, nil, err
	}
	return f.openGPUDP(name, dir, fmt.Sprintf("--dp %d --dp-attention", n), n, func(cacheBytes int64, opts gpurunner.Options) (engine.Runner, *kvslab.Pool, *cli.DPRanks, error) {
		o, err := gpuDPOpeners[name](dir, cacheBytes, opts, d, f.specTokens, data)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("--dp %d --dp-attention: %w", n, err)
		}
		ranks := make([]dp.Rank, n)
		for r, g := range o.ranks {
			ranks[r] = dp.Rank{Forward: g.forward, CacheGroups: len(g.info.CacheGroups), Ctl: ctl[r], Data: data[r]}
			if g.draft != nil {
				ranks[r].Draft, ranks[r].MaxDrafts = g.draft, f.specTokens
			}
		}
		group, err := dp.NewGroup(ranks, dp.Options{GraphBuckets: o.buckets})
		if err != nil {
			o.close()
			return nil, nil, nil, err
		}
		runners := make([]engine.Runner, n)
		for r, g := range o.ranks {
			runners[r] = cpurunner.New(g.info, group.Runner(r)) // a cpurunner.Drafter when the ranks draft
		}
		return runners[0], o.pools[0], &cli.DPRanks{Runners: runners[1:], Pools: o.pools[1:], Group: group, Close: o.close}, nil
	})
}

// openDPProcsGPU opens --dp n --dp-attention --dp-procs on GPUs for MoE model name: dp
// rank r on GPU --gpu+r (every rank on --gpu where the driver sees fewer), rank 0 a GPU
// runner of this process and ranks 1..n-1 worker processes of this binary, each with its
// own device pool, the routed experts split over the ranks and their rows exchanged over
// NCCL across the processes by --ep-dispatch (the models' JoinGPUDPRank); the engines and
// the coordinator stay here (openDPProcs).
func (f *runtimeFlags) openDPProcsGPU(name, dir string) (engine.Runner, *kvslab.Pool, *cli.DPRanks, error) {
	n := f.dp.size
	return f.openGPUDP(name, dir, fmt.Sprintf("--dp %d --dp-attention --dp-procs", n), n, func(cacheBytes int64, opts gpurunner.Options) (engine.Runner, *kvslab.Pool, *cli.DPRanks, error) {
		ordinals, err := gpurunner.RankOrdinals(opts.Ordinal, n)
		if err != nil {
			return nil, nil, nil, err
		}
		return openDPProcs(name, dir, cacheBytes, f.tp.dispatch, n, 1, f.specTokens, f.dp.stepTimeout, &dpGPUProcs{opts: opts, ordinals: ordinals, emulate: f.device.Device == cli.DeviceCUDAEmu})
	})
}

// openGPUDP runs open, which opens dp ranks of MoE model name on GPUs (local of them in
// this process or its workers: with --device cuda-emu the emulator shows that many GPUs
// unless RESIN_EMU_DEVICES says otherwise, and the workers inherit it), inside --device's
// GPU opener with its runner options and the cache's bytes. A model without GPU
// DP-attention, and drafts, are refused first; what names the layout in the errors.
func (f *runtimeFlags) openGPUDP(name, dir, what string, local int, open func(cacheBytes int64, opts gpurunner.Options) (engine.Runner, *kvslab.Pool, *cli.DPRanks, error)) (engine.Runner, *kvslab.Pool, *cli.DPRanks, error) {
	switch {
	case gpuDPOpeners[name] == nil:
		return nil, nil, nil, fmt.Errorf("%s --device %s: DP-attention on the GPU covers deepseek-v4-flash and glm-5-flash only, not %s (--device cpu runs llama's)", what, f.device.Device, name)
	case f.specTokens > 0 && !gpuDPDrafters[name]:
		return nil, nil, nil, fmt.Errorf("%s --device %s --num-speculative-tokens %d: %s's drafting dp ranks run on the CPU only so far", what, f.device.Device, f.specTokens, name)
	}
	if err := f.showEmulatedGPUs(local, what); err != nil {
		return nil, nil, nil, err
	}
	var run engine.Runner
	var pool *kvslab.Pool
	var ranks *cli.DPRanks
	_, _, err := f.device.OpenGPU(name, func(dir string, cacheBytes int64, opts gpurunner.Options) (engine.Runner, *kvslab.Pool, error) {
		var err error
		run, pool, ranks, err = open(cacheBytes, opts)
		return nil, nil, err
	}, dir, f.cacheBytes)
	if err != nil {
		return nil, nil, nil, err
	}
	return run, pool, ranks, nil
}
