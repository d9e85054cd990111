package glm5flash

import (
	"fmt"
	"math"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/gpurunner"
	"github.com/resin-llm/resin/core/kernels/cuda"
	"github.com/resin-llm/resin/models/glm-5-flash/kernels"
)

// gpuDSA runs the model's MLA layers with DeepSeek sparse attention on one device, in
// fp32: the projections on cuBLASLt, the q_a/kv_a RMSNorms on the core's kernel, the
// indexer and the absorbed sparse MLA on the model's (dsa.cu). It is forward.go's mla and
// index step for step, over a sequence's state in contiguous per-position buffers.
type gpuDSA struct {
	cfg       *TextConfig
	blas      *cudart.Blas
	core      *cuda.Kernels
	ks        *kernels.Kernels
	maxTokens int
	// Workspace for up to maxTokens tokens: qr [T, Q], q [T, H·nope], iq [T, N·I],
	// hw [T, N], score [T, maxPos/P], out [T, H·v]; a batch's new latents [T, R], keys
	// and gates [T, I] before they are scattered to their sequences.
	qr, q, iq, hw, score, out cudart.DevicePtr
	lat, key, gate            cudart.DevicePtr
	maxPos                    int
	bufs                      []cudart.Buffer
	// lin runs the projections the checkpoint stores as FP8 (fp8, by the address the
	// layer holds for them; gpu_fp8.go); nil without.
	lin *gpurunner.Linears
	fp8 map[cudart.DevicePtr]*gpurunner.Linear
}

// gpuDSALayer is one MLA layer's weights on the device; the indexer's are 0 for a layer
// that shares the previous layer's selection.
type gpuDSALayer struct {
	qa, qaNorm, qb, kva, kvaNorm, kvb, o cudart.DevicePtr
	full                                 bool
	wqb, wk, kNormW, kNormB, wProj, ape  cudart.DevicePtr
	gate                                 cudart.DevicePtr
}

// gpuDSAState is a sequence's MLA layer state on the device, by position: latents
// [maxPos, R]; with a full indexer its keys and gate scores [maxPos, I] and the
// completed pools' keys [maxPos/P, I].
type gpuDSAState struct{ Latent, IdxKey, IdxGate, Pools cudart.DevicePtr }

// gpuDSASel is a call's selection on the device: Sel [T, MaxSel] token positions, Count
// [T]. A full-indexer layer writes it; the next, shared, layer reads it.
type gpuDSASel struct {
	Sel, Count cudart.DevicePtr
	MaxSel     int
}

func newGPUDSA(c *cudart.Ctx, cfg *TextConfig, blas *cudart.Blas, core *cuda.Kernels, ks *kernels.Kernels, maxTokens, maxPos int) (*gpuDSA, error) {
	if maxTokens <= 0 || maxPos < maxTokens {
		return nil, fmt.Errorf("gpu dsa: workspace for %d tokens, %d positions", maxTokens, maxPos)
	}
	g := &gpuDSA{cfg: cfg, blas: blas, core: core, ks: ks, maxTokens: maxTokens, maxPos: maxPos}
	for _, b := range []struct {
		p *cudart.DevicePtr
		n int
	}{{&g.qr, cfg.QLoraRank}, {&g.q, cfg.NumAttentionHeads * cfg.QKNopeHeadDim}, {&g.iq, cfg.IndexNHeads * cfg.IndexHeadDim},
		{&g.hw, cfg.IndexNHeads}, {&g.score, max(1, maxPos/cfg.IndexKPool)}, {&g.out, cfg.NumAttentionHeads * cfg.VHeadDim},
		{&g.lat, cfg.KVLoraRank}, {&g.key, cfg.IndexHeadDim}, {&g.gate, cfg.IndexHeadDim}} {
		p, err := g.alloc(c, maxTokens*b.n)
		if err != nil {
			g.close(c)
			return nil, err
		}
		*b.p = p
	}
	return g, nil
}

func (g *gpuDSA) alloc(c *cudart.Ctx, floats int) (cudart.DevicePtr, error) {
	b, err := c.Alloc(int64(4 * floats))
	if err != nil {
		return 0, fmt.Errorf("gpu dsa: %w", err)
	}
	g.bufs = append(g.bufs, b)
	return b.Ptr, nil
}

func (g *gpuDSA) close(c *cudart.Ctx) {
	for _, b := range g.bufs {
		c.Free(b)
	}
	g.bufs = nil
}

// maxSel is the selection row length: index_topk tokens and the incomplete tail.
func (g *gpuDSA) maxSel() int {
	c := g.cfg
	return kernels.PoolTopKSel(c.IndexPools(), c.IndexKPool, c.IndexKPoolSelectTail)
}

// upload copies an MLA layer's weights to the device (freed by close). fp8, when not nil,
// returns the FP8 linear of a projection (its module name under self_attn, [out, in]) or
// nil where the checkpoint does not store it so; those are not uploaded in fp32.
func (g *gpuDSA) upload(c *cudart.Ctx, w *mlaWeights, fp8 func(module string, out, in int) (*gpurunner.Linear, error)) (*gpuDSALayer, error) {
	cfg := g.cfg
	D, Q := cfg.HiddenSize, cfg.QLoraRank
	l := &gpuDSALayer{full: w.idx != nil}
	type tensor struct {
		p       *cudart.DevicePtr
		h       []float32
		module  string // the FP8-capable projections' name
		out, in int
	}
	ts := []tensor{{&l.qa, w.qa, "q_a_proj", Q, D}, {&l.qaNorm, w.qaNorm, "", 0, 0}, {&l.qb, w.qb, "q_b_proj", len(w.qb) / Q, Q},
		{&l.kva, w.kva, "kv_a_proj_with_mqa", len(w.kva) / D, D}, {&l.kvaNorm, w.kvaNorm, "", 0, 0}, {&l.kvb, w.kvb, "", 0, 0},
		{&l.o, w.o, "o_proj", D, len(w.o) / D}}
	if w.idx != nil {
		ts = append(ts, []tensor{{&l.wqb, w.idx.wqb, "indexer.wq_b", len(w.idx.wqb) / Q, Q}, {&l.wk, w.idx.wk, "indexer.wk", len(w.idx.wk) / D, D},
			{&l.kNormW, w.idx.kNormW, "", 0, 0}, {&l.kNormB, w.idx.kNormB, "", 0, 0}, {&l.wProj, w.idx.wProj, "", 0, 0},
			{&l.ape, w.idx.ape, "", 0, 0}, {&l.gate, w.idx.gate, "", 0, 0}}...)
	}
	for _, t := range ts {
		if fp8 != nil && t.module != "" {
			lw, err := fp8(t.module, t.out, t.in)
			if err != nil {
				return nil, err
			}
			if lw != nil {
				if g.fp8 == nil {
					g.fp8 = map[cudart.DevicePtr]*gpurunner.Linear{}
				}
				*t.p, _ = lw.Weight()
				g.fp8[*t.p] = lw
				continue
			}
		}
		p, err := g.alloc(c, len(t.h))
		if err != nil {
			return nil, err
		}
		if err := cudart.Upload(c, p, t.h); err != nil {
			return nil, fmt.Errorf("gpu dsa: %w", err)
		}
		*t.p = p
	}
	return l, nil
}

// forward runs T tokens at positions pos0.. of x [T, D] through layer l into y [T, D] on
// stream s, appending to st; a full-indexer layer writes its selection into sel, a
// shared one reads the previous layer's from it.
func (g *gpuDSA) forward(c *cudart.Ctx, s *cudart.Stream, l *gpuDSALayer, st gpuDSAState, sel gpuDSASel, x, y cudart.DevicePtr, T, pos0 int) error {
	if err := g.check(sel, T, pos0, T); err != nil {
		return err
	}
	if err := g.queries(c, s, l, x, T); err != nil {
		return err
	}
	R, I := g.cfg.KVLoraRank, g.cfg.IndexHeadDim
	if err := g.keys(c, s, l, x, T, off(st.Latent, pos0*R), off(st.IdxKey, pos0*I), off(st.IdxGate, pos0*I)); err != nil {
		return err
	}
	if err := g.closePools(c, s, l, st, pos0, T); err != nil {
		return err
	}
	return g.attend(c, s, l, st, sel, y, T, pos0)
}

// check refuses T queries (0 or more) at positions from pos0 of a call writing kv rows
// (1 or more) from pos0, or selection rows too short.
func (g *gpuDSA) check(sel gpuDSASel, T, pos0, kv int) error {
	if kv <= 0 || T < 0 || T > g.maxTokens || pos0 < 0 || pos0+max(T, kv) > g.maxPos {
		return fmt.Errorf("gpu dsa: %d tokens at %d (workspace for %d tokens, %d positions)", max(T, kv), pos0, g.maxTokens, g.maxPos)
	}
	if sel.MaxSel < g.maxSel() {
		return fmt.Errorf("gpu dsa: selection rows of %d, want %d", sel.MaxSel, g.maxSel())
	}
	return nil
}

func (g *gpuDSA) mm(c *cudart.Ctx, s *cudart.Stream, out, a, w cudart.DevicePtr, m, k, n int, alpha float32) error {
	return g.matMul(c, s, out, a, w, m, k, n, alpha)
}

// queries computes the query side of T rows of x [T, D]: qr (normed), q and, with a full
// indexer, its queries iq and head weights hw.
func (g *gpuDSA) queries(c *cudart.Ctx, s *cudart.Stream, l *gpuDSALayer, x cudart.DevicePtr, T int) error {
	cfg := g.cfg
	D, H, Q, dn, I, N := cfg.HiddenSize, cfg.NumAttentionHeads, cfg.QLoraRank, cfg.QKNopeHeadDim, cfg.IndexHeadDim, cfg.IndexNHeads
	if err := g.mm(c, s, g.qr, x, l.qa, T, D, Q, 1); err != nil {
		return err
	}
	if err := g.core.RMSNorm(c, s, g.qr, g.qr, l.qaNorm, T, Q, float32(cfg.RMSNormEps)); err != nil {
		return err
	}
	if err := g.mm(c, s, g.q, g.qr, l.qb, T, Q, H*dn, 1); err != nil {
		return err
	}
	if !l.full {
		return nil
	}
	if err := g.mm(c, s, g.iq, g.qr, l.wqb, T, Q, N*I, 1); err != nil {
		return err
	}
	return g.mm(c, s, g.hw, x, l.wProj, T, D, N, float32(math.Pow(float64(N), -0.5)))
}

// keys computes the KV side of T rows of x [T, D] into lat [T, R] (the normed latents)
// and, with a full indexer, keys (normed) and gates [T, I].
func (g *gpuDSA) keys(c *cudart.Ctx, s *cudart.Stream, l *gpuDSALayer, x cudart.DevicePtr, T int, lat, keys, gates cudart.DevicePtr) error {
	cfg := g.cfg
	D, R, I := cfg.HiddenSize, cfg.KVLoraRank, cfg.IndexHeadDim
	if err := g.mm(c, s, lat, x, l.kva, T, D, R, 1); err != nil {
		return err
	}
	if err := g.core.RMSNorm(c, s, lat, lat, l.kvaNorm, T, R, float32(cfg.RMSNormEps)); err != nil {
		return err
	}
	if !l.full {
		return nil
	}
	if err := g.mm(c, s, keys, x, l.wk, T, D, I, 1); err != nil {
		return err
	}
	if err := g.mm(c, s, gates, x, l.gate, T, D, I, 1); err != nil {
		return err
	}
	if err := kernels.Run(g.ks, c, s, kernels.IndexerKeys{K: keys, W: l.kNormW, B: l.kNormB, Rows: T, Dim: I}); err != nil {
		return fmt.Errorf("gpu dsa: %w", err)
	}
	return nil
}

// closePools pools the indexer keys of the pools that positions [pos0, pos0+n) of st
// complete (a full-indexer layer's; st holds those positions' keys and gates).
func (g *gpuDSA) closePools(c *cudart.Ctx, s *cudart.Stream, l *gpuDSALayer, st gpuDSAState, pos0, n int) error {
	P, I := g.cfg.IndexKPool, g.cfg.IndexHeadDim
	j0, j1 := pos0/P, (pos0+n)/P
	if !l.full || j1 <= j0 {
		return nil
	}
	if err := kernels.Run(g.ks, c, s, kernels.KPoolCompress{Pools: st.Pools, Keys: st.IdxKey, Gates: st.IdxGate, APE: l.ape,
		First: j0, End: j1, Pool: P, Dim: I}); err != nil {
		return fmt.Errorf("gpu dsa: %w", err)
	}
	return nil
}

// attend runs queries' T rows (at positions pos0..) over st, which holds every position up
// to theirs: a full indexer's scores and selection into sel (a shared layer reads it),
// the sparse MLA, and o_proj into y [T, D].
func (g *gpuDSA) attend(c *cudart.Ctx, s *cudart.Stream, l *gpuDSALayer, st gpuDSAState, sel gpuDSASel, y cudart.DevicePtr, T, pos0 int) error {
	cfg := g.cfg
	D, H, R := cfg.HiddenSize, cfg.NumAttentionHeads, cfg.KVLoraRank
	dn, dv, I, N, P := cfg.QKNopeHeadDim, cfg.VHeadDim, cfg.IndexHeadDim, cfg.IndexNHeads, cfg.IndexKPool
	if l.full {
		stride := g.maxPos / P
		if err := kernels.Run(g.ks, c, s, kernels.IndexerScores{Score: g.score, Q: g.iq, HW: g.hw, Pools: st.Pools, Tokens: T,
			Pos0: pos0, Pool: P, Heads: N, Dim: I, Stride: stride, DScale: float32(1 / math.Sqrt(float64(I)))}); err != nil {
			return fmt.Errorf("gpu dsa: %w", err)
		}
		if err := kernels.Run(g.ks, c, s, kernels.PoolTopK{Sel: sel.Sel, Count: sel.Count, Score: g.score, Tokens: T, Pos0: pos0,
			Pool: P, K: cfg.IndexPools(), Stride: stride, MaxSel: sel.MaxSel, Tail: cfg.IndexKPoolSelectTail}); err != nil {
			return fmt.Errorf("gpu dsa: %w", err)
		}
	}
	if err := kernels.Run(g.ks, c, s, kernels.SparseMLA{Out: g.out, Q: g.q, KVB: l.kvb, Latent: st.Latent, Sel: sel.Sel, Count: sel.Count,
		Tokens: T, Heads: H, DN: dn, DV: dv, Rank: R, MaxSel: sel.MaxSel, Scale: float32(1 / math.Sqrt(float64(cfg.QKHeadDim)))}); err != nil {
		return fmt.Errorf("gpu dsa: %w", err)
	}
	return g.mm(c, s, y, g.out, l.o, T, H*dv, D, 1)
}

// matMul computes out [m, n] = alpha · a [m, k] · wᵀ: an FP8 linear's (g.fp8, alpha 1)
// through the Linears, else the fp32 GEMM on w [n, k].
func (g *gpuDSA) matMul(c *cudart.Ctx, s *cudart.Stream, out, a, w cudart.DevicePtr, m, k, n int, alpha float32) error {
	if lw := g.fp8[w]; lw != nil {
		if lw.In != k || lw.Out != n || alpha != 1 {
			return fmt.Errorf("gpu dsa: a GEMM of %d×%d (alpha %g) over an fp8 weight [%d, %d]", n, k, alpha, lw.Out, lw.In)
		}
		return g.lin.Forward(c, s, lw, out, a, m)
	}
	return g.blas.Gemm(c, s, cudart.GemmSpec{M: m, N: n, K: k, TransB: true, AType: cudart.F32, BType: cudart.F32,
		OutType: cudart.F32, Alpha: alpha}, a, w, 0, out)
}

// slot returns sequence slot sl's state in pools of per-sequence states (pools' pointers
// at slot 0, maxPos positions a slot).
func (g *gpuDSA) slot(pools gpuDSAState, sl int) gpuDSAState {
	c := g.cfg
	R, I, P := c.KVLoraRank, c.IndexHeadDim, c.IndexKPool
	return gpuDSAState{Latent: off(pools.Latent, sl*g.maxPos*R), IdxKey: off(pools.IdxKey, sl*g.maxPos*I),
		IdxGate: off(pools.IdxGate, sl*g.maxPos*I), Pools: off(pools.Pools, sl*(g.maxPos/P)*I)}
}

// decode runs a batch of rows from several sequences (rows of x [T, D], one a sequence
// for a decode step) through layer l into y [T, D] in one launch per kernel: rows gives
// each row's position and its sequence's slot in pools (slot's layout); every position
// must be below maxPos. A full-indexer layer writes the selection into sel, a shared one
// reads it.
func (g *gpuDSA) decode(c *cudart.Ctx, s *cudart.Stream, l *gpuDSALayer, pools gpuDSAState, rows kernels.RowTable, sel gpuDSASel, x, y cudart.DevicePtr, T int) error {
	cfg := g.cfg
	D, H, R := cfg.HiddenSize, cfg.NumAttentionHeads, cfg.KVLoraRank
	dn, dv, I, N, P := cfg.QKNopeHeadDim, cfg.VHeadDim, cfg.IndexHeadDim, cfg.IndexNHeads, cfg.IndexKPool
	if T <= 0 || T > g.maxTokens || rows.RowPos == 0 || rows.RowSlot == 0 {
		return fmt.Errorf("gpu dsa: a batch of %d rows (workspace for %d) needs a row table", T, g.maxTokens)
	}
	if sel.MaxSel < g.maxSel() {
		return fmt.Errorf("gpu dsa: selection rows of %d, want %d", sel.MaxSel, g.maxSel())
	}
	keyStride, poolStride := g.maxPos*I, (g.maxPos/P)*I
	if err := g.queries(c, s, l, x, T); err != nil {
		return err
	}
	if err := g.keys(c, s, l, x, T, g.lat, g.key, g.gate); err != nil {
		return err
	}
	if err := kernels.Run(g.ks, c, s, kernels.ScatterRows{Dst: pools.Latent, Src: g.lat, Table: rows, SlotStride: g.maxPos * R,
		Rows: T, Dim: R}); err != nil {
		return fmt.Errorf("gpu dsa: %w", err)
	}
	if l.full {
		stride := g.maxPos / P
		if err := kernels.Run(g.ks, c, s, kernels.ScatterRows{Dst: pools.IdxKey, Src: g.key, Table: rows, SlotStride: keyStride,
			Rows: T, Dim: I}); err != nil {
			return fmt.Errorf("gpu dsa: %w", err)
		}
		if err := kernels.Run(g.ks, c, s, kernels.ScatterRows{Dst: pools.IdxGate, Src: g.gate, Table: rows, SlotStride: keyStride,
			Rows: T, Dim: I}); err != nil {
			return fmt.Errorf("gpu dsa: %w", err)
		}
		if err := kernels.Run(g.ks, c, s, kernels.KPoolClose{Pools: pools.Pools, Keys: pools.IdxKey, Gates: pools.IdxGate, APE: l.ape,
			Table: rows, KeySlotStride: keyStride, PoolSlotStride: poolStride, Rows: T, Pool: P, Dim: I}); err != nil {
			return fmt.Errorf("gpu dsa: %w", err)
		}
		if err := kernels.Run(g.ks, c, s, kernels.IndexerScores{Score: g.score, Q: g.iq, HW: g.hw, Pools: pools.Pools, Tokens: T,
			Pool: P, Heads: N, Dim: I, Stride: stride, DScale: float32(1 / math.Sqrt(float64(I))), Rows: rows,
			PoolSlotStride: poolStride, MaxPos: g.maxPos}); err != nil {
			return fmt.Errorf("gpu dsa: %w", err)
		}
		if err := kernels.Run(g.ks, c, s, kernels.PoolTopK{Sel: sel.Sel, Count: sel.Count, Score: g.score, Tokens: T, Pool: P,
			K: cfg.IndexPools(), Stride: stride, MaxSel: sel.MaxSel, Tail: cfg.IndexKPoolSelectTail, RowPos: rows.RowPos,
			MaxPos: g.maxPos}); err != nil {
			return fmt.Errorf("gpu dsa: %w", err)
		}
	}
	if err := kernels.Run(g.ks, c, s, kernels.SparseMLA{Out: g.out, Q: g.q, KVB: l.kvb, Latent: pools.Latent, Sel: sel.Sel,
		Count: sel.Count, Tokens: T, Heads: H, DN: dn, DV: dv, Rank: R, MaxSel: sel.MaxSel,
		Scale: float32(1 / math.Sqrt(float64(cfg.QKHeadDim))), RowSlot: rows.RowSlot, LatentSlotStride: g.maxPos * R}); err != nil {
		return fmt.Errorf("gpu dsa: %w", err)
	}
	return g.mm(c, s, y, g.out, l.o, T, H*dv, D, 1)
}
