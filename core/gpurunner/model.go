package gpurunner

import (
	"fmt"
	"math"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/kernels/cuda"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/core/weights"
)

// Dense is a dense llama-family model on one GPU: its bf16 weights uploaded once, its
// rotary table, and a workspace for the limits it was built for, run by the shared
// kernels of core/kernels/cuda and cuBLASLt GEMMs. Forward launches one step; it must run
// inside Device.Do of the model's device.
type Dense struct {
	Config *DenseConfig
	k      *cuda.Kernels
	blas   *cudart.Blas
	sms    int

	wl      WeightLayout
	weights cudart.Buffer
	ws      Workspace
	work    cudart.Buffer
	rope    cudart.Buffer // cos then sin, float32

	cache  cudart.DevicePtr // the kvslab arena's start
	layers []cuda.KVSlabLayout

	// tp is the model's rank of a tensor-parallel group (tp.go); nil on one GPU.
	tp *tpRank
	// cp is its rank of a context-parallel group (cp.go); nil on one GPU.
	cp *cpRank

	// tap, when set, is given the residual stream ([tokens, hidden] bf16) after the
	// embeddings (layer −1) and after each decoder layer but the last: DSpark's feature
	// tap (dspark.go).
	tap func(c *cudart.Ctx, s *cudart.Stream, layer int, residual cudart.DevicePtr, tokens int) error
}

// tpRank is what a tensor-parallel rank's forward adds to one GPU's: the communicator its
// collectives run on and their buffers.
type tpRank struct {
	comm *cudart.Comm
	// partial holds the rank's float32 partial o and down products ([T, hidden]), summed
	// over the group before the bf16 rounding and any bias.
	partial cudart.DevicePtr
	// gathered holds every rank's head output of the step ([size][R, VocabShard] f32,
	// rank r's at r·R·VocabShard), all-gathered in place.
	gathered cudart.DevicePtr
}

// CacheGroups is the one full-attention group of a dense model's bf16 keys and values:
//
//	page: [layers][K|V][pageTokens][kvHeads][headDim] bf16
func CacheGroups(c *DenseConfig) []kvslab.GroupSpec {
	return []kvslab.GroupSpec{{
		Name: "kv", Kind: kvslab.Full, Layers: c.Layers, BytesPerToken: 2 * c.KVDim() * 2, PageTokens: c.PageTokens,
	}}
}

// cacheLayouts places each layer of c in a pool built on CacheGroups(c) (its first
// group; a DSpark drafter's may follow), in bf16 elements from the arena's start.
func cacheLayouts(c *DenseConfig, pool *kvslab.Pool) ([]cuda.KVSlabLayout, error) {
	want := CacheGroups(c)[0]
	g := pool.Groups()
	if len(g) < 1 || g[0].Kind != want.Kind || g[0].Layers != want.Layers || g[0].BytesPerToken != want.BytesPerToken || pool.BlockTokens() != c.PageTokens {
		return nil, fmt.Errorf("gpurunner: pool groups %+v (block %d) are not the dense model's %+v", g, pool.BlockTokens(), want)
	}
	pageBytes := int64(c.PageTokens) * int64(want.BytesPerToken) * int64(c.Layers)
	out := make([]cuda.KVSlabLayout, c.Layers)
	for l := range out {
		var err error
		if out[l], err = cuda.NewKVSlabLayoutOf(cuda.BF16, pool.SlabBytes(), pageBytes, l, c.PageTokens, c.KVHeads, c.HeadDim); err != nil {
			return nil, fmt.Errorf("gpurunner: %w", err)
		}
	}
	return out, nil
}

// newDense uploads w and allocates the workspace for limits l; cache is the device arena
// pool cuts. It runs inside Do.
func newDense(c *cudart.Ctx, cfg *DenseConfig, w *DenseWeights, l Limits, k *cuda.Kernels, blas *cudart.Blas, pool *kvslab.Pool, arena *cudart.DeviceArena, progress weights.ProgressFunc) (*Dense, error) {
	ws, err := NewWorkspace(cfg, l)
	if err != nil {
		return nil, err
	}
	layers, err := cacheLayouts(cfg, pool)
	if err != nil {
		return nil, err
	}
	m := &Dense{Config: cfg, k: k, blas: blas, sms: c.Device().Info.SMs, wl: NewWeightLayout(cfg), ws: ws, cache: arena.Ptr(0), layers: layers}
	ok := false
	defer func() {
		if !ok {
			m.free(c)
		}
	}()
	if m.weights, err = c.Alloc(m.wl.Size); err != nil {
		return nil, fmt.Errorf("gpurunner: %d bytes of bf16 weights: %w", m.wl.Size, err)
	}
	if err := uploadWeights(c, m.weights, cfg, &m.wl, w, progress); err != nil {
		return nil, err
	}
	if m.work, err = c.Alloc(ws.Size); err != nil {
		return nil, fmt.Errorf("gpurunner: workspace of %d bytes for %+v: %w", ws.Size, l, err)
	}
	if err := c.Memset(m.work.Ptr, 0, ws.Size); err != nil {
		return nil, err
	}
	n := len(cfg.RopeCos)
	if m.rope, err = c.Alloc(int64(8 * n)); err != nil {
		return nil, err
	}
	if err := cudart.Upload(c, m.rope.Ptr, cfg.RopeCos); err != nil {
		return nil, err
	}
	if err := cudart.Upload(c, m.rope.Ptr.Add(int64(4*n)), cfg.RopeSin); err != nil {
		return nil, err
	}
	if err := c.Synchronize(); err != nil { // the memset ran on the legacy stream
		return nil, err
	}
	ok = true
	return m, nil
}

func (m *Dense) free(c *cudart.Ctx) {
	for _, b := range []*cudart.Buffer{&m.weights, &m.work, &m.rope} {
		c.Free(*b)
		*b = cudart.Buffer{}
	}
}

// planPtr is where the step's upload sits on the device.
func (m *Dense) planPtr() cudart.DevicePtr { return m.work.Ptr.Add(m.ws.Plan.Off) }

// Forward launches the step laid out by l (uploaded at planPtr) on s: the hidden states of
// every token row, the float32 logits of the l.Dims.Rows logits rows into the workspace's
// Logits, and, with sample, each row's token chosen on the device (with its logprob and
// top alternatives) into Sampled, Logprobs and Top*, under the token masks uploaded to
// TokenMask for the rows l.MaskStart gives one (every step reads them: a graph captured
// for a step without masks applies the masks of a later one). decodeOnly says every sequence has
// one query, so the prefill attention kernel is skipped.
func (m *Dense) Forward(c *cudart.Ctx, s *cudart.Stream, l *PlanLayout, decodeOnly, sample bool) error {
	cfg, k := m.Config, m.k
	plan := m.planPtr()
	in := func(sec Section) cudart.DevicePtr { return plan.Add(sec.Off) }
	// The whole step's layout and inputs: l's, but for a context-parallel split step
	// (cp.go), where l is the rank's chunk and the whole plan is the group's upload.
	full, fin := l, in
	var cps *cpStep
	if m.cp != nil && m.cp.step != nil {
		cps = m.cp.step
		full = cps.full
		fin = func(sec Section) cudart.DevicePtr { return cps.plan.Add(sec.Off) }
		if cps.local == 0 {
			return m.cpIdle(c, s, sample)
		}
	}
	t, b, r := l.Dims.Tokens, l.Dims.Seqs, full.Dims.Rows
	if t > m.ws.PlanLayout.Dims.Tokens || b > m.ws.PlanLayout.Dims.Seqs || r > m.ws.PlanLayout.Dims.Rows || l.Size > m.ws.Plan.Len {
		return fmt.Errorf("gpurunner: step of %+v exceeds the workspace sized for %+v", l.Dims, m.ws.PlanLayout.Dims)
	}
	ws := func(sec Section) cudart.DevicePtr { return m.work.Ptr.Add(sec.Off) }
	wt := func(sec Section) cudart.DevicePtr { return m.weights.Ptr.Add(sec.Off) }
	gemm := m.gemmOn(c, s)
	// rowParallel is the o and down GEMMs into bf16 out; under tensor parallelism the
	// rank's partial product is summed over the group in float32 first, so that it is
	// rounded to bf16 once, as on one GPU.
	rowParallel := func(out, x, w cudart.DevicePtr, rows, in, outDim int) error {
		if m.tp == nil {
			return gemm(out, x, w, rows, in, outDim, false)
		}
		if err := gemm(m.tp.partial, x, w, rows, in, outDim, true); err != nil {
			return err
		}
		if err := m.tp.comm.AllReduce(m.tp.partial, m.tp.partial, rows*outDim, cudart.F32, cudart.Sum, s); err != nil {
			return fmt.Errorf("tp all-reduce: %w", err)
		}
		return k.CastBF16(c, s, out, m.tp.partial, rows*outDim)
	}
	h, eps := cfg.Hidden, cfg.RMSNormEps
	residual, normed, qkv, attn, proj := ws(m.ws.Residual), ws(m.ws.Normed), ws(m.ws.QKV), ws(m.ws.Attn), ws(m.ws.Proj)
	rope := m.ropeTable()
	split, err := decodeSplit(cfg, b, m.sms)
	if err != nil {
		return err
	}
	if need := cuda.DecodeWorkspaceBytes(b, cfg.Heads, cfg.HeadDim, split.Parts); need > m.ws.Partials.Len {
		return fmt.Errorf("gpurunner: decode split %+v of %d sequences needs %d bytes of partials, the workspace has %d", split, b, need, m.ws.Partials.Len)
	}
	// A vocab-parallel rank's token ids arrive shifted to its shard (shardTokens), an id
	// outside it as -1, which the gather turns into a zero row; the ranks' rows summed
	// are the embeddings (x + 0 is exact in any order).
	if err := k.EmbeddingBF16(c, s, residual, wt(m.wl.Embed), in(l.Tokens), t, h, cfg.VocabRows()); err != nil {
		return fmt.Errorf("embedding: %w", err)
	}
	if m.tp != nil && cfg.VocabShard > 0 {
		if err := m.tp.comm.AllReduce(residual, residual, t*h, cudart.BF16, cudart.Sum, s); err != nil {
			return fmt.Errorf("embedding: tp all-reduce: %w", err)
		}
	}
	if err := m.tapAt(c, s, -1, residual, t); err != nil {
		return err
	}
	kvOff := int64(cfg.QDim()) * 2
	if cps != nil { // the rank's q/k/v rows go to its place in the gathered buffer
		qkv = m.cp.qkv.Ptr.Add(int64(m.cp.rank) * int64(cps.tmax) * int64(cfg.QKVDim()) * 2)
	}
	for i := range m.wl.Layers {
		lw := &m.wl.Layers[i]
		batch := cuda.PagedBatch{
			Out: attn, Q: qkv, KCache: m.cache, VCache: m.cache, QueryStart: in(l.QueryStart), SeqLens: in(l.CtxLens),
			PageTableStart: in(l.PageTableStart[0]), PageTable: in(l.PageTable[0]), Layout: m.layers[i],
			Batch: b, Tokens: t, Heads: cfg.Heads, KVHeads: cfg.KVHeads, HeadDim: cfg.HeadDim, QStride: cfg.QKVDim(),
			PageTokens: cfg.PageTokens, Scale: float32(1 / math.Sqrt(float64(cfg.HeadDim))), Window: cfg.Window,
		}
		var err error
		if i == 0 {
			err = k.RMSNormBF16(c, s, normed, residual, wt(lw.AttnNorm), t, h, eps)
		} else {
			err = k.AddRMSNorm(c, s, cuda.BF16, normed, residual, proj, wt(lw.AttnNorm), t, h, eps)
			if err == nil { // residual is now layer i−1's output
				err = m.tapAt(c, s, i-1, residual, t)
			}
		}
		if err == nil {
			err = gemm(qkv, normed, wt(lw.QKV), t, h, cfg.QKVDim(), false)
		}
		// The Qwen variants, in models/llama's order: q/k/v biases, then the per-head q and
		// k norms, then rotary.
		if err == nil && cfg.QKVBias {
			err = k.AddBiasBF16(c, s, qkv, wt(lw.QKVBias), t, cfg.QKVDim())
		}
		if err == nil && cfg.QKNorm {
			err = k.HeadRMSNormBF16(c, s, cuda.HeadRMSNorm{
				X: qkv, QW: wt(lw.QNorm), KW: wt(lw.KNorm), Tokens: t, Heads: cfg.Heads, KVHeads: cfg.KVHeads,
				HeadDim: cfg.HeadDim, Stride: cfg.QKVDim(), Eps: eps,
			})
		}
		if err == nil && cps != nil {
			err = m.cpGather(s, m.cp.qkv.Ptr, cfg.QKVDim())
			if err == nil {
				err = m.cpRope(c, s, i, rope)
			}
		} else if err == nil {
			err = k.RopeKV(c, s, cuda.RopeKV{
				Q: qkv, K: qkv.Add(kvOff), V: qkv.Add(kvOff + int64(cfg.KVDim())*2), Cache: m.cache,
				Positions: in(l.Positions), Slots: in(l.Slots[0]), Rope: rope, Layout: m.layers[i], DType: cuda.BF16,
				Tokens: t, Heads: cfg.Heads, KVHeads: cfg.KVHeads, HeadDim: cfg.HeadDim,
				QStride: cfg.QKVDim(), KVStride: cfg.QKVDim(), PageTokens: cfg.PageTokens,
			})
		}
		if err == nil {
			err = k.DecodeAttention(c, s, batch, split, ws(m.ws.Partials))
		}
		if err == nil && !decodeOnly {
			err = k.PrefillAttention(c, s, batch, true)
		}
		if err == nil {
			err = rowParallel(proj, attn, wt(lw.O), t, cfg.QDim(), h)
		}
		if err == nil && cfg.OBias {
			err = k.AddBiasBF16(c, s, proj, wt(lw.OBias), t, h)
		}
		if err == nil {
			err = k.AddRMSNorm(c, s, cuda.BF16, normed, residual, proj, wt(lw.MLPNorm), t, h, eps)
		}
		if err == nil {
			err = gemm(ws(m.ws.GateUp), normed, wt(lw.GateUp), t, h, 2*cfg.Intermediate, false)
		}
		if err == nil {
			err = k.SiLUMulBF16(c, s, ws(m.ws.Act), ws(m.ws.GateUp), t, cfg.Intermediate)
		}
		if err == nil {
			err = rowParallel(proj, ws(m.ws.Act), wt(lw.Down), t, cfg.Intermediate, h)
		}
		if err != nil {
			return fmt.Errorf("layer %d: %w", i, err)
		}
	}
	if r == 0 {
		return nil
	}
	// The last MLP's output joins the residual and the final norm runs over every row (one
	// fused pass); only the logits rows, gathered, go through the head.
	if cps == nil {
		err = firstErr(
			k.AddRMSNorm(c, s, cuda.BF16, normed, residual, proj, wt(m.wl.Norm), t, h, eps),
			k.EmbeddingBF16(c, s, ws(m.ws.Rows), normed, in(l.LogitsIndices), r, h, t),
		)
	} else { // every rank's normed rows gathered, the plan's logits rows taken from them
		err = k.AddRMSNorm(c, s, cuda.BF16, m.cp.hidden.Ptr.Add(int64(m.cp.rank)*int64(cps.tmax)*int64(h)*2), residual, proj, wt(m.wl.Norm), t, h, eps)
	}
	if err != nil {
		return fmt.Errorf("head: %w", err)
	}
	return m.logitsOf(c, s, full, fin, gemm, sample)
}

// ropeTable is the model's rotary table on the device.
func (m *Dense) ropeTable() cuda.Rope {
	cfg := m.Config
	return cuda.Rope{Cos: m.rope.Ptr, Sin: m.rope.Ptr.Add(int64(len(cfg.RopeCos)) * 4), Dim: cfg.RopeDim, MaxPos: cfg.MaxContext}
}

// gemmOn returns the model's GEMM on s: out [rows, outDim] = x [rows, in] · w [outDim,
// in]ᵀ, bf16 in, bf16 out (float32 with f32).
func (m *Dense) gemmOn(c *cudart.Ctx, s *cudart.Stream) func(out, x, w cudart.DevicePtr, rows, in, outDim int, f32 bool) error {
	return func(out, x, w cudart.DevicePtr, rows, in, outDim int, f32 bool) error {
		ot := cudart.BF16
		if f32 {
			ot = cudart.F32
		}
		g := cudart.GemmSpec{M: rows, N: outDim, K: in, TransB: true, AType: cudart.BF16, BType: cudart.BF16, OutType: ot, Alpha: 1}
		return m.blas.Gemm(c, s, g, x, w, 0, out)
	}
}

// logitsOf computes the logits rows of the step laid out by full (inputs at fin) into
// the workspace's Logits, from the normed rows in Rows (one GPU) or, for a split step,
// from every rank's normed rows gathered in the cp group's hidden buffer; then, with
// sample, samples them.
func (m *Dense) logitsOf(c *cudart.Ctx, s *cudart.Stream, full *PlanLayout, fin func(Section) cudart.DevicePtr,
	gemm func(out, x, w cudart.DevicePtr, rows, in, outDim int, f32 bool) error, sample bool) error {
	cfg, k, r := m.Config, m.k, full.Dims.Rows
	if r == 0 { // a prompt's chunk before its last: every rank skips the head's gather alike
		return nil
	}
	ws := func(sec Section) cudart.DevicePtr { return m.work.Ptr.Add(sec.Off) }
	var err error
	if m.cp != nil && m.cp.step != nil {
		st := m.cp.step
		err = m.cpGather(s, m.cp.hidden.Ptr, cfg.Hidden)
		if err == nil {
			err = k.EmbeddingBF16(c, s, ws(m.ws.Rows), m.cp.hidden.Ptr, fin(full.LogitsIndices), r, cfg.Hidden, st.tokens)
		}
	}
	if err == nil {
		err = m.head(c, s, ws(m.ws.Logits), ws(m.ws.Rows), m.weights.Ptr.Add(m.wl.Head.Off), r, gemm)
	}
	if err == nil && sample {
		err = k.Sample(c, s, cuda.Sample{
			Tokens: ws(m.ws.Sampled), Logprobs: ws(m.ws.Logprobs), TopIDs: ws(m.ws.TopIDs), TopLogprobs: ws(m.ws.TopLogprobs),
			Logits: ws(m.ws.Logits), Params: fin(full.Sampling), Rows: r, Vocab: cfg.Vocab, MaxTop: cuda.MaxSampleTop,
			TokenMask: ws(m.ws.TokenMask), MaskStart: fin(full.MaskStart), MaskWords: cuda.MaskWords(cfg.Vocab),
		})
	}
	if err != nil {
		return fmt.Errorf("head: %w", err)
	}
	return nil
}

// cpIdle is the forward of a context-parallel rank whose chunk of a split step is empty:
// it joins every layer's gather (sending no rows of its own) and writes the plan's keys
// and values into its cache, then, where the step has logits rows, the head's gather,
// and computes and samples the logits as the others do (logitsOf).
func (m *Dense) cpIdle(c *cudart.Ctx, s *cudart.Stream, sample bool) error {
	cfg, st := m.Config, m.cp.step
	rope := m.ropeTable()
	for i := range m.wl.Layers {
		if err := m.cpGather(s, m.cp.qkv.Ptr, cfg.QKVDim()); err != nil {
			return fmt.Errorf("layer %d: %w", i, err)
		}
		if err := m.cpRope(c, s, i, rope); err != nil {
			return fmt.Errorf("layer %d: %w", i, err)
		}
	}
	fin := func(sec Section) cudart.DevicePtr { return st.plan.Add(sec.Off) }
	return m.logitsOf(c, s, st.full, fin, m.gemmOn(c, s), sample)
}

// head computes the float32 logits [r, Vocab] of the r normed rows into logits. A
// vocab-parallel rank computes its shard's [r, VocabShard] into its part of the gathered
// buffer, all-gathers the group's shards there in place ([size][r, VocabShard]) and
// copies each shard's real columns into its columns of logits, one strided copy per
// rank, as vLLM's ParallelLMHead gathers and drops the padding: every rank then holds the
// whole logits, bit for bit the same.
func (m *Dense) head(c *cudart.Ctx, s *cudart.Stream, logits, rows, head cudart.DevicePtr, r int,
	gemm func(out, x, w cudart.DevicePtr, rows, in, outDim int, f32 bool) error) error {
	cfg := m.Config
	if m.tp == nil || cfg.VocabShard == 0 {
		return gemm(logits, rows, head, r, cfg.Hidden, cfg.Vocab, true)
	}
	size, shard := m.tp.comm.Ranks, int64(cfg.VocabShard)
	block := int64(r) * shard * 4 // one rank's [r, VocabShard] float32
	mine := m.tp.gathered.Add(int64(m.tp.comm.Rank) * block)
	if err := gemm(mine, rows, head, r, cfg.Hidden, cfg.VocabShard, true); err != nil {
		return err
	}
	if err := m.tp.comm.AllGather(mine, m.tp.gathered, r*cfg.VocabShard, cudart.F32, s); err != nil {
		return fmt.Errorf("tp all-gather: %w", err)
	}
	return NewVocabShard(cfg.Vocab, m.tp.comm.Rank, size).UnshardOnDevice(c, s, logits, m.tp.gathered, r, r)
}

// decodeSplit is the decode attention's split of a step of b sequences on a GPU of sms
// multiprocessors. It is fixed by the step's shape (a graph replays it), sized for the
// most keys a query reads: the longest context the model serves, or its sliding window
// when that is shorter (partitions past the window would hold no key).
func decodeSplit(cfg *DenseConfig, b, sms int) (cuda.DecodeSplit, error) {
	keys := cfg.MaxContext
	if cfg.Window > 0 {
		keys = min(keys, cfg.Window)
	}
	return cuda.ChooseDecodeSplit(b, cfg.KVHeads, keys, max(sms, 1))
}

func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
