package deepseekv4flash

import (
	"fmt"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/gpurunner"
	"github.com/resin-llm/resin/core/kernels/cuda"
)

// gpuArena is device memory allocated for one purpose and freed together.
type gpuArena struct{ bufs []cudart.Buffer }

// alloc returns n bytes of device memory (at least 4).
func (a *gpuArena) alloc(c *cudart.Ctx, n int) (cudart.DevicePtr, error) {
	b, err := c.Alloc(int64(max(n, 4)))
	if err != nil {
		return 0, err
	}
	a.bufs = append(a.bufs, b)
	return b.Ptr, nil
}

// upload copies v into new device memory.
func upload[T any](a *gpuArena, c *cudart.Ctx, v []T, size int) (cudart.DevicePtr, error) {
	p, err := a.alloc(c, size*len(v))
	if err != nil || len(v) == 0 {
		return p, err
	}
	return p, cudart.Upload(c, p, v)
}

// free releases the arena's memory.
func (a *gpuArena) free(c *cudart.Ctx) {
	for _, b := range a.bufs {
		c.Free(b)
	}
	a.bufs = nil
}

// gpuMoE is one layer's MoE on the device: the GEMM weights in gpuLinears' element type
// (the checkpoint's FP8 and FP4 tensors dequantised at load by core/weights, then stored
// as float32 or bf16: a first cut) or, from newGPUMoE's packed tensors, MXFP4 expert
// banks and FP8 linears as shipped; the router's bias in float32, routed through
// core/kernels/cuda's masked layout so that no count leaves the device.
type gpuMoE struct {
	router, bias, tid2eid  cudart.DevicePtr // [experts, hidden], [experts] (learned), [vocab, k] int32 (hash)
	gateUp, down           cudart.DevicePtr // [experts, 2·inter, hidden], [experts, hidden, inter]
	sharedGateUp, sharedDn cudart.DevicePtr // [2·inter, hidden] (gate rows then up), [hidden, inter]
	experts, k, h, in      int
	sin                    int // the shared expert's intermediate columns (in but under TP × EP)
	scoring                cuda.RouteScoring
	scale, limit           float32
	// par, in a parallel layout, is the rank's part: under EP gateUp and down hold its
	// experts alone (held), the routing and the shared expert the model's; under TP every
	// expert's and the shared expert's columns of the rank (in is the rank config's);
	// under TP × EP its experts whole and its columns of the shared expert (sin).
	par *gpuPar
}

// newGPUMoE uploads layer l's MoE. Hash routing's table is checked here, once: the
// kernels take its ids as they are.
//
// With pk, routed experts the checkpoint stores as MXFP4 stay packed (one W4A16 bank per
// projection), and FP8 linears (the shared expert's, its gate and up stacked when the
// gate fills whole 128-row scale blocks) stay FP8. With par (expert parallelism), l holds
// the rank's experts alone.
func newGPUMoE(a *gpuArena, c *cudart.Ctx, lin *gpuLinears, cfg *Config, l *Layer, kind string, pk *gpuPacked, par *gpuPar) (*gpuMoE, error) {
	e, k, h, in := cfg.NRoutedExperts, cfg.NumExpertsPerTok, cfg.HiddenSize, cfg.MoEIntermediateSize
	g := &gpuMoE{experts: e, k: k, h: h, in: in, sin: in, scale: float32(cfg.RoutedScalingFactor), limit: float32(cfg.SwigluLimit), par: par}
	if par != nil {
		// A rank's part (no packed tensors under a layout: the host copies are its).
		g.sin = len(l.SharedGate) / h
		if lo, hi := g.held(); len(l.GateUp) != (hi-lo)*2*in*h || len(l.Down) != (hi-lo)*h*in {
			return nil, fmt.Errorf("gpu moe: %d and %d values of routed experts, want experts [%d, %d)", len(l.GateUp), len(l.Down), lo, hi)
		}
	}
	if cfg.ScoringFunc == "sigmoid" {
		g.scoring = cuda.ScoreSigmoidGate
	}
	if !(g.limit > 0) {
		return nil, fmt.Errorf("gpu moe: swiglu_limit %g must be positive", g.limit)
	}
	var err error
	up := func(dst *cudart.DevicePtr, v *[]float32) {
		if err == nil {
			*dst, err = lin.fieldWeights(a, c, pk, v)
		}
	}
	bank := func(dst *cudart.DevicePtr, v *[]float32) {
		if err != nil {
			return
		}
		if lin.q != nil {
			p, ok, perr := pk.mxfp4(v)
			if err = perr; err == nil && ok {
				*dst, err = lin.mxfp4Weights(a, c, p)
				return
			}
		}
		if err == nil {
			*dst, err = lin.weights(a, c, *v)
		}
	}
	up(&g.router, &l.Router)
	bank(&g.gateUp, &l.GateUp)
	bank(&g.down, &l.Down)
	if err = g.upSharedGateUp(a, c, lin, pk, l); err != nil {
		return nil, fmt.Errorf("gpu moe: %w", err)
	}
	up(&g.sharedDn, &l.SharedDown)
	if kind == HashMoE {
		for i, id := range l.Tid2Eid {
			if id < 0 || int(id) >= e {
				return nil, fmt.Errorf("gpu moe: tid2eid routes token %d to expert %d of %d", i/k, id, e)
			}
		}
		if err == nil {
			g.tid2eid, err = upload(a, c, l.Tid2Eid, 4)
		}
	} else {
		if err == nil {
			g.bias, err = upload(a, c, l.RouteBias, 4)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("gpu moe: %w", err)
	}
	return g, nil
}

// upSharedGateUp uploads the shared expert's gate and up as one [2·inter, hidden] weight:
// FP8 as stored when both are and the gate fills whole scale blocks (gpurunner.StackFP8), else float.
func (g *gpuMoE) upSharedGateUp(a *gpuArena, c *cudart.Ctx, lin *gpuLinears, pk *gpuPacked, l *Layer) error {
	var err error
	if lin.q != nil {
		gate, okG, err := pk.fp8(&l.SharedGate)
		if err != nil {
			return err
		}
		upw, okU, err := pk.fp8(&l.SharedUp)
		if err != nil {
			return err
		}
		if okG && okU {
			if p, serr := gpurunner.StackFP8(gate, upw); serr == nil {
				g.sharedGateUp, err = lin.fp8Weights(a, c, p)
				return err
			}
		}
	}
	g.sharedGateUp, err = lin.weights(a, c, append(append([]float32(nil), l.SharedGate...), l.SharedUp...))
	return err
}

// moeWork is the MoE's device workspace for steps of up to maxTokens rows: a step of n
// rows gives every expert room for all n (the masked layout drops nothing), so the xe,
// gate_up and ye blocks hold experts·maxTokens rows (xe, gate_up and act those of the
// experts held under expert parallelism; ye every expert's, the others' zeroed) and a step's expert GEMMs run over
// experts·n; a first cut that suits decode batches and small prefill chunks (a prefill of
// n rows does experts/top-k times the routed work it needs).
//
// Under DP-attention (gpu_dp.go) the masked layout runs over the rows of every rank
// (up to ranks·maxTokens of them), exchanged by dp (gpurunner.DPMoE, which holds the
// exchange's own buffers).
type moeWork struct {
	maxTokens                                 int
	logits, weights, ids, counts, pairOf      cudart.DevicePtr
	slotOf, xe, gu, act, ye, sgu, sact, share cudart.DevicePtr
	dp                                        *gpurunner.DPMoE
	// a2aOut: under expert parallelism with the all-to-all dispatch, the ranks' shares of
	// the step's output rows, all-gathered (forwardA2A).
	a2aOut cudart.DevicePtr
}

// newMoEWork allocates g's workspace for steps of up to maxTokens rows of each of ranks
// ranks (1 but under DP-attention).
func newMoEWork(a *gpuArena, c *cudart.Ctx, g *gpuMoE, maxTokens, ranks int) (*moeWork, error) {
	e, k, h, in, n := g.experts, g.k, g.h, g.in, maxTokens
	all := n * ranks // the masked layout's rows
	lo, hi := g.held()
	he := hi - lo
	w := &moeWork{maxTokens: n}
	sizes := []struct {
		dst   *cudart.DevicePtr
		bytes int
	}{
		{&w.logits, 4 * n * e}, {&w.weights, 4 * n * k}, {&w.ids, 4 * n * k}, {&w.counts, 4 * e},
		{&w.pairOf, 4 * e * all}, {&w.slotOf, 4 * all * k}, {&w.xe, 4 * he * all * h}, {&w.gu, 4 * he * all * 2 * in},
		{&w.act, 4 * he * all * in}, {&w.ye, 4 * e * all * h}, {&w.sgu, 4 * n * 2 * g.sin}, {&w.sact, 4 * n * g.sin},
		{&w.share, 4 * n * h},
	}
	for _, s := range sizes {
		p, err := a.alloc(c, s.bytes)
		if err != nil {
			return nil, fmt.Errorf("gpu moe workspace: %w", err)
		}
		*s.dst = p
	}
	if p := g.par; p != nil && (p.dp || p.allToAll) {
		var err error
		rows := n // a dp rank's own rows
		if !p.dp {
			rows = (n + p.size - 1) / p.size // a rank's share of the step's (forwardA2A)
		}
		w.dp, err = gpurunner.NewDPMoE(gpurunner.DPMoE{Rank: p.rank, Size: p.size, Experts: e, TopK: k, Hidden: h, MaxRows: rows,
			IDs: w.ids, Weights: w.weights, Counts: w.counts, PairOf: w.pairOf, SlotOf: w.slotOf, YE: w.ye},
			p.allToAll, p.host, func(bytes int) (cudart.DevicePtr, error) { return a.alloc(c, bytes) })
		if err != nil {
			return nil, err
		}
		if !p.dp { // the shares' outputs, all-gathered (forwardA2A)
			share := (n + p.size - 1) / p.size
			if w.a2aOut, err = a.alloc(c, 4*p.size*share*h); err != nil {
				return nil, fmt.Errorf("gpu moe workspace: %w", err)
			}
		}
	}
	return w, nil
}

// forward computes out [n, hidden] = the MoE of x [n, hidden] (tokens [n] int32, for hash
// routing), as Model.moe: the router GEMM, the routing and the masked layout on the
// device, the experts' gate_up and down GEMMs (expertsMatMulT: a GEMM per expert over
// its whole block of n rows, or one W4A16 launch for an MXFP4 bank), the
// clamped SwiGLU, the shared expert, and the combine in the reference's order. The launch
// sequence depends only on n, so it can be captured in a graph.
func (g *gpuMoE) forward(c *cudart.Ctx, s *cudart.Stream, kk *cuda.Kernels, b *gpuLinears, w *moeWork, out, x, tokens cudart.DevicePtr, n int) error {
	if n <= 0 || n > w.maxTokens {
		return fmt.Errorf("gpu moe: %d rows for a workspace of %d", n, w.maxTokens)
	}
	if g.par != nil && g.par.dp {
		return g.forwardDP(c, s, kk, b, w, out, x, tokens, n)
	}
	if g.par != nil && g.par.allToAll {
		return g.forwardA2A(c, s, kk, b, w, out, x, tokens, n)
	}
	e, k, h, mr := g.experts, g.k, g.h, n // every expert has room for all n rows
	if err := g.route(c, s, kk, b, w, x, tokens, n); err != nil {
		return err
	}
	m := cuda.MaskedMoE{IDs: w.ids, Weights: w.weights, Counts: w.counts, PairOf: w.pairOf, SlotOf: w.slotOf,
		Tokens: n, TopK: k, Experts: e, MaxRows: mr, Dim: h}
	if err := kk.MoELayout(c, s, m); err != nil {
		return err
	}
	if err := g.runHeld(c, s, kk, b, w, m, x); err != nil {
		return err
	}
	if g.par != nil && g.par.tp <= 1 && g.par.rank > 0 {
		// Expert parallelism alone: the shared expert runs on rank 0 alone (under TP each
		// rank runs its columns of it).
		if err := kk.MoECombine(c, s, m, out, w.ye, 0); err != nil {
			return err
		}
		return g.sumOverRanks(s, out, n)
	}
	if err := g.shared(c, s, kk, b, w, w.share, x, n); err != nil {
		return err
	}
	if err := kk.MoECombine(c, s, m, out, w.ye, w.share); err != nil {
		return err
	}
	return g.sumOverRanks(s, out, n)
}

// forwardA2A is forward under expert parallelism with the all-to-all dispatch: every
// rank holds the step's n rows alike; rank r takes its share, rows [r·t, r·t+t) of t =
// ⌈n/size⌉ (the last shares shorter, or empty), sends each of them to the ranks holding
// its routed experts and sums what they return with its shared expert (gpurunner.DPMoE's
// all-to-all, as a dp rank's own rows), and the shares' outputs are all-gathered in rank
// order, t rows each, so that rows [0, n) of the gathered buffer are out's (under TP × EP
// summed instead, with the shared expert's column partials). It plans its sends on the
// host each layer: its steps run eagerly.
func (g *gpuMoE) forwardA2A(c *cudart.Ctx, s *cudart.Stream, kk *cuda.Kernels, b *gpuLinears, w *moeWork, out, x, tokens cudart.DevicePtr, n int) error {
	p, h := g.par, g.h
	t := (n + p.size - 1) / p.size
	lo := min(p.rank*t, n)
	mine := min(lo+t, n) - lo
	xs, ts := x+cudart.DevicePtr(4*lo*h), tokens+cudart.DevicePtr(4*lo)
	if p.tp > 1 {
		// TP × EP (equal): each rank holds its columns of the shared expert, so its share's
		// outputs are partial too. out holds the rank's shared partial of every row, its
		// share's rows then its routed sums plus the same partial, and the ranks' outs are
		// summed: each row's routed experts once (its owner's), the shared expert's columns
		// of every rank.
		if err := g.shared(c, s, kk, b, w, out, x, n); err != nil {
			return err
		}
		if err := g.forwardShare(c, s, kk, b, w, out+cudart.DevicePtr(4*lo*h), xs, ts, mine); err != nil {
			return err
		}
		return g.sumOverRanks(s, out, n)
	}
	share := w.a2aOut + cudart.DevicePtr(4*p.rank*t*h)
	if err := g.forwardShare(c, s, kk, b, w, share, xs, ts, mine); err != nil {
		return err
	}
	if err := p.comm.AllGather(share, w.a2aOut, t*h, cudart.F32, s); err != nil {
		return fmt.Errorf("gpu moe: all-to-all: gather the shares' outputs: %w", err)
	}
	return c.CopyDtoDAsync(out, w.a2aOut, int64(4*n*h), s)
}

// forwardShare computes out [m, hidden] for this rank's share of a step's rows, x's m rows
// (tokens their ids; 0 rows on a rank without a share) by the all-to-all exchange: each
// row sent to its routed experts' ranks, what they return summed with the shared
// expert's (forwardA2A's shares; a split step's chunk under CP over the ep ranks, moeCP).
func (g *gpuMoE) forwardShare(c *cudart.Ctx, s *cudart.Stream, kk *cuda.Kernels, b *gpuLinears, w *moeWork, out, x, tokens cudart.DevicePtr, m int) error {
	f := gpurunner.DPMoEFuncs{
		Route:   func(m int) error { return g.route(c, s, kk, b, w, x, tokens, m) },
		Experts: func(m cuda.MaskedMoE, x cudart.DevicePtr) error { return g.runHeld(c, s, kk, b, w, m, x) },
		Shared:  func(dst cudart.DevicePtr, m int) error { return g.shared(c, s, kk, b, w, dst, x, m) },
	}
	return w.dp.Forward(c, s, kk, f, out, x, m, m)
}

// route computes the routes of x's n rows (tokens [n] int32, for hash routing) into
// w.ids and w.weights: the router GEMM and MoERoute.
func (g *gpuMoE) route(c *cudart.Ctx, s *cudart.Stream, kk *cuda.Kernels, b *gpuLinears, w *moeWork, x, tokens cudart.DevicePtr, n int) error {
	if err := b.matMulT(c, s, w.logits, x, g.router, n, g.h, g.experts); err != nil {
		return err
	}
	return kk.MoERoute(c, s, cuda.MoERoute{Weights: w.weights, IDs: w.ids, Logits: w.logits, Bias: g.bias, TID2EID: g.tid2eid, TokenIDs: tokens,
		Tokens: n, Experts: g.experts, TopK: g.k, Scoring: g.scoring, Scale: g.scale})
}

// shared computes the shared expert of x's n rows into dst ([n, hidden]).
func (g *gpuMoE) shared(c *cudart.Ctx, s *cudart.Stream, kk *cuda.Kernels, b *gpuLinears, w *moeWork, dst, x cudart.DevicePtr, n int) error {
	if err := b.matMulT(c, s, w.sgu, x, g.sharedGateUp, n, g.h, 2*g.sin); err != nil {
		return err
	}
	if err := kk.SwiGLUClamped(c, s, w.sact, w.sgu, n, g.sin, g.limit); err != nil {
		return err
	}
	return b.matMulT(c, s, dst, w.sact, g.sharedDn, n, g.sin, g.h)
}

// runHeld runs the held experts (all but under expert parallelism) over the masked
// layout m of x, after MoELayout: their blocks gathered into xe, gate_up, the clamped
// SwiGLU, down into their blocks of ye. xe, gu and act hold the held experts' blocks
// alone, ye every expert's, the other ranks' zeroed; counts are offset to them.
func (g *gpuMoE) runHeld(c *cudart.Ctx, s *cudart.Stream, kk *cuda.Kernels, b *gpuLinears, w *moeWork, m cuda.MaskedMoE, x cudart.DevicePtr) error {
	h, in, mr := g.h, g.in, m.MaxRows
	lo, hi := g.held()
	if err := g.zeroOthers(c, s, w.ye, mr); err != nil {
		return err
	}
	if hi == lo {
		return nil
	}
	held := m
	held.PairOf, held.Experts = w.pairOf+cudart.DevicePtr(4*lo*mr), hi-lo
	counts := w.counts + cudart.DevicePtr(4*lo)
	if err := kk.MoEGather(c, s, held, w.xe, x); err != nil {
		return err
	}
	if err := b.expertsMatMulT(c, s, w.gu, w.xe, counts, g.gateUp, hi-lo, mr, h, 2*in); err != nil {
		return err
	}
	if err := kk.SwiGLUClamped(c, s, w.act, w.gu, (hi-lo)*mr, in, g.limit); err != nil {
		return err
	}
	return b.expertsMatMulT(c, s, w.ye+cudart.DevicePtr(4*lo*mr*h), w.act, counts, g.down, hi-lo, mr, in, h)
}
