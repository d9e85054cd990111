package llama

import (
	"fmt"
	"math"

	"github.com/resin-llm/resin/core/dspark"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kernels/ref"
)

// Model is a loaded model with its rotary table and scratch buffers. It is the reference
// forward: plain calls into core/kernels/ref, the oracle the CUDA kernels are checked
// against. Not safe for concurrent use.
type Model struct {
	Config *Config
	W      *Weights
	// DType is the form the projections (attention, MLP, head) are multiplied in: fp32,
	// bf16 or int8 (ref.DType); embeddings, norms, activations and the cache stay fp32.
	DType ref.DType
	// Attend, when set, is each layer's attention in place of the cache's: it gets the
	// layer's queries (q, [tokens, heads·headDim]), keys and values (k, v, [tokens,
	// kvHeads·headDim]) of the plan's tokens, RoPE applied, writes att ([tokens,
	// heads·headDim]) and keeps the keys and values where it wants (core/dist/cp's
	// prefill runner sets it; Forward's kv is then not touched and may be nil). nil: the
	// keys and values go into kv at the plan's slots and the queries attend the cache.
	Attend func(layer int, q, k, v, att []float32) error
	rope   *ref.RopeTable
	proj   []projections
	head   *ref.Weight

	x, h, qkv, q, k, v, att, o, gateUp, act, rows []float32
	batch                                         ref.AttentionBatch
	ctxLen                                        []int32
	pages                                         []uint32
}

// projections are a layer's weights as the forward multiplies them, in the model's dtype.
type projections struct {
	qkv, o, gateUp, down *ref.Weight
}

// NewModel prepares a model for contexts up to maxContext tokens, multiplying in fp32. It
// lays w's projections out as the forward's GEMMs read them (Layer.fuse): the values do
// not change.
func NewModel(c *Config, w *Weights, maxContext int) (*Model, error) {
	return NewModelDType(c, w, maxContext, ref.DTypeFP32)
}

// NewModelDType is NewModel multiplying the projections in dt: fp32 reads w's slices, bf16
// and int8 hold copies in their form (w's float32 projections stay, for tests that read
// them; Load drops them).
func NewModelDType(c *Config, w *Weights, maxContext int, dt ref.DType) (*Model, error) {
	rope, err := c.RopeTable(maxContext)
	if err != nil {
		return nil, err
	}
	m := &Model{Config: c, W: w, DType: dt, rope: rope, proj: make([]projections, len(w.Layers))}
	hd, d, inter := c.HiddenSize, c.HeadDim, c.IntermediateSize
	qd, kvd := c.NumAttentionHeads*d, c.NumKeyValueHeads*d
	for l := range w.Layers {
		lw, p := &w.Layers[l], &m.proj[l]
		lw.fuse()
		for _, x := range []struct {
			dst  **ref.Weight
			w    []float32
			n, k int
		}{{&p.qkv, lw.QKV, qd + 2*kvd, hd}, {&p.o, lw.O, hd, qd}, {&p.gateUp, lw.GateUp, 2 * inter, hd}, {&p.down, lw.Down, hd, inter}} {
			if *x.dst, err = ref.NewWeight(x.w, x.n, x.k, dt); err != nil {
				return nil, fmt.Errorf("layer %d: %w", l, err)
			}
		}
	}
	if m.head, err = ref.NewWeight(w.Head, c.VocabSize, hd, dt); err != nil {
		return nil, fmt.Errorf("lm head: %w", err)
	}
	return m, nil
}

// WeightBytes is the memory the projections and head take in the model's dtype.
func (m *Model) WeightBytes() int64 {
	n := m.head.Bytes()
	for _, p := range m.proj {
		n += p.qkv.Bytes() + p.o.Bytes() + p.gateUp.Bytes() + p.down.Bytes()
	}
	return n
}

// MaxContext returns the longest sequence the model's rotary table covers.
func (m *Model) MaxContext() int { return m.rope.MaxPos }

// Forward runs the plan's tokens through the model, writing their keys and values into kv
// at the plan's slots, and writes the logits of the rows listed in plan.LogitsIndices to
// logits ([len(LogitsIndices), vocab]).
func (m *Model) Forward(plan *engine.BatchPlan, kv *KVCache, logits []float32) error {
	return m.ForwardTap(plan, kv, logits, nil)
}

// ForwardTap is Forward that also hands tap (nil: none) the residual stream of its rows
// after the embeddings (layer −1) and after each decoder layer: the features a DSpark
// drafter reads (core/dspark).
func (m *Model) ForwardTap(plan *engine.BatchPlan, kv *KVCache, logits []float32, tap *dspark.FeatureTap) error {
	c, w := m.Config, m.W
	t := plan.NumTokens()
	hd, d, inter := c.HiddenSize, c.HeadDim, c.IntermediateSize
	nh, nkv := c.NumAttentionHeads, c.NumKeyValueHeads
	qd, kvd := nh*d, nkv*d
	eps := float32(c.RMSNormEps)
	if len(plan.Groups) < 1 {
		return fmt.Errorf("forward: the plan has no cache group")
	}
	for _, p := range plan.Positions {
		if p < 0 || int(p) >= m.rope.MaxPos {
			return fmt.Errorf("forward: position %d outside the context of %d tokens", p, m.rope.MaxPos)
		}
	}
	if r := len(plan.LogitsIndices); len(logits) != r*c.VocabSize {
		return fmt.Errorf("forward: logits holds %d values, want %d rows × %d", len(logits), r, c.VocabSize)
	}
	grow := func(b *[]float32, n int) []float32 {
		if cap(*b) < n {
			*b = make([]float32, n)
		}
		*b = (*b)[:n]
		return *b
	}
	x, h := grow(&m.x, t*hd), grow(&m.h, t*hd)
	qkv := grow(&m.qkv, t*(qd+2*kvd))
	q, k, v := grow(&m.q, t*qd), grow(&m.k, t*kvd), grow(&m.v, t*kvd)
	att, o := grow(&m.att, t*qd), grow(&m.o, t*hd)
	gateUp, act := grow(&m.gateUp, t*2*inter), grow(&m.act, t*inter)
	slots := plan.Groups[0].SlotMapping
	attn := ref.Attention{Heads: nh, Scale: float32(1 / math.Sqrt(float64(d))), Window: c.Window}
	batch := m.attentionBatch(plan)

	if err := firstErr(ref.Embedding(x, w.Embed, plan.Tokens, hd), tap.Capture(-1, x)); err != nil {
		return fmt.Errorf("forward: %w", err)
	}
	for l := range w.Layers {
		lw, p := &w.Layers[l], &m.proj[l]
		// One GEMM for q, k and v of every token, then each row split three ways.
		err := firstErr(
			ref.RMSNorm(h, x, lw.AttnNorm, t, hd, eps),
			p.qkv.MatMulT(qkv, h, t),
		)
		if err != nil {
			return fmt.Errorf("forward: layer %d: %w", l, err)
		}
		for r := range t {
			row := qkv[r*(qd+2*kvd) : (r+1)*(qd+2*kvd)]
			copy(q[r*qd:(r+1)*qd], row[:qd])
			copy(k[r*kvd:(r+1)*kvd], row[qd:qd+kvd])
			copy(v[r*kvd:(r+1)*kvd], row[qd+kvd:])
		}
		addBias(q, lw.QBias, t)
		addBias(k, lw.KBias, t)
		addBias(v, lw.VBias, t)
		if c.QKNorm {
			if err := firstErr(ref.RMSNorm(q, q, lw.QNorm, t*nh, d, eps), ref.RMSNorm(k, k, lw.KNorm, t*nkv, d, eps)); err != nil {
				return fmt.Errorf("forward: layer %d: %w", l, err)
			}
		}
		if err := firstErr(m.rope.RoPENeoX(q, plan.Positions, t, nh, d), m.rope.RoPENeoX(k, plan.Positions, t, nkv, d)); err != nil {
			return fmt.Errorf("forward: layer %d: %w", l, err)
		}
		if m.Attend != nil {
			err = m.Attend(l, q, k, v, att)
		} else {
			err = firstErr(kv.Layers[l].StoreKV(k, v, slots), ref.PagedAttentionBatch(att, q, &kv.Layers[l], batch, attn))
		}
		if err != nil {
			return fmt.Errorf("forward: layer %d: %w", l, err)
		}
		if err := p.o.MatMulT(o, att, t); err != nil {
			return fmt.Errorf("forward: layer %d: %w", l, err)
		}
		addBias(o, lw.OBias, t)
		err = firstErr(
			ref.Add(x, x, o),
			ref.RMSNorm(h, x, lw.MLPNorm, t, hd, eps),
			p.gateUp.MatMulT(gateUp, h, t),
			ref.SiLUMul(act, gateUp, t, inter),
			p.down.MatMulT(o, act, t),
			ref.Add(x, x, o),
			tap.Capture(l, x),
		)
		if err != nil {
			return fmt.Errorf("forward: layer %d: %w", l, err)
		}
	}
	r := len(plan.LogitsIndices)
	rows := grow(&m.rows, r*hd)
	for j, idx := range plan.LogitsIndices {
		if idx < 0 || int(idx) >= t {
			return fmt.Errorf("forward: logits row %d outside the plan's %d tokens", idx, t)
		}
		copy(rows[j*hd:(j+1)*hd], x[int(idx)*hd:(int(idx)+1)*hd])
	}
	if err := firstErr(ref.RMSNorm(rows, rows, w.Norm, r, hd, eps), m.head.MatMulT(logits, rows, r)); err != nil {
		return fmt.Errorf("forward: head: %w", err)
	}
	return nil
}

// attentionBatch lays out the plan's sequences for ref.PagedAttentionBatch, once for all
// layers: each sequence's queries, its context (computed tokens plus the new ones) and its
// page table in group 0.
func (m *Model) attentionBatch(plan *engine.BatchPlan) *ref.AttentionBatch {
	g := &plan.Groups[0]
	m.ctxLen, m.pages = m.ctxLen[:0], m.pages[:0]
	for i := range plan.NumSeqs() {
		m.ctxLen = append(m.ctxLen, plan.Computed[i]+plan.QueryStart[i+1]-plan.QueryStart[i])
	}
	for _, p := range g.PageTable {
		m.pages = append(m.pages, uint32(p))
	}
	m.batch = ref.AttentionBatch{QueryStart: plan.QueryStart, CtxLen: m.ctxLen, PageStart: g.PageTableStart, Pages: m.pages}
	return &m.batch
}

// addBias adds bias to each of the rows of x; a nil bias adds nothing.
func addBias(x, bias []float32, rows int) {
	if bias == nil {
		return
	}
	n := len(bias)
	for r := 0; r < rows; r++ {
		row := x[r*n : (r+1)*n]
		for i := range row {
			row[i] += bias[i]
		}
	}
}

func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
