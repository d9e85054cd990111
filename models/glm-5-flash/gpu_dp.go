package glm5flash

import (
	"errors"
	"fmt"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/gpurunner"
	"github.com/resin-llm/resin/core/kernels/cuda"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/core/weights"
)

// DP-attention on the GPU, as deepseek-v4-flash's (its gpu_dp.go): each dp rank is a
// GPURunner on a device of its own with an engine and a device pool of its own
// (core/dist/dp's Group steps them together), attending only its own plan's rows (its KDA
// and MLA layers, its dense MLPs) with the replicated weights; its MoE layers run
// expert-parallel over the dp group, each rank holding its range of the routed experts,
// the rows exchanged over NCCL by the gather or the all-to-all dispatch
// (gpurunner.DPMoE). A rank with no work (an idle plan) runs the MoE layers' exchanges
// alone. Steps run eagerly; MTP drafts under DP-attention are not built on the GPU (the
// CPU runs them: dp.go).

// moeDP is moe under DP-attention: out [n, D] for this rank's n rows of x (0 on an idle
// rank), exchanged with the other ranks' by the run's dispatch (gpurunner.DPMoE), at
// par.dpRows rows a rank under the gather one.
func (g *gpuModel) moeDP(c *cudart.Ctx, e *gpuMoE, out, x cudart.DevicePtr, n int) error {
	f := gpurunner.DPMoEFuncs{
		Route:   func(n int) error { return g.route(c, e, x, n) },
		Experts: func(m cuda.MaskedMoE, x cudart.DevicePtr) error { return g.runHeld(c, e, m, x) },
		Shared:  func(dst cudart.DevicePtr, n int) error { return g.mlp(c, &e.shared, dst, x, n) },
	}
	return g.w.dp.Forward(c, g.s, g.kk, f, out, x, n, g.par.dpRows)
}

// idleDP is an idle dp rank's step: every MoE layer's exchange with padding rows alone
// (the dense layers have no collective under DP-attention).
func (g *gpuModel) idleDP(c *cudart.Ctx) error {
	w := &g.w
	for li := range g.layers {
		if l := &g.layers[li]; l.dense == nil {
			if err := g.moeDP(c, l.moe, w.ffn, w.x, 0); err != nil {
				return fmt.Errorf("gpu: idle step: layer %d: %w", li, err)
			}
		}
	}
	return c.Synchronize()
}

// DPForward is the forward of a dp rank (a runner of OpenGPUDPRanks) under core/dist/dp's
// Group, as TextRunner.DPForward on the CPU: p.DP must name this rank of the group
// (gpurunner.DPRows). A plan with tokens runs as the runner's forward does, its MoE
// layers exchanging its rows with the other ranks'; an idle plan runs only the MoE
// layers' exchanges. A step one rank refuses every rank refuses (gpurunner.AgreeDP).
func (r *GPURunner) DPForward(p *engine.BatchPlan, logits []float32) error {
	par := r.g.par
	if par == nil || !par.dp {
		return fmt.Errorf("%s on the GPU: DPForward on a runner not opened for DP-attention (OpenGPUDPRanks)", Name)
	}
	return gpurunner.DPStep(gpurunner.DPRank{Name: Name, Rank: par.rank, Size: par.size, Rows: r.g.maxTokens, Host: par.host}, p, logits,
		func() error { return r.checkPlan(p, logits) }, func(rows int) { par.dpRows = rows },
		func() error { return r.forward(p, logits) }, func() error { return r.dev.Do(r.g.idleDP) })
}

// GPUDPRanks are the dp ranks OpenGPUDPRanks opens, one GPURunner and device pool each,
// and the NCCL communicator their MoE layers exchange rows on.
type GPUDPRanks struct {
	*gpurunner.DPRanks[*GPURunner]
}

// OpenGPUDPRanks opens len(data) dp ranks of the text model in dir (OpenGPULayout's
// directory: a checkpoint, of which each rank reads its experts, or a config for the
// seeded random weights, built once and cut) for DP-attention on the GPU with exchange d
// (gpurunner.DPMoE): rank r on GPU opts.Ordinal+r where the driver
// sees that many, else every rank on opts.Ordinal, fp32 (but the KDA projections a
// checkpoint ships in bf16), with a device pool of cacheBytes of its own (0 = 256 MiB)
// and, for its model's CPU part, data[r] (the dp group's data communicator). Steps run
// eagerly; opts.Limits apply to every rank. Each rank's forward is its runner's
// DPForward under a core/dist/dp Group. Close closes the devices.
func OpenGPUDPRanks(dir string, cacheBytes int64, opts gpurunner.Options, d Dispatch, data []dist.Communicator) (*GPUDPRanks, error) {
	size := len(data)
	fail := func(err error) (*GPUDPRanks, error) {
		return nil, fmt.Errorf("%s: DP-attention over %d GPUs: %w", Name, size, err)
	}
	if d != DispatchGather && d != DispatchAllToAll {
		return fail(fmt.Errorf("dispatch %d", d))
	}
	if err := gpurunner.CheckDPGroup(data); err != nil {
		return fail(err)
	}
	if err := gpurunner.Available(opts.Ordinal); err != nil {
		return fail(err)
	}
	c, err := LoadTextConfig(dir)
	if err != nil {
		return fail(err)
	}
	l := Layout{EP: size, Dispatch: d}
	if err := l.Check(c); err != nil {
		return fail(err)
	}
	var whole *TextWeights
	if ck, err := weights.Open(dir); err == nil {
		ck.Close() // each rank reads its experts
	} else if !errors.Is(err, weights.ErrNotFound) {
		return fail(fmt.Errorf("load %s: %w", dir, err))
	} else if whole, err = randomWeights(dir, c, 0); err != nil {
		return fail(err)
	}
	gopts := GPUOptions{KDAWeights: shippedKDAType(dir, c)}
	ranks, err := gpurunner.OpenDPRanks(Name, opts, size, func(r int, dev *cudart.Device, cache *cudart.KernelCache, lim gpurunner.Limits) (*GPURunner, *kvslab.Pool, error) {
		p := gpuRankPart(c, l, r)
		w, err := loadPartWeights(dir, c, 0, p, whole)
		if err != nil {
			return nil, nil, err
		}
		w.mtp = nil // no drafts under DP-attention on the GPU
		p.comm, p.dp = data[r], true
		if err := checkGPURankWeights(c, w, &p); err != nil {
			return nil, nil, err
		}
		m := &TextModel{Config: gpuRankConfig(c, p), W: w, par: p}
		run, err := NewGPURunner(m, dev, cache, lim.MaxSeqs, lim.MaxTokens, min(lim.MaxRows, lim.MaxTokens), min(c.MaxPositionEmbeddings, 4096), gopts)
		if err != nil {
			return nil, nil, err
		}
		pool, err := run.NewPool(cacheBytes)
		if err != nil {
			run.Close()
		}
		return run, pool, err
	}, func(run *GPURunner, comm *cudart.Comm) { run.g.par.comm, run.g.w.dp.Comm = comm, comm })
	if err != nil {
		return fail(err)
	}
	g := &GPUDPRanks{ranks}
	if opts.Log != nil {
		fmt.Fprintf(opts.Log, "%s GPU DP-attention over %d ranks (experts %v, the %s exchange), eager steps: %s\n", Name, size, g.Experts(), d, g.Runners[0].Describe())
	}
	return g, nil
}

// Experts returns the routed experts each rank holds, [lo, hi).
func (g *GPUDPRanks) Experts() [][2]int {
	out := make([][2]int, len(g.Runners))
	for r, run := range g.Runners {
		out[r] = [2]int{run.g.par.lo, run.g.par.hi}
	}
	return out
}
