package glm5flash

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"

	"gonum.org/v1/gonum/blas/gonum"

	"github.com/resin-llm/resin/core/kernels/ref"
)

// vek runs MLA's per-head vector loops on gonum's float32 kernels (assembly on amd64).
var vek gonum.Implementation

// TextModel is GLM-5.3-Flash's text model: KDA and NoPE MLA-DSA layers between mHC
// streams, dense and MoE MLPs, the mean stream collapse and an untied lm_head.
type TextModel struct {
	Config *TextConfig
	W      *TextWeights
	par    parallel // this rank's part of a parallel layout (parallel.go); zero: the whole model
	held   *held    // the projections in another dtype (dtype.go); nil: fp32, W's slices
}

// KDAChunk is the chunk length of the chunked KDA form used for prefill.
const KDAChunk = 16

// TextState is one sequence's state between forward calls: for KDA layers the causal-conv
// history and the recurrent state, for MLA layers the normalised latents and the
// indexer's keys, gate scores and completed pool keys. A state from NewTextState lives in
// Go memory; the runner binds one to kvslab pages for each plan (cache.go).
type TextState struct {
	Len    int // tokens consumed
	Layers []TextLayerState
	// BlockTokens, when > 0, makes KDA layers call BlockEnd at every block end.
	BlockTokens int
}

// TextLayerState is one layer's part of a TextState.
type TextLayerState struct {
	Conv      []float32 // KDA: [3L, K−1], the last K−1 conv inputs per channel (oldest first)
	Recurrent []float32 // KDA: [H, Dk, Dv] fp32
	Latent    Rows      // MLA: per token kv_a_layernorm(kv_a_proj_with_mqa(x)) [kv_lora_rank]
	IdxKey    Rows      // full indexer: per token k_norm(wk(x)) [I]
	IdxGate   Rows      // full indexer: per token x·index_kpool_compress_gateᵀ [I]
	Pools     Rows      // full indexer: per completed pool its key [I]
	// BlockEnd, when set, is called by a KDA layer once Conv and Recurrent hold the state
	// after the token at pos, the last of a block (the runner checkpoints them there).
	BlockEnd func(pos int)
	// AfterToken, when set, makes a KDA layer run its tokens one at a time (the step form)
	// and call it once Conv and Recurrent hold the state after token t of the call (the
	// runner keeps the states after draft tokens, to restore them when drafts are rejected).
	AfterToken func(t int)
}

// Rows is storage of fixed-width float32 rows addressed by index (token position, pool
// index). Row returns row i's storage, which the caller may write.
type Rows interface {
	Row(i int) []float32
}

// growRows is Rows in a Go slice that grows as rows are written.
type growRows struct {
	dim  int
	data []float32
}

func (r *growRows) Row(i int) []float32 {
	for (i+1)*r.dim > len(r.data) {
		r.data = append(r.data, make([]float32, r.dim)...)
	}
	return r.data[i*r.dim : (i+1)*r.dim]
}

// NewTextState returns the empty state of a new sequence, in Go memory.
func (m *TextModel) NewTextState() *TextState {
	c := m.Config
	s := &TextState{Layers: make([]TextLayerState, c.NumHiddenLayers)}
	for i, ly := range m.W.layers {
		ls := &s.Layers[i]
		if ly.kind == LinearAttention {
			L := c.LinearDim()
			ls.Conv = make([]float32, 3*L*(c.LinearConvKernelDim-1))
			ls.Recurrent = make([]float32, c.LinearNumHeads*c.LinearHeadDim*c.LinearHeadDim)
			continue
		}
		ls.Latent = &growRows{dim: c.KVLoraRank}
		if ly.mla.idx != nil {
			ls.IdxKey, ls.IdxGate, ls.Pools = &growRows{dim: c.IndexHeadDim}, &growRows{dim: c.IndexHeadDim}, &growRows{dim: c.IndexHeadDim}
		}
	}
	return s
}

// Forward runs ids (the next tokens of the sequence whose state is st) through the model
// and returns their logits [len(ids), vocab]; st advances by len(ids). Any split of a
// sequence into calls gives the same logits (to rounding): one call is a prefill, a
// one-token call is a decode step.
func (m *TextModel) Forward(st *TextState, ids []int32) ([]float32, error) {
	return m.ForwardRows(st, ids, nil)
}

// ForwardRows is Forward that computes the logits of the rows listed in rows only (in that
// order, [len(rows), vocab]); nil rows means every row.
func (m *TextModel) ForwardRows(st *TextState, ids []int32, rows []int) ([]float32, error) {
	return m.ForwardBatch([]TextChunk{{State: st, Tokens: ids, Rows: rows}})
}

// TextChunk is one sequence's part of a batch: the next tokens of the sequence whose state
// is State, and the rows (indices into Tokens) that need logits; nil Rows means all.
type TextChunk struct {
	State  *TextState
	Tokens []int32
	Rows   []int
}

// ForwardBatch runs several sequences' chunks at once: the stateful parts (KDA, MLA and
// the indexer) per sequence, the rest (mHC, MLPs and MoE, lm_head) as one batch of rows.
// It returns the logits of each chunk's Rows, chunk after chunk; every state advances by
// its chunk's length. The chunks' states must be distinct.
func (m *TextModel) ForwardBatch(chunks []TextChunk) ([]float32, error) {
	logits, _, err := m.ForwardHidden(chunks)
	return logits, err
}

// ForwardHidden is ForwardBatch that also returns the final hidden state of every token
// row, chunk after chunk ([Σ len(Tokens), hidden]): norm(mean of the mHC streams), the
// input of lm_head and what the MTP layer reads (transformers' last_hidden_state).
func (m *TextModel) ForwardHidden(chunks []TextChunk) (logits, hidden []float32, err error) {
	c := m.Config
	D, hc := c.HiddenSize, c.HCMult
	var ids []int32
	off := make([]int, len(chunks)+1)
	for i, ch := range chunks {
		ids = append(ids, ch.Tokens...)
		off[i+1] = len(ids)
	}
	T := len(ids)
	if T == 0 {
		return nil, nil, nil
	}
	x := make([]float32, T*D)
	if err := m.embed(x, ids); err != nil {
		return nil, nil, err
	}
	streams := make([]float32, T*hc*D)
	for t := range T {
		for k := range hc {
			copy(streams[(t*hc+k)*D:], x[t*D:(t+1)*D])
		}
	}
	sels := make([][][]int32, len(chunks)) // each chunk's previous-layer DSA selection
	for i := range m.W.layers {
		ly := &m.W.layers[i]
		var err error
		streams, err = m.hcBlock(streams, T, &ly.attnHC, ly.inNorm, func(h []float32) ([]float32, error) {
			out := make([]float32, T*D)
			for ci, ch := range chunks {
				st, n := ch.State, off[ci+1]-off[ci]
				if n == 0 {
					continue
				}
				hs := h[off[ci]*D : off[ci+1]*D]
				ls := &st.Layers[i]
				var y []float32
				var err error
				if ly.kind == LinearAttention {
					sels[ci] = nil
					y, err = m.kda(ly.kda, ls, hs, n, st.Len, st.BlockTokens)
				} else {
					y, sels[ci], err = m.mla(ly.mla, ls, hs, n, st.Len, sels[ci])
				}
				if err != nil {
					return nil, err
				}
				copy(out[off[ci]*D:], y)
			}
			// Under TP each rank projected its heads: one all-reduce for every chunk.
			return out, m.allReduce(out, "attention")
		})
		if err != nil {
			return nil, nil, fmt.Errorf("layer %d attention: %w", i, err)
		}
		streams, err = m.hcBlock(streams, T, &ly.ffnHC, ly.postNorm, func(h []float32) ([]float32, error) {
			if ly.dense != nil {
				y := m.mlp(ly.dense, h, T, D, float32(c.SwigluLimit))
				return y, m.allReduce(y, "mlp")
			}
			return m.moe(ly.moe, h, T)
		})
		if err != nil {
			return nil, nil, fmt.Errorf("layer %d mlp: %w", i, err)
		}
	}
	// hc_head: the mean of the streams, then the final norm; lm_head on the rows asked.
	hidden = make([]float32, T*D)
	for t := range T {
		o := hidden[t*D : (t+1)*D]
		for k := range hc {
			for d := range D {
				o[d] += streams[(t*hc+k)*D+d]
			}
		}
		for d := range D {
			o[d] /= float32(hc)
		}
	}
	if err := ref.RMSNorm(hidden, hidden, m.W.norm, T, D, float32(c.RMSNormEps)); err != nil {
		return nil, nil, err
	}
	var picked []float32
	for ci, ch := range chunks {
		if ch.Rows == nil {
			picked = append(picked, hidden[off[ci]*D:off[ci+1]*D]...)
		}
		for _, r := range ch.Rows {
			t := off[ci] + r
			picked = append(picked, hidden[t*D:(t+1)*D]...)
		}
		ch.State.Len += off[ci+1] - off[ci]
	}
	n := len(picked) / D
	if n == 0 {
		return nil, hidden, nil
	}
	logits, err = m.lmHead(picked, n)
	return logits, hidden, err
}

// hcBlock runs one mHC-wrapped block: weights from the normalised flattened streams,
// collapse by pre, RMSNorm, the block, expand by post plus combᵀ·streams.
func (m *TextModel) hcBlock(streams []float32, T int, h *hcWeights, norm []float32, block func([]float32) ([]float32, error)) ([]float32, error) {
	c := m.Config
	D, hc := c.HiddenSize, c.HCMult
	nMix := (2 + hc) * hc
	flat := make([]float32, T*hc*D)
	if err := ref.RMSNormUnweighted(flat, streams, T, hc*D, float32(c.RMSNormEps)); err != nil {
		return nil, err
	}
	mix := dense(flat, h.fn, T, hc*D, nMix)
	pre, post, comb := make([]float32, T*hc), make([]float32, T*hc), make([]float32, T*hc*hc)
	in := make([]float32, T*D)
	for t := range T {
		if err := ref.HyperConnWeights(pre[t*hc:(t+1)*hc], post[t*hc:(t+1)*hc], comb[t*hc*hc:(t+1)*hc*hc],
			mix[t*nMix:(t+1)*nMix], h.base, h.scale, hc, c.HCSinkhornIters, float32(c.HCEps)); err != nil {
			return nil, err
		}
		if err := ref.HyperCollapse(in[t*D:(t+1)*D], streams[t*hc*D:(t+1)*hc*D], pre[t*hc:(t+1)*hc], hc, D); err != nil {
			return nil, err
		}
	}
	if err := ref.RMSNorm(in, in, norm, T, D, float32(c.RMSNormEps)); err != nil {
		return nil, err
	}
	out, err := block(in)
	if err != nil {
		return nil, err
	}
	next := make([]float32, len(streams))
	for t := range T {
		if err := ref.HyperExpand(next[t*hc*D:(t+1)*hc*D], streams[t*hc*D:(t+1)*hc*D], out[t*D:(t+1)*D],
			post[t*hc:(t+1)*hc], comb[t*hc*hc:(t+1)*hc*hc], hc, D); err != nil {
			return nil, err
		}
	}
	return next, nil
}

// dense returns x·wᵀ: x [rows, in], w [out, in].
func dense(x, w []float32, rows, in, out int) []float32 {
	y := make([]float32, rows*out)
	if err := ref.MatMulT(y, x, w, rows, in, out); err != nil {
		panic(err) // shapes are fixed by the loader
	}
	return y
}

func sigmoid32(x float32) float32 { return float32(1 / (1 + math.Exp(-float64(x)))) }

// clampedSwiGLU computes silu(min(gate, limit))·clamp(up, ±limit) in place into gate.
func clampedSwiGLU(gate, up []float32, limit float32) {
	// gate and up have the same length by construction: an error is a bug here.
	if err := ref.SiLUMulClamped(gate, gate, up, limit); err != nil {
		panic(err)
	}
}

// mlp is the clamped SwiGLU MLP (dense layers and shared experts).
func (m *TextModel) mlp(w *mlpWeights, x []float32, T, D int, limit float32) []float32 {
	g := m.dense(x, &w.gate, T, D, w.width)
	u := m.dense(x, &w.up, T, D, w.width)
	clampedSwiGLU(g, u, limit)
	return m.dense(g, &w.down, T, w.width, D)
}

// moe routes each token to its top-k experts (sigmoid scores plus correction bias,
// group-limited when n_group > 1, weights renormalised and scaled) and adds the shared
// experts.
func (m *TextModel) moe(w *moeWeights, x []float32, T int) ([]float32, error) {
	c := m.Config
	D, E, F, K := c.HiddenSize, c.NRoutedExperts, m.moeInter(), c.NumExpertsPerTok
	logits := dense(x, w.router, T, D, E)
	if topKMargin != nil {
		routerMargins(logits, w.bias, T, E, K, c.NGroup, c.TopKGroup)
	}
	wts, ids := make([]float32, T*K), make([]int32, T*K)
	if err := ref.MoETopK(wts, ids, logits, T, E, ref.Routing{TopK: K, Scoring: ref.ScoreSigmoid,
		Renormalize: c.NormTopKProb, Bias: w.bias, Groups: c.NGroup, GroupTopK: c.TopKGroup,
		Scale: float32(c.RoutedScalingFactor)}); err != nil {
		return nil, err
	}
	if m.par.dp {
		return m.moeDP(w, x, T, ids, wts) // DP-attention: this rank's rows only (dp.go)
	}
	// Under expert parallelism with the gather exchange the ranks whose sum over the ep
	// group is the shared experts' output once hold it, the others start from zeros, and
	// each adds its own experts (moeExperts combines them): rank 0 alone (EP), or the ep
	// group's first tp group with its columns (TP × EP, TP ≤ EP: every rank when equal).
	// With EP < TP the ep group does not span the tp group, so the columns are summed over
	// the tp group first and ep rank 0 holds the sum. All-to-all gives every rank the
	// routed sum, added to its own (the columns summed first under TP).
	par, p := m.expertParallel(), &m.par
	var out []float32
	if !par || p.dispatch == DispatchAllToAll || p.epRank < p.tp || p.ep < p.tp {
		out = m.mlp(&w.shared, x, T, D, float32(c.SwigluLimit))
	} else {
		out = make([]float32, T*D)
	}
	e0, e1 := m.experts()
	// expert runs held expert e (the model's index) on n rows of xe into y.
	expert := func(e int, xe []float32, n int, y []float32) error {
		le := e - e0
		gu := m.expertDense(xe, &w.gateUp, le, n, D, 2*F)
		g, u := make([]float32, n*F), make([]float32, n*F)
		for r := range n {
			copy(g[r*F:(r+1)*F], gu[r*2*F:r*2*F+F])
			copy(u[r*F:(r+1)*F], gu[r*2*F+F:(r+1)*2*F])
		}
		clampedSwiGLU(g, u, float32(c.SwigluLimit))
		return m.expertMatMulT(y, g, &w.down, le, n, F, D)
	}
	if par && (p.dispatch == DispatchAllToAll || p.ep < p.tp) {
		// The exchange does not span the tp group (or gives every rank the routed sum):
		// the shared experts' columns are summed over it first.
		if err := m.allReduce(out, "shared experts"); err != nil {
			return nil, err
		}
		if p.dispatch == DispatchAllToAll {
			return out, m.moeExperts(x, out, ids, wts, T, expert)
		}
		if p.epRank != 0 {
			clear(out) // ep rank 0's sum counts once in the combine
		}
	}
	// Group rows by expert and run each expert's rows as one GEMM.
	rows := make([][]int, E)
	for t := range T {
		for j := range K {
			rows[ids[t*K+j]] = append(rows[ids[t*K+j]], t*K+j)
		}
	}
	// The experts run on ref's pool, a participant whole experts at a time; their rows are
	// then added to their tokens expert by expert, in the order of the loop they came from.
	ys := make([][]float32, E)
	errs := make([]error, E)
	ref.ParallelRange(e1-e0, 1, func(_, lo, hi int) {
		for e := lo + e0; e < hi+e0; e++ {
			rs := rows[e]
			if len(rs) == 0 {
				continue
			}
			xe := make([]float32, len(rs)*D)
			for r, tk := range rs {
				copy(xe[r*D:(r+1)*D], x[(tk/K)*D:(tk/K+1)*D])
			}
			ys[e] = make([]float32, len(rs)*D)
			errs[e] = expert(e, xe, len(rs), ys[e])
		}
	})
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	for e := e0; e < e1; e++ {
		y := ys[e]
		for r, tk := range rows[e] {
			wt := wts[tk]
			o := out[(tk/K)*D : (tk/K+1)*D]
			for d := range D {
				o[d] += wt * y[r*D+d]
			}
		}
	}
	if par {
		return out, m.moeExperts(x, out, ids, wts, T, expert)
	}
	return out, m.allReduce(out, "moe")
}

// kda runs a Kimi Delta Attention layer over T tokens at positions pos0.., advancing the
// conv and recurrent state: the chunked form for several tokens, the step form for one.
// With blockTokens > 0 the tokens are cut at block ends and BlockEnd sees the state there.
func (m *TextModel) kda(w *kdaWeights, ls *TextLayerState, x []float32, T, pos0, blockTokens int) ([]float32, error) {
	mixed, g, beta := m.kdaInputs(w, x, T)
	o, err := m.kdaCore(w, ls, mixed, g, beta, T, pos0, blockTokens)
	if err != nil {
		return nil, err
	}
	return m.kdaOut(w, x, o, T)
}

// kdaInputs computes what a KDA layer's recurrence reads of x's T rows: the causal conv's
// input q‖k‖v ([T, 3L]), the per-channel log-decay g ([T, L]) and beta ([T, H]).
func (m *TextModel) kdaInputs(w *kdaWeights, x []float32, T int) (mixed, g, beta []float32) {
	c := m.Config
	D, Dh := c.HiddenSize, c.LinearHeadDim
	_, H := m.heads()
	L := H * Dh
	q, k, v := m.dense(x, &w.q, T, D, L), m.dense(x, &w.k, T, D, L), m.dense(x, &w.v, T, D, L)
	mixed = make([]float32, T*3*L)
	for t := range T {
		copy(mixed[t*3*L:], q[t*L:(t+1)*L])
		copy(mixed[t*3*L+L:], k[t*L:(t+1)*L])
		copy(mixed[t*3*L+2*L:], v[t*L:(t+1)*L])
	}
	// Forget gate: per-channel log-decay.
	g = m.dense(m.dense(x, &w.fa, T, D, Dh), &w.fb, T, Dh, L)
	for t := range T {
		for h := range H {
			a := math.Exp(float64(w.aLog[h]))
			for j := range Dh {
				i := t*L + h*Dh + j
				f := float64(g[i] + w.dtBias[h*Dh+j])
				if lb := c.LinearLowerBound; lb != nil {
					g[i] = float32(*lb / (1 + math.Exp(-a*f)))
				} else {
					sp := f
					if f <= 20 {
						sp = math.Log(1 + math.Exp(f))
					}
					g[i] = float32(-a * sp)
				}
			}
		}
	}
	beta = m.dense(x, &w.b, T, D, H)
	for i := range beta {
		beta[i] = sigmoid32(beta[i])
	}
	return mixed, g, beta
}

// kdaCore runs the causal conv and the KDA recurrence of T tokens at positions pos0..
// (kdaInputs' mixed, g and beta) from ls's state, advancing it, and returns the
// recurrence's output ([T, L]).
func (m *TextModel) kdaCore(w *kdaWeights, ls *TextLayerState, mixed, g, beta []float32, T, pos0, blockTokens int) ([]float32, error) {
	c := m.Config
	Dh, K := c.LinearHeadDim, c.LinearConvKernelDim
	_, H := m.heads()
	L := H * Dh
	// Under TP the state holds this rank's heads in the room of the first ones.
	convState, recState := ls.Conv[:3*L*(K-1)], ls.Recurrent[:H*Dh*Dh]
	q, k, v := make([]float32, T*L), make([]float32, T*L), make([]float32, T*L)
	scale := float32(1 / math.Sqrt(float64(Dh)))
	l2 := func(x []float32, mul float32) {
		for o := 0; o < len(x); o += Dh {
			var s float32
			for _, e := range x[o : o+Dh] {
				s += e * e
			}
			n := float32(math.Sqrt(float64(s) + 1e-6))
			for i := range Dh {
				x[o+i] = x[o+i] / n * mul
			}
		}
	}
	o := make([]float32, T*L)
	conv := make([]float32, len(mixed))
	a := ref.KDA{Heads: H, DK: Dh, DV: Dh}
	for s0 := 0; s0 < T; {
		s1 := T
		if blockTokens > 0 {
			s1 = min(T, s0+blockTokens-(pos0+s0)%blockTokens)
		}
		if ls.AfterToken != nil {
			s1 = s0 + 1
		}
		n := s1 - s0
		if err := ref.CausalConvStep(conv[s0*3*L:], convState, mixed[s0*3*L:s1*3*L], w.conv, n, 3*L, K); err != nil {
			return nil, err
		}
		for t := s0; t < s1; t++ {
			row := conv[t*3*L : (t+1)*3*L]
			for i := range row {
				row[i] = ref.SiLU(row[i])
			}
			copy(q[t*L:(t+1)*L], row[:L])
			copy(k[t*L:(t+1)*L], row[L:2*L])
			copy(v[t*L:(t+1)*L], row[2*L:])
		}
		qs, ks := q[s0*L:s1*L], k[s0*L:s1*L]
		l2(qs, scale)
		l2(ks, 1)
		var err error
		if n == 1 {
			err = ref.KDAStep(o[s0*L:s1*L], recState, qs, ks, v[s0*L:s1*L], g[s0*L:s1*L], beta[s0*H:s1*H], n, a)
		} else {
			err = ref.KDAChunked(o[s0*L:s1*L], recState, qs, ks, v[s0*L:s1*L], g[s0*L:s1*L], beta[s0*H:s1*H], n, KDAChunk, a)
		}
		if err != nil {
			return nil, err
		}
		if blockTokens > 0 && (pos0+s1)%blockTokens == 0 && ls.BlockEnd != nil {
			ls.BlockEnd(pos0 + s1 - 1)
		}
		if ls.AfterToken != nil {
			ls.AfterToken(s0)
		}
		s0 = s1
	}
	return o, nil
}

// kdaOut is a KDA layer's output of x's T rows from the recurrence's o ([T, L], written):
// the gated norm per head (fp32), then o_proj.
func (m *TextModel) kdaOut(w *kdaWeights, x, o []float32, T int) ([]float32, error) {
	c := m.Config
	D, Dh := c.HiddenSize, c.LinearHeadDim
	_, H := m.heads()
	L := H * Dh
	gate := m.dense(m.dense(x, &w.ga, T, D, Dh), &w.gb, T, Dh, L)
	if err := ref.RMSNorm(o, o, w.oNorm, T*H, Dh, float32(c.RMSNormEps)); err != nil {
		return nil, err
	}
	for i := range o {
		o[i] *= sigmoid32(gate[i])
	}
	return m.dense(o, &w.o, T, L, D), nil
}

// mla runs a NoPE MLA layer with DSA over T tokens at positions pos0.. and returns the
// output and the per-query selection (token indices) it attended to; prev is the previous
// layer's selection, used when the layer shares its indexer.
func (m *TextModel) mla(w *mlaWeights, ls *TextLayerState, x []float32, T, pos0 int, prev [][]int32) ([]float32, [][]int32, error) {
	qr, q, lat, err := m.mlaProject(w, x, T)
	if err != nil {
		return nil, nil, err
	}
	m.storeLatents(ls, lat, pos0, T)
	var sel [][]int32
	if w.idx != nil {
		k, gs := m.indexKeys(w.idx, x, T)
		m.storeIndexKeys(w.idx, ls, k, gs, pos0, T)
		sel = m.indexSelect(w.idx, ls, x, qr, T, pos0)
	} else {
		if len(prev) != T {
			return nil, nil, fmt.Errorf("shared DSA layer without a preceding full indexer layer")
		}
		sel = prev
	}
	return m.mlaAttend(w, ls, q, sel, T), sel, nil
}

// mlaProject computes an MLA layer's projections of x's T rows: the normed q_a output qr
// ([T, q_lora_rank], the indexer's input), the queries q ([T, heads, nope]) and the
// normed latents lat ([T, kv_lora_rank]).
func (m *TextModel) mlaProject(w *mlaWeights, x []float32, T int) (qr, q, lat []float32, err error) {
	c := m.Config
	D, Q, R := c.HiddenSize, c.QLoraRank, c.KVLoraRank
	H, _ := m.heads()
	eps := float32(c.RMSNormEps)
	qr = m.dense(x, &w.qa, T, D, Q)
	if err := ref.RMSNorm(qr, qr, w.qaNorm, T, Q, eps); err != nil {
		return nil, nil, nil, err
	}
	q = m.dense(qr, &w.qb, T, Q, H*c.QKNopeHeadDim)
	lat = m.dense(x, &w.kva, T, D, R)
	if err := ref.RMSNorm(lat, lat, w.kvaNorm, T, R, eps); err != nil {
		return nil, nil, nil, err
	}
	return qr, q, lat, nil
}

// storeLatents writes the latents of T tokens at positions pos0.. into ls.
func (m *TextModel) storeLatents(ls *TextLayerState, lat []float32, pos0, T int) {
	R := m.Config.KVLoraRank
	for t := range T {
		copy(ls.Latent.Row(pos0+t), lat[t*R:(t+1)*R])
	}
}

// mlaAttend computes the output of T queries q over the latents sel selects for each
// (absorbed MLA), through o_proj.
func (m *TextModel) mlaAttend(w *mlaWeights, ls *TextLayerState, q []float32, sel [][]int32, T int) []float32 {
	c := m.Config
	D, R := c.HiddenSize, c.KVLoraRank
	H, _ := m.heads()
	dn, dv := c.QKNopeHeadDim, c.VHeadDim
	// Absorbed MLA: with kv_b_proj's per-head blocks W_uk [nope, R] and W_uv [v, R],
	// q·k_j = (W_ukᵀq)·latent_j and Σ_j p_j·v_j = W_uv·(Σ_j p_j·latent_j), so only the
	// selected tokens' latents are read.
	scale := float32(1 / math.Sqrt(float64(c.QKHeadDim)))
	out := make([]float32, T*H*dv)
	// The tokens are independent: they are split across ref's worker pool, each
	// participant with scratch of its own.
	scratch := make([]mlaScratch, ref.Parts())
	ref.ParallelRange(T, 1, func(part, lo, hi int) {
		sc := &scratch[part]
		if sc.qa == nil {
			sc.qa, sc.ctx = make([]float32, R), make([]float32, R)
		}
		qa, ctx := sc.qa, sc.ctx
		for t := lo; t < hi; t++ {
			toks := sel[t]
			lats := sc.lats[:0]
			for _, tok := range toks {
				lats = append(lats, ls.Latent.Row(int(tok)))
			}
			sc.lats = lats
			if cap(sc.p) < len(toks) {
				sc.p = make([]float32, len(toks))
			}
			p := sc.p[:len(toks)]
			for h := range H {
				wuk := w.kvb[h*(dn+dv)*R : (h*(dn+dv)+dn)*R]
				wuv := w.kvb[(h*(dn+dv)+dn)*R : (h+1)*(dn+dv)*R]
				qh := q[(t*H+h)*dn : (t*H+h+1)*dn]
				clear(qa)
				for d := range dn {
					vek.Saxpy(R, qh[d], wuk[d*R:(d+1)*R], 1, qa, 1)
				}
				mx := float32(math.Inf(-1))
				for j, lat := range lats {
					p[j] = vek.Sdot(R, qa, 1, lat, 1) * scale
					mx = max(mx, p[j])
				}
				var sum float32
				for j := range p {
					p[j] = float32(math.Exp(float64(p[j] - mx)))
					sum += p[j]
				}
				clear(ctx)
				for j, lat := range lats {
					vek.Saxpy(R, p[j]/sum, lat, 1, ctx, 1)
				}
				oh := out[(t*H+h)*dv : (t*H+h+1)*dv]
				for d := range dv {
					oh[d] = vek.Sdot(R, wuv[d*R:(d+1)*R], 1, ctx, 1)
				}
			}
		}
	})
	return m.dense(out, &w.o, T, H*dv, D)
}

// mlaScratch is one participant's working memory in mla's per-token loop.
type mlaScratch struct {
	qa, ctx []float32   // [R] a head's absorbed query, then its latent context
	lats    [][]float32 // the selected tokens' latents
	p       []float32   // their attention weights
}

// indexKeys computes the indexer's keys k (k_norm(wk·x)) and gate scores gs of x's T rows
// ([T, index_head_dim] each).
func (m *TextModel) indexKeys(w *indexerWeights, x []float32, T int) (k, gs []float32) {
	c := m.Config
	D, I := c.HiddenSize, c.IndexHeadDim
	k = m.dense(x, &w.wk, T, D, I)
	for t := range T { // LayerNorm, eps 1e-6
		r := k[t*I : (t+1)*I]
		var mean, vr float64
		for _, e := range r {
			mean += float64(e)
		}
		mean /= float64(I)
		for _, e := range r {
			vr += (float64(e) - mean) * (float64(e) - mean)
		}
		vr /= float64(I)
		inv := 1 / math.Sqrt(vr+1e-6)
		for j := range r {
			r[j] = float32((float64(r[j])-mean)*inv)*w.kNormW[j] + w.kNormB[j]
		}
	}
	return k, m.dense(x, &w.gate, T, D, I)
}

// storeIndexKeys writes the indexer's keys and gate scores of T tokens at positions pos0..
// into ls and closes the pools they complete.
func (m *TextModel) storeIndexKeys(w *indexerWeights, ls *TextLayerState, k, gs []float32, pos0, T int) {
	c := m.Config
	I, P := c.IndexHeadDim, c.IndexKPool
	for t := range T {
		copy(ls.IdxKey.Row(pos0+t), k[t*I:(t+1)*I])
		copy(ls.IdxGate.Row(pos0+t), gs[t*I:(t+1)*I])
	}
	n := pos0 + T
	for j := pos0 / P; j < n/P; j++ { // close the pools these tokens complete
		pk := ls.Pools.Row(j)
		keys, gates := make([][]float32, P), make([][]float32, P)
		for s := range P {
			keys[s], gates[s] = ls.IdxKey.Row(j*P+s), ls.IdxGate.Row(j*P+s)
		}
		for ch := range I {
			mx := math.Inf(-1)
			for s := range P {
				mx = max(mx, float64(gates[s][ch]+w.ape[s*I+ch]))
			}
			var sum, acc float64
			for s := range P {
				e := math.Exp(float64(gates[s][ch]+w.ape[s*I+ch]) - mx)
				sum += e
				acc += e * float64(keys[s][ch])
			}
			pk[ch] = float32(acc / sum)
		}
	}
}

// indexSelect returns, per query of x's T rows at positions pos0.., the tokens of its top
// index_topk/index_kpool visible complete pools followed by the visible incomplete tail,
// in ascending order (ls holds every pool those positions see).
func (m *TextModel) indexSelect(w *indexerWeights, ls *TextLayerState, x, qr []float32, T, pos0 int) [][]int32 {
	c := m.Config
	D, Q, I, N, P := c.HiddenSize, c.QLoraRank, c.IndexHeadDim, c.IndexNHeads, c.IndexKPool
	q := m.dense(qr, &w.wqb, T, Q, N*I)
	hw := m.dense(x, &w.wProj, T, D, N)
	hs := float32(math.Pow(float64(N), -0.5))
	for i := range hw {
		hw[i] *= hs
	}
	K := c.IndexPools()
	dscale := float32(1 / math.Sqrt(float64(I)))
	sel := make([][]int32, T)
	for t := range T {
		pos := pos0 + t
		visible := (pos + 1) / P // complete pools whose last token ≤ pos
		type cand struct {
			pool  int
			score float32
		}
		cs := make([]cand, visible)
		for j := range visible {
			pk := ls.Pools.Row(j)
			var score float32
			for h := range N {
				qh := q[(t*N+h)*I : (t*N+h+1)*I]
				var s float32
				for d := range I {
					s += qh[d] * pk[d]
				}
				score += hw[t*N+h] * max(s*dscale, 0)
			}
			cs[j] = cand{j, score}
		}
		slices.SortStableFunc(cs, func(a, b cand) int { // descending score
			switch {
			case a.score > b.score:
				return -1
			case a.score < b.score:
				return 1
			}
			return 0
		})
		if topKMargin != nil && len(cs) > K {
			topKMargin("indexer", cs[K-1].score-cs[K].score)
		}
		cs = cs[:min(K, len(cs))]
		slices.SortFunc(cs, func(a, b cand) int { return a.pool - b.pool })
		var toks []int32
		for _, cd := range cs {
			for s := range P {
				toks = append(toks, int32(cd.pool*P+s))
			}
		}
		if c.IndexKPoolSelectTail {
			for j := visible * P; j <= pos; j++ {
				toks = append(toks, int32(j))
			}
		}
		sel[t] = toks
	}
	return sel
}

// topKMargin, when set (by tests), receives the score gap at every top-k cut: the indexer's
// pool selection, the router's group and expert choices. transformers' torch.topk order
// on ties is implementation-defined, so goldens are meaningful only with clear gaps.
var topKMargin func(kind string, gap float32)

func routerMargins(logits, bias []float32, T, E, K, groups, topGroups int) {
	gs := E / groups
	for t := range T {
		choice := make([]float32, E)
		for e := range E {
			choice[e] = sigmoid32(logits[t*E+e]) + bias[e]
		}
		allowed := make([]bool, E)
		if groups > 1 {
			gscore := make([]float32, groups)
			for g := range groups {
				v := append([]float32(nil), choice[g*gs:(g+1)*gs]...)
				sort.Slice(v, func(a, b int) bool { return v[a] > v[b] })
				gscore[g] = v[0] + v[1]
			}
			order := make([]int, groups)
			for g := range order {
				order[g] = g
			}
			sort.Slice(order, func(a, b int) bool { return gscore[order[a]] > gscore[order[b]] })
			topKMargin("router-group", gscore[order[topGroups-1]]-gscore[order[topGroups]])
			for _, g := range order[:topGroups] {
				for e := g * gs; e < (g+1)*gs; e++ {
					allowed[e] = true
				}
			}
		} else {
			for e := range allowed {
				allowed[e] = true
			}
		}
		var v []float32
		for e := range E {
			if allowed[e] {
				v = append(v, choice[e])
			}
		}
		sort.Slice(v, func(a, b int) bool { return v[a] > v[b] })
		if len(v) > K {
			topKMargin("router", v[K-1]-v[K])
		}
	}
}
