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
// GPURunner on a device of its own with an engine and a device pool of its own (core/dist/dp's
// Group steps them together), attending only its own plan's rows (its KDA and MLA
// layers, its dense MLPs) with the replicated weights; its MoE layers run expert-parallel
// over the dp group, each rank holding its range of the routed experts. The exchange is
// the gather dispatch on NCCL: every rank pads its rows to the step's row count (the
// most any rank has, or DPStep.Pad) with zero rows routed to no expert, the ranks
// all-gather their rows, routes and weights, each runs its experts over every rank's
// rows in the masked layout (its own rows' shared experts in its block), and a
// reduce-scatter hands each rank the sum of the ranks' partials for its own rows (or, by
// the all-to-all dispatch, moeA2A, a row goes only to its experts' ranks). A rank with no
// work (an idle plan) runs the MoE layers' collectives alone. Steps run eagerly; MTP
// drafts under DP-attention are not built on the GPU (the CPU runs them: dp.go).

// moeDP is moe under DP-attention: out [n, D] for this rank's n rows of x (0 on an idle
// rank), exchanged with the other ranks' at par.dpRows rows a rank.
func (g *gpuModel) moeDP(c *cudart.Ctx, e *gpuMoE, out, x cudart.DevicePtr, n int) error {
	cfg, w, p := g.m.Config, &g.w, g.par
	if p.allToAll {
		return g.moeA2A(c, e, out, x, n)
	}
	E, K, D := cfg.NRoutedExperts, cfg.NumExpertsPerTok, cfg.HiddenSize
	rows := p.dpRows
	switch {
	case rows < max(n, 1) || rows > g.workRows():
		return fmt.Errorf("gpu: dp rank %d: %d rows padded to %d, for a workspace of %d a rank", p.rank, n, rows, g.workRows())
	case p.comm == nil:
		return errors.New("gpu: the dp ranks' NCCL communicator is not joined (OpenGPUDPRanks)")
	}
	all := p.size * rows
	if n > 0 {
		if err := g.route(c, e, x, n); err != nil {
			return err
		}
	}
	if pad := rows - n; pad > 0 {
		// The padding rows: zero inputs routed to no expert (id −1, every byte 0xff: the
		// masked layout drops the pair, the combine skips it) at weight 0. Routed to a
		// real expert they would take its rows from the other ranks' tokens.
		for _, z := range []struct {
			p    cudart.DevicePtr
			v    byte
			cols int
		}{{x, 0, D}, {w.rids, 0xff, K}, {w.rweights, 0, K}} {
			if err := c.MemsetAsync(off(z.p, n*z.cols), z.v, int64(4*pad*z.cols), g.s); err != nil {
				return fmt.Errorf("gpu: dp: pad the rows: %w", err)
			}
		}
	}
	gathers := []struct {
		send, recv cudart.DevicePtr
		count      int
		t          cudart.DType
		what       string
	}{{x, w.xAll, rows * D, cudart.F32, "rows"}, {w.rids, w.idsAll, 4 * rows * K, cudart.Bytes, "routes"}, {w.rweights, w.wAll, rows * K, cudart.F32, "route weights"}}
	for _, gt := range gathers {
		if err := p.comm.AllGather(gt.send, gt.recv, gt.count, gt.t, g.s); err != nil {
			return fmt.Errorf("gpu: dp: gather the ranks' %s: %w", gt.what, err)
		}
	}
	m := cuda.MaskedMoE{IDs: w.idsAll, Weights: w.wAll, Counts: w.counts, PairOf: w.pairOf, SlotOf: w.slotOf,
		Tokens: all, TopK: K, Experts: E, MaxRows: all, Dim: D}
	if err := g.kk.MoELayout(c, g.s, m); err != nil {
		return err
	}
	if err := g.runHeld(c, e, m, w.xAll); err != nil {
		return err
	}
	// The shared experts of this rank's rows, in its block of shareAll (the others zero),
	// so that the combine adds them to its own rows' partial alone.
	if err := c.MemsetAsync(w.shareAll, 0, int64(4*all*D), g.s); err != nil {
		return fmt.Errorf("gpu: dp: %w", err)
	}
	if n > 0 {
		if err := g.mlp(c, &e.shared, off(w.shareAll, p.rank*rows*D), x, n); err != nil {
			return err
		}
	}
	if err := g.kk.MoECombine(c, g.s, m, w.outAll, w.ye, w.shareAll); err != nil {
		return err
	}
	// Rank r's rows of the ranks' partials, summed (NCCL's fixed order: reproducible).
	if err := p.comm.ReduceScatter(w.outAll, out, rows*D, cudart.F32, cudart.Sum, g.s); err != nil {
		return fmt.Errorf("gpu: dp: sum the ranks' partials of this rank's rows: %w", err)
	}
	return nil
}

// moeA2A is moeDP by the all-to-all dispatch, as deepseek-v4-flash's forwardA2A
// (gpurunner.PlanAllToAll): the rank routes its n rows and copies their routes back to
// plan which rows go to which rank, the counts exchanged over the host communicator; the
// rows, routes and weights go to their experts' ranks over NCCL, each rank runs its
// experts over the rows it received and sends the partials back, and MoECombine sums each
// row's partials (the returned rows as its "experts") and its shared experts. An idle
// rank (n 0) sends nothing and still serves the rows it receives.
func (g *gpuModel) moeA2A(c *cudart.Ctx, e *gpuMoE, out, x cudart.DevicePtr, n int) error {
	cfg, w, p := g.m.Config, &g.w, g.par
	E, K, D := cfg.NRoutedExperts, cfg.NumExpertsPerTok, cfg.HiddenSize
	if n > g.workRows() {
		return fmt.Errorf("gpu: dp rank %d: %d rows for a workspace of %d", p.rank, n, g.workRows())
	}
	ids := make([]int32, n*K)
	if n > 0 {
		if err := g.route(c, e, x, n); err != nil {
			return err
		}
	}
	// The stream's work done (the routes, and every earlier reader of the tables below).
	if err := c.Sync(g.s); err != nil {
		return err
	}
	if n > 0 {
		if err := cudart.Download(c, ids, w.rids); err != nil {
			return err
		}
	}
	plan, err := gpurunner.PlanAllToAll(p.rank, ids, n, K, p.ranges)
	if err != nil {
		return err
	}
	if err := plan.ExchangeCounts(p.host); err != nil {
		return fmt.Errorf("gpu: dp rank %d: %w", p.rank, err)
	}
	sent, recvd, all := plan.Sent(), plan.Received(), p.size*g.workRows()
	if sent > all || recvd > all {
		return fmt.Errorf("gpu: dp rank %d: the all-to-all sends %d rows and receives %d, room for %d", p.rank, sent, recvd, all)
	}
	for _, u := range []struct {
		dst cudart.DevicePtr
		v   []int32
	}{{w.sendIdx, plan.SendIdx}, {w.combIDs, plan.CombineIDs}, {w.combSlots, plan.CombineSlots}} {
		if len(u.v) > 0 {
			if err := cudart.Upload(c, u.dst, u.v); err != nil {
				return err
			}
		}
	}
	if n > 0 {
		if err := cudart.Upload(c, w.combW, plan.CombineWeights); err != nil {
			return err
		}
	}
	if sent > 0 {
		// The rows to send, gathered by index (the embedding kernel, x and the routes as
		// its tables; ids travel as their bits).
		for _, gt := range []struct {
			dst, table cudart.DevicePtr
			dim        int
		}{{w.xs, x, D}, {w.idsS, w.rids, K}, {w.wS, w.rweights, K}} {
			if err := g.kk.Embedding(c, g.s, gt.dst, gt.table, w.sendIdx, sent, gt.dim, n); err != nil {
				return err
			}
		}
	}
	for _, ex := range []struct {
		send, recv cudart.DevicePtr
		width      int
	}{{w.xs, w.xAll, D}, {w.idsS, w.idsAll, K}, {w.wS, w.wAll, K}} {
		if err := gpurunner.ExchangeRows(p.comm, c, g.s, ex.send, ex.recv, plan.SendCounts, plan.RecvCounts, 4*ex.width); err != nil {
			return fmt.Errorf("gpu: dp rank %d: send the rows to their experts' ranks: %w", p.rank, err)
		}
	}
	if recvd > 0 {
		m := cuda.MaskedMoE{IDs: w.idsAll, Weights: w.wAll, Counts: w.counts, PairOf: w.pairOf, SlotOf: w.slotOf,
			Tokens: recvd, TopK: K, Experts: E, MaxRows: recvd, Dim: D}
		if err := g.kk.MoELayout(c, g.s, m); err != nil {
			return err
		}
		if err := g.runHeld(c, e, m, w.xAll); err != nil {
			return err
		}
		if err := g.kk.MoECombine(c, g.s, m, w.outAll, w.ye, 0); err != nil {
			return err
		}
	}
	if err := gpurunner.ExchangeRows(p.comm, c, g.s, w.outAll, w.back, plan.RecvCounts, plan.SendCounts, 4*D); err != nil {
		return fmt.Errorf("gpu: dp rank %d: return the partials: %w", p.rank, err)
	}
	if n == 0 {
		return nil
	}
	if err := g.mlp(c, &e.shared, w.share, x, n); err != nil {
		return err
	}
	back := cuda.MaskedMoE{IDs: w.combIDs, Weights: w.combW, SlotOf: w.combSlots, Tokens: n, TopK: p.size, Experts: max(sent, 1), MaxRows: 1, Dim: D}
	return g.kk.MoECombine(c, g.s, back, out, w.back, w.share)
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
// layers' exchanges.
func (r *GPURunner) DPForward(p *engine.BatchPlan, logits []float32) error {
	par := r.g.par
	if par == nil || !par.dp {
		return fmt.Errorf("%s on the GPU: DPForward on a runner not opened for DP-attention (OpenGPUDPRanks)", Name)
	}
	rows, err := gpurunner.DPRows(Name, p, logits, par.rank, par.size, r.g.maxTokens)
	if err != nil {
		return err
	}
	par.dpRows = rows
	if p.NumTokens() > 0 {
		return r.forward(p, logits)
	}
	return r.dev.Do(r.g.idleDP)
}

// GPUDPRanks are the dp ranks OpenGPUDPRanks opens, one GPURunner and device pool each,
// and the NCCL communicator their MoE layers exchange rows on.
type GPUDPRanks struct {
	*gpurunner.DPRanks[*GPURunner]
}

// OpenGPUDPRanks opens len(data) dp ranks of the text model in dir (OpenGPULayout's
// directory: a checkpoint, of which each rank reads its experts, or a config for the
// seeded random weights, built once and cut) for DP-attention on the GPU with the gather
// dispatch (the only one the GPU runs): rank r on GPU opts.Ordinal+r where the driver
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
	switch {
	case size < 2:
		return fail(errors.New("want 2 or more ranks"))
	case d != DispatchGather && d != DispatchAllToAll:
		return fail(fmt.Errorf("dispatch %d", d))
	}
	for r, comm := range data {
		if comm.Rank() != r || comm.Size() != size {
			return fail(fmt.Errorf("rank %d has a communicator of rank %d of %d", r, comm.Rank(), comm.Size()))
		}
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
	}, func(run *GPURunner, comm *cudart.Comm) { run.g.par.comm = comm })
	if err != nil {
		return fail(err)
	}
	g := &GPUDPRanks{ranks}
	if opts.Log != nil {
		fmt.Fprintf(opts.Log, "%s GPU DP-attention over %d ranks (experts %v), eager steps: %s\n", Name, size, g.Experts(), g.Runners[0].Describe())
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
