package main

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/resin-llm/resin/core/cli"
	"github.com/resin-llm/resin/core/cpurunner"
	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/dist/dp"
	"github.com/resin-llm/resin/core/dist/launch"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/models"
	"github.com/resin-llm/resin/models/llama"
)

// dpFlags choose data parallelism: --dp N engines, each with its own copy of the model and
// its own cache pool, behind a coordinator that routes each request to the rank with the
// fewest waiting (then running) requests; with --dp-attention the ranks step together
// (core/dist/dp's Group), as the layers that mix the ranks' tokens (expert parallelism
// under DP-attention) need.
type dpFlags struct {
	size      int
	attention bool
	procs     bool // --dp-procs: ranks 1..N-1 in worker processes (dp_procs.go)
	// stepTimeout bounds rank 0's wait for a --dp-procs worker's answer to one step.
	stepTimeout time.Duration
	// stepTimeoutSet: --step-timeout given, refused where nothing reads it.
	stepTimeoutSet func() bool
}

func (d *dpFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.IntVar(&d.size, "dp", 1, "with --model: data parallelism over this many ranks of this process, each an engine with its own copy of the model (on the CPU its own in-process --tp/--ep group when given) and its own cache pool of --cache-bytes; requests go to the rank with the fewest waiting, then running, requests (with --device cuda|cuda-emu only with --dp-attention)")
	fl.BoolVar(&d.procs, "dp-procs", false, "with --dp N --dp-attention, deepseek-v4-flash or glm-5-flash: run dp ranks 1..N-1 as worker processes of this binary (each its attention, its experts and its cache; their engines and the coordinator stay in this process), meeting rank 0 in shared memory (with --tp T, every rank but this one's first: N·T processes); on --device cuda|cuda-emu each on its GPU, bound to its NUMA node, the experts' rows exchanged over NCCL (default: ranks of this process)")
	d.stepTimeoutSet = func() bool { return fl.Changed("step-timeout") }
	fl.DurationVar(&d.stepTimeout, "step-timeout", 5*time.Minute, "with --dp-procs, or --dp-attention across nodes: how long rank 0 waits for a worker's answer to one step before failing it naming the worker's rank (a worker alive but stuck; vLLM's VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS); each expert exchange waits up to a minute on its own")
	fl.BoolVar(&d.attention, "dp-attention", false, "with --dp: the ranks step together (each step they exchange token counts, a rank without work runs an idle plan), as DP-attention with expert parallelism needs; --model llama, or deepseek-v4-flash and glm-5-flash with their experts split over the dp ranks (--ep-dispatch picks their exchange); with --device cuda|cuda-emu those two, a GPU per dp rank (--gpu+r)")
}

// check refuses the layouts --dp does not cover yet.
func (d *dpFlags) check(f *runtimeFlags) error {
	switch {
	case d.size < 1:
		return fmt.Errorf("--dp %d: want 1 or more ranks", d.size)
	case d.stepTimeout <= 0:
		return fmt.Errorf("--step-timeout %v: want a positive duration", d.stepTimeout)
	case !d.procs && d.stepTimeoutSet != nil && d.stepTimeoutSet() && !(d.attention && f.acrossNodes()):
		return errors.New("--step-timeout bounds a --dp-procs worker's step (or a node's, for --dp-attention across nodes); the other layouts' worker steps are bounded by --watchdog-timeout (GPU) or the collectives' own deadlines")
	case d.attention && d.size < 2:
		return errors.New("--dp-attention needs --dp 2 or more")
	case d.procs && !d.attention:
		return fmt.Errorf("--dp-procs needs --dp 2 or more with --dp-attention (replicas in worker processes are not built: --dp %d without it runs engines of this process)", d.size)
	case d.size == 1:
		return nil
	case f.model == "":
		return errors.New("--dp needs --model: the test runner has one rank")
	case f.tp.procs:
		return fmt.Errorf("--dp %d is not combined with --tp-procs: --dp-procs runs its ranks as worker processes", d.size)
	case f.tp.initAddr != "" && (!d.attention || d.procs):
		return fmt.Errorf("--dp %d with --dist-init-addr runs --dp-attention's ranks across nodes (without --dp-procs: a node's ranks are goroutines of its process); replicas do not span nodes", d.size)
	case d.attention && f.tp.size > 1 && f.tp.ep == 1 && !f.device.CUDA():
		// Attention TP within each dp rank (openDPAttentionMoE): --dp N --tp T runs N·T
		// ranks of this process (with --dp-procs N·T processes, or across nodes), SGLang's
		// --tp N·T --dp N --enable-dp-attention.
	case d.attention && (f.tp.size > 1 || f.tp.ep > 1):
		if f.device.CUDA() {
			return fmt.Errorf("--dp-attention on the GPU is not combined with --tp or --ep yet (the dp group is the experts' group: --dp %d --dp-attention splits the routed experts over its ranks; on the CPU, --tp T splits each dp rank's attention)", d.size)
		}
		if f.tp.size == 1 {
			return fmt.Errorf("--dp %d --dp-attention --ep %d: DP-attention's experts are already split over its dp ranks (the ep group is the dp group), so --ep is not given with it", d.size, f.tp.ep)
		}
		return fmt.Errorf("--dp %d --dp-attention --tp %d --ep %d: attention TP within the dp ranks runs on the CPU, and --ep is the whole world's already (the routed experts split over every rank); --dp N --tp T without --dp-attention runs replicas of the in-process TP group", d.size, f.tp.size, f.tp.ep)
	case f.device.CUDA() && !d.attention:
		return fmt.Errorf("--dp %d on the GPU runs with --dp-attention only so far (replicas on GPUs are not wired)", d.size)
	}
	if d.attention && f.tp.ep == 1 {
		// Its ranks split over --nnodes (tpFlags.check): N, or N·T with attention TP.
		f.tp.groupRanks, f.tp.groupFlag = d.size*f.tp.size, fmt.Sprintf("--dp %d", d.size)
		if f.tp.size > 1 {
			f.tp.groupFlag += fmt.Sprintf(" --tp %d", f.tp.size)
		}
	}
	return nil
}

// openDP opens d.size ranks of model m from dir: rank 0's runner and pool, and the
// others'. With --dp-attention (llama), every rank's forward runs through one dp.Group
// over in-process communicators.
func (f *runtimeFlags) openDP(m models.Model, dir string) (engine.Runner, *kvslab.Pool, *cli.DPRanks, error) {
	n := f.dp.size
	runners := make([]engine.Runner, n)
	pools := make([]*kvslab.Pool, n)
	var group *dp.Group
	if !f.dp.attention {
		for r := range n {
			var err error
			switch {
			case (f.tp.size > 1 || f.tp.ep > 1) && moeParallelModels[m.Name]:
				runners[r], pools[r], err = openMoEParallel(m.Name, dir, f.cacheBytes, f.specTokens, &f.tp)
			case f.tp.ep > 1:
				return nil, nil, nil, fmt.Errorf("--ep %d: expert parallelism covers deepseek-v4-flash and glm-5-flash only, not %s", f.tp.ep, m.Name)
			case f.tp.size > 1 && m.Name != "llama":
				return nil, nil, nil, fmt.Errorf("--tp %d: tensor parallelism covers the llama family, deepseek-v4-flash and glm-5-flash only so far, not %s", f.tp.size, m.Name)
			case f.tp.size > 1:
				runners[r], pools[r], err = openTP(dir, f.cacheBytes, &f.tp) // an in-process TP group per dp rank
			case f.specTokens > 0 && m.OpenSpeculative != nil:
				runners[r], pools[r], err = m.OpenSpeculative(dir, f.cacheBytes, f.specTokens)
			case f.specTokens > 0:
				return nil, nil, nil, fmt.Errorf("--num-speculative-tokens %d: model %s has no draft head to propose drafts", f.specTokens, m.Name)
			default:
				runners[r], pools[r], err = m.Open(dir, f.cacheBytes)
			}
			if err != nil {
				for _, run := range runners[:r] {
					if c, ok := run.(interface{ StopRanks() error }); ok {
						c.StopRanks()
					}
				}
				return nil, nil, nil, fmt.Errorf("--dp rank %d: %w", r, err)
			}
		}
		return runners[0], pools[0], &cli.DPRanks{Runners: runners[1:], Pools: pools[1:]}, nil
	}
	if m.Name != "llama" && !dpAttentionMoEModels[m.Name] {
		return nil, nil, nil, fmt.Errorf("--dp-attention covers --model llama, deepseek-v4-flash and glm-5-flash only so far, not %s (its forward does not read the plan's dp step yet)", m.Name)
	}
	switch {
	case f.specTokens > 0 && !dpAttentionMoEModels[m.Name]:
		return nil, nil, nil, fmt.Errorf("--dp-attention --num-speculative-tokens %d: drafting dp ranks cover the MTP heads of deepseek-v4-flash and glm-5-flash only, not %s", f.specTokens, m.Name)
	}
	if f.tp.initAddr != "" {
		if !dpAttentionMoEModels[m.Name] {
			return nil, nil, nil, fmt.Errorf("--dp %d --dp-attention across nodes covers deepseek-v4-flash and glm-5-flash only, not %s", n, m.Name)
		}
		return f.openDPNodes(m.Name, dir) // dp_procs.go
	}
	if f.dp.procs {
		if !dpAttentionMoEModels[m.Name] {
			return nil, nil, nil, fmt.Errorf("--dp-procs covers deepseek-v4-flash and glm-5-flash only so far, not %s (llama's dp ranks mix nothing: --dp %d without --dp-attention runs them as engines of this process)", m.Name, n)
		}
		if f.device.CUDA() {
			return f.openDPProcsGPU(m.Name, dir) // dp_moe.go
		}
		return openDPProcs(m.Name, dir, f.cacheBytes, f.tp.dispatch, n, f.tp.size, f.specTokens, f.dp.stepTimeout, nil) // dp_procs.go
	}
	ctl, err := dist.NewInProcess(n, dist.Options{Timeout: 100 * 365 * 24 * time.Hour}) // the engines may idle
	if err != nil {
		return nil, nil, nil, err
	}
	data, err := dist.NewInProcess(n, dist.Options{Timeout: time.Minute})
	if err != nil {
		return nil, nil, nil, err
	}
	if f.device.CUDA() {
		return f.openDPAttentionGPU(m.Name, dir, ctl, data) // dp_moe.go
	}
	if dpAttentionMoEModels[m.Name] {
		return openDPAttentionMoE(m.Name, dir, f.cacheBytes, f.tp.dispatch, f.specTokens, f.tp.size, ctl, data) // dp_moe.go
	}
	if f.tp.size > 1 {
		return nil, nil, nil, fmt.Errorf("--dp %d --dp-attention --tp %d: attention TP within the dp ranks covers deepseek-v4-flash and glm-5-flash, not %s (its dp ranks mix nothing: --dp %d --tp %d without --dp-attention runs replicas of the TP group)", n, f.tp.size, m.Name, n, f.tp.size)
	}
	ranks := make([]dp.Rank, n)
	infos := make([]engine.RunnerInfo, n)
	for r := range n {
		lr, err := llama.Load(dir, llama.Options{})
		if err != nil {
			return nil, nil, nil, fmt.Errorf("--dp rank %d: %w", r, err)
		}
		if pools[r], err = engine.NewHostPool(lr.CacheGroups(), f.cacheBytes); err != nil {
			return nil, nil, nil, fmt.Errorf("--dp rank %d: %w", r, err)
		}
		kv, err := llama.NewKVCache(lr.Model.Config, pools[r])
		if err != nil {
			return nil, nil, nil, fmt.Errorf("--dp rank %d: %w", r, err)
		}
		model := lr.Model
		// llama mixes nothing across ranks: an idle plan has nothing to compute.
		forward := func(p *engine.BatchPlan, logits []float32) error {
			if p.NumTokens() == 0 {
				return nil
			}
			return model.Forward(p, kv, logits)
		}
		ranks[r] = dp.Rank{Forward: forward, CacheGroups: len(lr.CacheGroups()), Ctl: ctl[r], Data: data[r]}
		infos[r] = lr.Info()
	}
	if group, err = dp.NewGroup(ranks, dp.Options{}); err != nil {
		return nil, nil, nil, err
	}
	for r := range n {
		runners[r] = cpurunner.New(infos[r], cpurunner.ForwardFunc(group.Forward(r)))
	}
	return runners[0], pools[0], &cli.DPRanks{Runners: runners[1:], Pools: pools[1:], Group: group}, nil
}

// acrossNodes reports whether the command runs across nodes: --dist-init-addr, or the
// LeaderWorkerSet or torchrun environment tpFlags.check reads it from.
func (f *runtimeFlags) acrossNodes() bool {
	if f.tp.initAddr != "" {
		return true
	}
	_, ok, _ := launch.NodeFromEnv(os.Getenv)
	return ok
}
