package deepseekv4flash

import (
	"cmp"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/gpurunner"
	"github.com/resin-llm/resin/core/kernels/cuda"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/core/weights"
)

// DP-attention on the GPU, as SGLang's --enable-dp-attention with --ep N on one node:
// each dp rank is a GPURunner on a device of its own with an engine and a device pool of
// its own (core/dist/dp's Group steps them together), attending only its own plan's
// rows with the replicated weights (embedding, attention, mHC, router, shared expert,
// lm_head); its MoE layers run expert-parallel over the dp group, each rank holding its
// range of the routed experts. The exchange is the gather dispatch on NCCL: every rank
// pads its rows to the step's row count (the most any rank has, or DPStep.Pad) with
// zero rows routed to no expert, the ranks all-gather their rows, routes and
// weights, each runs its experts over every rank's rows in the masked layout (its own
// rows' shared expert in its block), and a reduce-scatter hands each rank the sum of the
// ranks' partials for its own rows. A rank with no work (an idle plan) runs the MoE
// layers' collectives alone, with padding rows. Steps run eagerly (a captured graph
// would fix the row count), the all-to-all dispatch and MTP drafts under DP-attention are
// not built on the GPU (the CPU runs both: dp.go).

// forwardDP is forward under DP-attention: out [n, hidden] for this rank's n rows of x
// (0 on an idle rank), exchanged with the other ranks' as the comment above says, at
// par.dpRows rows a rank.
func (g *gpuMoE) forwardDP(c *cudart.Ctx, s *cudart.Stream, kk *cuda.Kernels, b *gpuLinears, w *moeWork, out, x, tokens cudart.DevicePtr, n int) error {
	p := g.par
	if p.allToAll {
		return g.forwardA2A(c, s, kk, b, w, out, x, tokens, n)
	}
	rows := p.dpRows
	switch {
	case rows < max(n, 1) || rows > w.maxTokens:
		return fmt.Errorf("gpu moe: dp rank %d: %d rows padded to %d, for a workspace of %d a rank", p.rank, n, rows, w.maxTokens)
	case p.comm == nil:
		return fmt.Errorf("gpu moe: the dp ranks' NCCL communicator is not joined (OpenGPUDPRanks)")
	}
	e, k, h := g.experts, g.k, g.h
	all := p.size * rows
	if n > 0 {
		if err := b.matMulT(c, s, w.logits, x, g.router, n, h, e); err != nil {
			return err
		}
		r := cuda.MoERoute{Weights: w.weights, IDs: w.ids, Logits: w.logits, Bias: g.bias, TID2EID: g.tid2eid, TokenIDs: tokens,
			Tokens: n, Experts: e, TopK: k, Scoring: g.scoring, Scale: g.scale}
		if err := kk.MoERoute(c, s, r); err != nil {
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
		}{{x, 0, h}, {w.ids, 0xff, k}, {w.weights, 0, k}} {
			if err := c.MemsetAsync(z.p+cudart.DevicePtr(4*n*z.cols), z.v, int64(4*pad*z.cols), s); err != nil {
				return fmt.Errorf("gpu moe: dp: pad the rows: %w", err)
			}
		}
	}
	gathers := []struct {
		send, recv cudart.DevicePtr
		count      int
		t          cudart.DType
		what       string
	}{{x, w.xAll, rows * h, cudart.F32, "rows"}, {w.ids, w.idsAll, 4 * rows * k, cudart.Bytes, "routes"}, {w.weights, w.wAll, rows * k, cudart.F32, "route weights"}}
	for _, gt := range gathers {
		if err := p.comm.AllGather(gt.send, gt.recv, gt.count, gt.t, s); err != nil {
			return fmt.Errorf("gpu moe: dp: gather the ranks' %s: %w", gt.what, err)
		}
	}
	m := cuda.MaskedMoE{IDs: w.idsAll, Weights: w.wAll, Counts: w.counts, PairOf: w.pairOf, SlotOf: w.slotOf,
		Tokens: all, TopK: k, Experts: e, MaxRows: all, Dim: h}
	if err := kk.MoELayout(c, s, m); err != nil {
		return err
	}
	if err := g.runHeld(c, s, kk, b, w, m, w.xAll); err != nil {
		return err
	}
	// The shared expert of this rank's rows, in its block of shareAll (the others zero),
	// so that the combine adds it to its own rows' partial alone.
	if err := c.MemsetAsync(w.shareAll, 0, int64(4*all*h), s); err != nil {
		return fmt.Errorf("gpu moe: dp: %w", err)
	}
	if n > 0 {
		if err := b.matMulT(c, s, w.sgu, x, g.sharedGateUp, n, h, 2*g.sin); err != nil {
			return err
		}
		if err := kk.SwiGLUClamped(c, s, w.sact, w.sgu, n, g.sin, g.limit); err != nil {
			return err
		}
		if err := b.matMulT(c, s, w.shareAll+cudart.DevicePtr(4*p.rank*rows*h), w.sact, g.sharedDn, n, g.sin, h); err != nil {
			return err
		}
	}
	if err := kk.MoECombine(c, s, m, w.outAll, w.ye, w.shareAll); err != nil {
		return err
	}
	// Rank r's rows of the ranks' partials, summed (NCCL's fixed order: reproducible).
	if err := p.comm.ReduceScatter(w.outAll, out, rows*h, cudart.F32, cudart.Sum, s); err != nil {
		return fmt.Errorf("gpu moe: dp: sum the ranks' partials of this rank's rows: %w", err)
	}
	return nil
}

// forwardA2A is forwardDP by the all-to-all dispatch (gpurunner.PlanAllToAll): the
// rank routes its n rows, copies their routes back to plan which rows go to which rank
// (a row once to each rank holding one of its experts) and exchanges the counts over the
// host communicator; the rows, their routes and weights then go to those ranks (NCCL
// sends and receives), each rank runs its experts over the rows it received in the
// masked layout (the other ranks' experts' blocks zeroed, so a row's partial is its
// experts' weighted sum there) and sends the partials back, and the rank sums each row's
// partials and its shared expert with MoECombine, the returned rows as its "experts".
// An idle rank (n 0) sends nothing and still serves the rows it receives.
func (g *gpuMoE) forwardA2A(c *cudart.Ctx, s *cudart.Stream, kk *cuda.Kernels, b *gpuLinears, w *moeWork, out, x, tokens cudart.DevicePtr, n int) error {
	p := g.par
	e, k, h := g.experts, g.k, g.h
	if n > w.maxTokens {
		return fmt.Errorf("gpu moe: dp rank %d: %d rows for a workspace of %d", p.rank, n, w.maxTokens)
	}
	ids := make([]int32, n*k)
	if n > 0 {
		if err := b.matMulT(c, s, w.logits, x, g.router, n, h, e); err != nil {
			return err
		}
		r := cuda.MoERoute{Weights: w.weights, IDs: w.ids, Logits: w.logits, Bias: g.bias, TID2EID: g.tid2eid, TokenIDs: tokens,
			Tokens: n, Experts: e, TopK: k, Scoring: g.scoring, Scale: g.scale}
		if err := kk.MoERoute(c, s, r); err != nil {
			return err
		}
	}
	// The stream's work done (the routes, and every earlier reader of the tables below).
	if err := c.Sync(s); err != nil {
		return err
	}
	if n > 0 {
		if err := cudart.Download(c, ids, w.ids); err != nil {
			return err
		}
	}
	plan, err := gpurunner.PlanAllToAll(p.rank, ids, n, k, p.ranges)
	if err != nil {
		return err
	}
	if err := plan.ExchangeCounts(p.host); err != nil {
		return fmt.Errorf("gpu moe: dp rank %d: %w", p.rank, err)
	}
	sent, recvd, all := plan.Sent(), plan.Received(), p.size*w.maxTokens
	if sent > all || recvd > all {
		return fmt.Errorf("gpu moe: dp rank %d: the all-to-all sends %d rows and receives %d, room for %d", p.rank, sent, recvd, all)
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
		// The rows to send, gathered by index (the embedding kernel, x and the routes
		// as its tables; ids travel as their bits).
		for _, gt := range []struct {
			dst, table cudart.DevicePtr
			dim        int
		}{{w.xs, x, h}, {w.idsS, w.ids, k}, {w.wS, w.weights, k}} {
			if err := kk.Embedding(c, s, gt.dst, gt.table, w.sendIdx, sent, gt.dim, n); err != nil {
				return err
			}
		}
	}
	for _, ex := range []struct {
		send, recv cudart.DevicePtr
		width      int
	}{{w.xs, w.xAll, h}, {w.idsS, w.idsAll, k}, {w.wS, w.wAll, k}} {
		if err := gpurunner.ExchangeRows(p.comm, c, s, ex.send, ex.recv, plan.SendCounts, plan.RecvCounts, 4*ex.width); err != nil {
			return fmt.Errorf("gpu moe: dp rank %d: send the rows to their experts' ranks: %w", p.rank, err)
		}
	}
	if recvd > 0 {
		m := cuda.MaskedMoE{IDs: w.idsAll, Weights: w.wAll, Counts: w.counts, PairOf: w.pairOf, SlotOf: w.slotOf,
			Tokens: recvd, TopK: k, Experts: e, MaxRows: recvd, Dim: h}
		if err := kk.MoELayout(c, s, m); err != nil {
			return err
		}
		if err := g.runHeld(c, s, kk, b, w, m, w.xAll); err != nil {
			return err
		}
		if err := kk.MoECombine(c, s, m, w.outAll, w.ye, 0); err != nil {
			return err
		}
	}
	if err := gpurunner.ExchangeRows(p.comm, c, s, w.outAll, w.back, plan.RecvCounts, plan.SendCounts, 4*h); err != nil {
		return fmt.Errorf("gpu moe: dp rank %d: return the partials: %w", p.rank, err)
	}
	if n == 0 {
		return nil
	}
	if err := b.matMulT(c, s, w.sgu, x, g.sharedGateUp, n, h, 2*g.sin); err != nil {
		return err
	}
	if err := kk.SwiGLUClamped(c, s, w.sact, w.sgu, n, g.sin, g.limit); err != nil {
		return err
	}
	if err := b.matMulT(c, s, w.share, w.sact, g.sharedDn, n, g.sin, h); err != nil {
		return err
	}
	back := cuda.MaskedMoE{IDs: w.combIDs, Weights: w.combW, SlotOf: w.combSlots, Tokens: n, TopK: p.size, Experts: max(sent, 1), MaxRows: 1, Dim: h}
	return kk.MoECombine(c, s, back, out, w.back, w.share)
}

// idleDP is an idle dp rank's step: every MoE layer's exchange with padding rows alone.
func (g *gpuModel) idleDP(c *cudart.Ctx) error {
	w := &g.w
	for li := range g.layers {
		if err := g.layers[li].moe.forwardDP(c, g.s, g.kk, g.lin, g.moeW, w.ffn, w.x, w.ids, 0); err != nil {
			return fmt.Errorf("gpu: idle step: layer %d: %w", li, err)
		}
	}
	return c.Synchronize()
}

// DPForward is the forward of a dp rank (a runner of OpenGPUDPRanks) under core/dist/dp's
// Group, as Runner.DPForward on the CPU: p.DP must name this rank of the group. A plan
// with tokens runs as the runner's forward does, its MoE layers exchanging its rows with
// the other ranks' (padded to the most any rank has, or to DP.Pad); an idle plan (no
// tokens, no logits) runs only the MoE layers' exchanges. What it refuses it refuses
// from the step's counts alone, which every rank has alike, so no rank is left waiting
// in a collective.
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

// OpenGPUDPRanks opens len(data) dp ranks of the model in dir (OpenGPULayout's
// directory: a checkpoint, of which each rank reads its experts, or a config for the
// seeded random weights, built once and cut) for DP-attention on the GPU with the gather
// dispatch (the only one the GPU runs): rank r on GPU opts.Ordinal+r where the driver
// sees that many, else every rank on opts.Ordinal, with a device pool of cacheBytes of
// its own (0 = 256 MiB) and, for its model's CPU part, data[r] (the dp group's data
// communicator). Steps run eagerly; opts.Limits apply to every rank. Each rank's forward
// is its runner's DPForward under a core/dist/dp Group. Close closes the devices.
func OpenGPUDPRanks(dir string, cacheBytes int64, opts gpurunner.Options, d Dispatch, data []dist.Communicator) (*GPUDPRanks, error) {
	size := len(data)
	fail := func(err error) (*GPUDPRanks, error) {
		return nil, fmt.Errorf("%s: DP-attention over %d GPUs: %w", Name, size, err)
	}
	switch {
	case size < 2:
		return fail(fmt.Errorf("want 2 or more ranks"))
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
	c, err := LoadConfig(dir)
	if err != nil {
		return fail(err)
	}
	l := Layout{EP: size, Dispatch: d}
	if err := l.Check(c); err != nil {
		return fail(err)
	}
	var whole *Weights
	if ck, err := weights.Open(dir); err == nil {
		ck.Close() // each rank reads its experts
	} else if !errors.Is(err, weights.ErrNotFound) {
		return fail(fmt.Errorf("load %s: %w", dir, err))
	} else {
		what := "seeded random weights of " + filepath.Join(dir, "config.json")
		if err := weights.CheckMemory(WeightBytes(c, false), what); err != nil {
			return fail(fmt.Errorf("load %s: %w (put the checkpoint's safetensors there, or shrink the config)", dir, err))
		}
		whole = RandomWeights(c, 1, false) // Load's seed, so OpenGPU's weights
	}
	ranks, err := gpurunner.OpenDPRanks(Name, opts, size, func(r int, dev *cudart.Device, cache *cudart.KernelCache, lim gpurunner.Limits) (*GPURunner, *kvslab.Pool, error) {
		w, err := loadGPURankWeights(dir, c, l, r, whole)
		if err != nil {
			return nil, nil, err
		}
		run, err := newGPURankRunner(c, l, r, w, data[r], dev, cache, lim.MaxSeqs, lim.MaxTokens, min(lim.MaxRows, lim.MaxTokens), maxContextOf(c, Options{}), 0, true)
		if err != nil {
			return nil, nil, err
		}
		pool, err := run.NewPool(cmp.Or(cacheBytes, 256<<20))
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
