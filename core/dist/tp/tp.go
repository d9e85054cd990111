// Package tp runs a llama-family dense decoder with tensor parallelism over a
// dist.Communicator, on the CPU reference kernels (core/kernels/ref). Each rank holds a
// Shard of the weights, Megatron's layout:
//
//   - q/k/v and gate/up are column-parallel: a rank holds Heads/size query heads,
//     KVHeads/size key/value heads (their cache too) and Inter/size MLP columns;
//   - o and down are row-parallel: each rank's partial product is summed by an
//     all-reduce (in rank order, so every rank has the same bits), then the bias added;
//   - the embedding and the LM head are vocab-parallel: a rank holds a contiguous range of
//     rows (the last range may be shorter); the embedding's partial lookups (zeros for
//     the other ranks' tokens) are all-reduced, the head's logits all-gathered.
//
// The models' packages fill Dense and Weights from their own (models/llama: see this
// package's tests); the norms are replicated. Sampling is the caller's: rank 0 samples
// and broadcasts the step's tokens, so all ranks feed the same next step.
package tp

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kernels/ref"
)

// Dense is the shape of a llama-family decoder.
type Dense struct {
	Hidden, HeadDim, Heads, KVHeads, Inter, Vocab, Layers int
	Eps                                                   float32
	QKNorm                                                bool
	Window                                                int // sliding window, 0 = none
	Rope                                                  *ref.RopeTable
}

// Layer is one decoder layer, row-major as in the checkpoint (a Linear is [out, in]);
// optional tensors are nil.
type Layer struct {
	AttnNorm, MLPNorm   []float32
	Q, K, V, O          []float32
	QBias, KBias, VBias []float32
	OBias               []float32
	QNorm, KNorm        []float32
	Gate, Up, Down      []float32
}

// Weights is the whole model (or, in a Shard, one rank's slices of it).
type Weights struct {
	Embed  []float32 // [vocab, hidden]
	Layers []Layer
	Norm   []float32
	Head   []float32 // [vocab, hidden]
}

// Shard is one rank's part of the model.
type Shard struct {
	D                Dense
	Rank, Size       int
	heads, kvHeads   int // this rank's
	inter            int
	vocabLo, vocabHi int
	embed, head      []float32
	norm             []float32
	layers           []shardLayer

	x, h, qkv, q, k, v, att, o, gateUp, act, rows, part []float32
	ctxLen                                              []int32
	pages                                               []uint32
	batch                                               ref.AttentionBatch
}

type shardLayer struct {
	attnNorm, mlpNorm   []float32
	qkv                 []float32 // [(heads+2·kvHeads)·headDim (this rank's), hidden]
	qBias, kBias, vBias []float32
	oBias               []float32
	qNorm, kNorm        []float32
	o                   []float32 // [hidden, heads·headDim (this rank's)]
	gateUp              []float32 // [2·inter (this rank's), hidden]
	down                []float32 // [hidden, inter (this rank's)]
}

// VocabRange returns rank's rows [lo, hi) of a vocab split over size ranks: ceil-sized
// ranges, the last one shorter (or empty).
func VocabRange(vocab, rank, size int) (lo, hi int) {
	per := (vocab + size - 1) / size
	return min(rank*per, vocab), min((rank+1)*per, vocab)
}

// NewShard cuts rank's slices of w (the whole model) for a group of size ranks. Heads,
// KV heads and Inter must divide by size.
func NewShard(d Dense, w *Weights, rank, size int) (*Shard, error) {
	if len(w.Layers) != d.Layers {
		return nil, fmt.Errorf("tp: %d layers of weights for %d", len(w.Layers), d.Layers)
	}
	return LoadShard(d, memorySource(w), rank, size)
}

// Source holds a llama-family model's tensors by their HF names (model.embed_tokens.weight,
// model.layers.N.self_attn.q_proj.weight, …, lm_head.weight; a missing lm_head is tied to
// the embeddings, missing biases are none) and reads a whole tensor, or rows or columns
// of one, each checked against the tensor's whole shape. core/weights' Checkpoint is one:
// it reads only the slice's bytes.
type Source interface {
	Has(name string) bool
	Float32(name string, shape ...int) ([]float32, error)
	Float32Rows(name string, lo, hi int, shape ...int) ([]float32, error)
	Float32Cols(name string, lo, hi int, shape ...int) ([]float32, error)
}

// CheckSize refuses a TP group of size ranks that the model's heads, KV heads and
// intermediate size do not all divide by, before any rank starts.
func (d Dense) CheckSize(size int) error {
	if size < 1 || d.Heads%size != 0 || d.KVHeads%size != 0 || d.Inter%size != 0 {
		return fmt.Errorf("tp: %d heads, %d kv heads and intermediate %d do not all divide by tp=%d", d.Heads, d.KVHeads, d.Inter, size)
	}
	return nil
}

// LoadShard reads rank's slices of the model in src for a group of size ranks: its rows
// of q/k/v, gate/up, the embedding and the head, its columns of o and down, and the
// norms whole, so a rank reads about 1/size of the projections. Heads, KV heads and Inter
// must divide by size.
func LoadShard(d Dense, src Source, rank, size int) (*Shard, error) {
	if size < 1 || rank < 0 || rank >= size {
		return nil, fmt.Errorf("tp: rank %d of %d", rank, size)
	}
	if err := d.CheckSize(size); err != nil {
		return nil, err
	}
	if d.Rope == nil {
		return nil, fmt.Errorf("tp: no rope table")
	}
	hd, hdim := d.Hidden, d.HeadDim
	s := &Shard{D: d, Rank: rank, Size: size, heads: d.Heads / size, kvHeads: d.KVHeads / size, inter: d.Inter / size}
	s.vocabLo, s.vocabHi = VocabRange(d.Vocab, rank, size)
	var err error
	// first keeps the first error; the reads after it return nil and are not used.
	first := func(v []float32, e error) []float32 {
		if err == nil {
			err = e
		}
		return v
	}
	optional := func(name string, lo, hi, n int) []float32 {
		if !src.Has(name) {
			return nil
		}
		return first(src.Float32Rows(name, lo, hi, n))
	}
	s.embed = first(src.Float32Rows("model.embed_tokens.weight", s.vocabLo, s.vocabHi, d.Vocab, hd))
	if src.Has("lm_head.weight") {
		s.head = first(src.Float32Rows("lm_head.weight", s.vocabLo, s.vocabHi, d.Vocab, hd))
	} else {
		s.head = s.embed // tied
	}
	s.norm = first(src.Float32("model.norm.weight", hd))
	qd, kvd := d.Heads*hdim, d.KVHeads*hdim
	ql, kl := s.heads*hdim, s.kvHeads*hdim
	q0, k0, i0 := rank*ql, rank*kl, rank*s.inter
	for l := range d.Layers {
		p := fmt.Sprintf("model.layers.%d.", l)
		lw := shardLayer{
			attnNorm: first(src.Float32(p+"input_layernorm.weight", hd)),
			mlpNorm:  first(src.Float32(p+"post_attention_layernorm.weight", hd)),
			qBias:    optional(p+"self_attn.q_proj.bias", q0, q0+ql, qd),
			kBias:    optional(p+"self_attn.k_proj.bias", k0, k0+kl, kvd),
			vBias:    optional(p+"self_attn.v_proj.bias", k0, k0+kl, kvd),
			o:        first(src.Float32Cols(p+"self_attn.o_proj.weight", q0, q0+ql, hd, qd)),
			down:     first(src.Float32Cols(p+"mlp.down_proj.weight", i0, i0+s.inter, hd, d.Inter)),
		}
		if src.Has(p + "self_attn.o_proj.bias") {
			lw.oBias = first(src.Float32(p+"self_attn.o_proj.bias", hd))
		}
		if d.QKNorm {
			lw.qNorm = first(src.Float32(p+"self_attn.q_norm.weight", hdim))
			lw.kNorm = first(src.Float32(p+"self_attn.k_norm.weight", hdim))
		}
		lw.qkv = slices.Concat(
			first(src.Float32Rows(p+"self_attn.q_proj.weight", q0, q0+ql, qd, hd)),
			first(src.Float32Rows(p+"self_attn.k_proj.weight", k0, k0+kl, kvd, hd)),
			first(src.Float32Rows(p+"self_attn.v_proj.weight", k0, k0+kl, kvd, hd)))
		lw.gateUp = slices.Concat(
			first(src.Float32Rows(p+"mlp.gate_proj.weight", i0, i0+s.inter, d.Inter, hd)),
			first(src.Float32Rows(p+"mlp.up_proj.weight", i0, i0+s.inter, d.Inter, hd)))
		if err != nil {
			return nil, fmt.Errorf("tp: rank %d of %d: %w", rank, size, err)
		}
		s.layers = append(s.layers, lw)
	}
	if err != nil {
		return nil, fmt.Errorf("tp: rank %d of %d: %w", rank, size, err)
	}
	return s, nil
}

// memory is a Source over a whole model in memory (Weights): rows are views of its
// slices, columns copies.
type memory map[string][]float32

func memorySource(w *Weights) memory {
	m := memory{"model.embed_tokens.weight": w.Embed, "model.norm.weight": w.Norm}
	if len(w.Head) > 0 && (len(w.Embed) == 0 || &w.Head[0] != &w.Embed[0]) {
		m["lm_head.weight"] = w.Head
	}
	for l, lw := range w.Layers {
		p := fmt.Sprintf("model.layers.%d.", l)
		for name, v := range map[string][]float32{
			"input_layernorm.weight": lw.AttnNorm, "post_attention_layernorm.weight": lw.MLPNorm,
			"self_attn.q_proj.weight": lw.Q, "self_attn.k_proj.weight": lw.K, "self_attn.v_proj.weight": lw.V,
			"self_attn.o_proj.weight": lw.O, "self_attn.q_proj.bias": lw.QBias, "self_attn.k_proj.bias": lw.KBias,
			"self_attn.v_proj.bias": lw.VBias, "self_attn.o_proj.bias": lw.OBias,
			"self_attn.q_norm.weight": lw.QNorm, "self_attn.k_norm.weight": lw.KNorm,
			"mlp.gate_proj.weight": lw.Gate, "mlp.up_proj.weight": lw.Up, "mlp.down_proj.weight": lw.Down,
		} {
			if v != nil {
				m[p+name] = v
			}
		}
	}
	return m
}

func (m memory) Has(name string) bool { return m[name] != nil }

func (m memory) get(name string, shape []int) ([]float32, error) {
	v, ok := m[name]
	if !ok {
		return nil, fmt.Errorf("tensor %q missing", name)
	}
	n := 1
	for _, d := range shape {
		n *= d
	}
	if len(v) != n {
		return nil, fmt.Errorf("tensor %q holds %d values, not the shape %v", name, len(v), shape)
	}
	return v, nil
}

func (m memory) Float32(name string, shape ...int) ([]float32, error) { return m.get(name, shape) }

func (m memory) Float32Rows(name string, lo, hi int, shape ...int) ([]float32, error) {
	v, err := m.get(name, shape)
	if err != nil {
		return nil, err
	}
	row := len(v) / max(1, shape[0])
	return v[lo*row : hi*row], nil
}

func (m memory) Float32Cols(name string, lo, hi int, shape ...int) ([]float32, error) {
	v, err := m.get(name, shape)
	if err != nil {
		return nil, err
	}
	rows, cols := shape[0], shape[1]
	out := make([]float32, 0, rows*(hi-lo))
	for r := range rows {
		out = append(out, v[r*cols+lo:r*cols+hi]...)
	}
	return out, nil
}

// KVHeads returns the key/value heads this rank holds (its cache's KVHeads).
func (s *Shard) KVHeads() int { return s.kvHeads }

// Forward runs plan's tokens through this rank's shard, every rank of c (the tp group)
// calling it with the same plan, writing this rank's keys and values into kv (one PagedKV
// per layer, KVHeads() heads) at the plan's slots. Every rank gets the whole logits of the
// rows in plan.LogitsIndices ([rows, vocab]).
func (s *Shard) Forward(c dist.Communicator, plan *engine.BatchPlan, kv []ref.PagedKV, logits []float32) error {
	return s.forward(c, plan, kv, nil, logits)
}

// ForwardAttend is Forward with attend as every layer's attention in place of the
// cache's (core/dist/cp's ModelForward: a chunk of a prompt split over a cp group, each
// rank of c holding the same chunk): attend gets this rank's heads' queries, keys and
// values of the plan's tokens (RoPE applied) and writes their attention; the plan needs
// no page table and no cache is read or written here.
func (s *Shard) ForwardAttend(c dist.Communicator, plan *engine.BatchPlan, attend func(layer int, q, k, v, out []float32) error, logits []float32) error {
	if attend == nil {
		return errors.New("tp: ForwardAttend without an attention")
	}
	return s.forward(c, plan, nil, attend, logits)
}

// CPShape is this rank's attention shape for core/dist/cp: its heads and KV heads.
func (s *Shard) CPShape() (heads, kvHeads, headDim, window int) {
	return s.heads, s.kvHeads, s.D.HeadDim, s.D.Window
}

// forward is Forward on kv, or with attend in place of the cache's attention (kv nil).
func (s *Shard) forward(c dist.Communicator, plan *engine.BatchPlan, kv []ref.PagedKV, attend func(layer int, q, k, v, out []float32) error, logits []float32) error {
	d := s.D
	t := plan.NumTokens()
	hd, hdim := d.Hidden, d.HeadDim
	nh, nkv, inter := s.heads, s.kvHeads, s.inter
	qd, kvd := nh*hdim, nkv*hdim
	if c.Size() != s.Size || c.Rank() != s.Rank {
		return fmt.Errorf("tp: shard %d of %d on communicator rank %d of %d", s.Rank, s.Size, c.Rank(), c.Size())
	}
	if attend == nil && len(kv) != d.Layers {
		return fmt.Errorf("tp: forward: %d cache layers for %d", len(kv), d.Layers)
	}
	if err := s.check(plan, logits); err != nil {
		return err
	}
	grow := func(b *[]float32, n int) []float32 {
		if cap(*b) < n {
			*b = make([]float32, n)
		}
		*b = (*b)[:n]
		return *b
	}
	x, h := grow(&s.x, t*hd), grow(&s.h, t*hd)
	qkv := grow(&s.qkv, t*(qd+2*kvd))
	q, k, v := grow(&s.q, t*qd), grow(&s.k, t*kvd), grow(&s.v, t*kvd)
	att, o := grow(&s.att, t*qd), grow(&s.o, t*hd)
	gateUp, act := grow(&s.gateUp, t*2*inter), grow(&s.act, t*inter)
	slots := plan.Groups[0].SlotMapping
	attn := ref.Attention{Heads: nh, Scale: float32(1 / math.Sqrt(float64(hdim))), Window: d.Window}
	var batch *ref.AttentionBatch
	if attend == nil {
		batch = s.attentionBatch(plan)
	}

	// Vocab-parallel embedding: this rank's rows, zeros for the others', summed.
	clear(x)
	for i, id := range plan.Tokens {
		if id < 0 || int(id) >= d.Vocab {
			return fmt.Errorf("tp: forward: token %d outside the vocabulary of %d", id, d.Vocab)
		}
		if int(id) >= s.vocabLo && int(id) < s.vocabHi {
			copy(x[i*hd:(i+1)*hd], s.embed[(int(id)-s.vocabLo)*hd:])
		}
	}
	if err := dist.AllReduceF32(c, x); err != nil {
		return fmt.Errorf("tp: forward: embedding: %w", err)
	}
	for l := range s.layers {
		lw := &s.layers[l]
		err := firstErr(
			ref.RMSNorm(h, x, lw.attnNorm, t, hd, d.Eps),
			ref.MatMulT(qkv, h, lw.qkv, t, hd, qd+2*kvd),
		)
		if err != nil {
			return fmt.Errorf("tp: forward: layer %d: %w", l, err)
		}
		for r := range t {
			row := qkv[r*(qd+2*kvd) : (r+1)*(qd+2*kvd)]
			copy(q[r*qd:(r+1)*qd], row[:qd])
			copy(k[r*kvd:(r+1)*kvd], row[qd:qd+kvd])
			copy(v[r*kvd:(r+1)*kvd], row[qd+kvd:])
		}
		addBias(q, lw.qBias, t)
		addBias(k, lw.kBias, t)
		addBias(v, lw.vBias, t)
		if d.QKNorm {
			if err := firstErr(ref.RMSNorm(q, q, lw.qNorm, t*nh, hdim, d.Eps), ref.RMSNorm(k, k, lw.kNorm, t*nkv, hdim, d.Eps)); err != nil {
				return fmt.Errorf("tp: forward: layer %d: %w", l, err)
			}
		}
		if err := firstErr(
			d.Rope.RoPENeoX(q, plan.Positions, t, nh, hdim),
			d.Rope.RoPENeoX(k, plan.Positions, t, nkv, hdim),
		); err != nil {
			return fmt.Errorf("tp: forward: layer %d: %w", l, err)
		}
		if attend != nil {
			err = attend(l, q, k, v, att)
		} else {
			err = firstErr(kv[l].StoreKV(k, v, slots), ref.PagedAttentionBatch(att, q, &kv[l], batch, attn))
		}
		if err = firstErr(err, ref.MatMulT(o, att, lw.o, t, qd, hd)); err != nil {
			return fmt.Errorf("tp: forward: layer %d: %w", l, err)
		}
		if err := dist.AllReduceF32(c, o); err != nil {
			return fmt.Errorf("tp: forward: layer %d: o: %w", l, err)
		}
		addBias(o, lw.oBias, t)
		err = firstErr(
			ref.Add(x, x, o),
			ref.RMSNorm(h, x, lw.mlpNorm, t, hd, d.Eps),
			ref.MatMulT(gateUp, h, lw.gateUp, t, hd, 2*inter),
			ref.SiLUMul(act, gateUp, t, inter),
			ref.MatMulT(o, act, lw.down, t, inter, hd),
		)
		if err != nil {
			return fmt.Errorf("tp: forward: layer %d: %w", l, err)
		}
		if err := dist.AllReduceF32(c, o); err != nil {
			return fmt.Errorf("tp: forward: layer %d: down: %w", l, err)
		}
		if err := ref.Add(x, x, o); err != nil {
			return fmt.Errorf("tp: forward: layer %d: %w", l, err)
		}
	}
	r := len(plan.LogitsIndices)
	rows := grow(&s.rows, r*hd)
	for j, idx := range plan.LogitsIndices {
		if idx < 0 || int(idx) >= t {
			return fmt.Errorf("tp: forward: logits row %d outside the plan's %d tokens", idx, t)
		}
		copy(rows[j*hd:(j+1)*hd], x[int(idx)*hd:(int(idx)+1)*hd])
	}
	vl := s.vocabHi - s.vocabLo
	part := grow(&s.part, r*vl)
	if err := firstErr(ref.RMSNorm(rows, rows, s.norm, r, hd, d.Eps), ref.MatMulT(part, rows, s.head, r, hd, vl)); err != nil {
		return fmt.Errorf("tp: forward: head: %w", err)
	}
	parts, err := c.AllGatherV(dist.F32Bytes(part))
	if err != nil {
		return fmt.Errorf("tp: forward: head: %w", err)
	}
	for q, p := range parts {
		lo, hi := VocabRange(d.Vocab, q, s.Size)
		if len(p) != 4*r*(hi-lo) {
			return fmt.Errorf("tp: forward: head: rank %d sent %d bytes of logits, want %d", q, len(p), 4*r*(hi-lo))
		}
		for j := range r {
			for i := range hi - lo {
				off := 4 * (j*(hi-lo) + i)
				logits[j*d.Vocab+lo+i] = math.Float32frombits(uint32(p[off]) | uint32(p[off+1])<<8 | uint32(p[off+2])<<16 | uint32(p[off+3])<<24)
			}
		}
	}
	return nil
}

// check refuses what Forward would refuse before its first collective: every rank sees
// the same plan, so they all refuse it alike, and rank 0 checks before broadcasting it.
func (s *Shard) check(plan *engine.BatchPlan, logits []float32) error {
	d := s.D
	t := plan.NumTokens()
	if len(plan.Groups) < 1 {
		return fmt.Errorf("tp: forward: the plan has no cache group")
	}
	if len(plan.Positions) != t || len(plan.Groups[0].SlotMapping) != t {
		return fmt.Errorf("tp: forward: %d tokens with %d positions and %d slots", t, len(plan.Positions), len(plan.Groups[0].SlotMapping))
	}
	for _, p := range plan.Positions {
		if p < 0 || int(p) >= d.Rope.MaxPos {
			return fmt.Errorf("tp: forward: position %d outside the context of %d tokens", p, d.Rope.MaxPos)
		}
	}
	for _, id := range plan.Tokens {
		if id < 0 || int(id) >= d.Vocab {
			return fmt.Errorf("tp: forward: token %d outside the vocabulary of %d", id, d.Vocab)
		}
	}
	for _, idx := range plan.LogitsIndices {
		if idx < 0 || int(idx) >= t {
			return fmt.Errorf("tp: forward: logits row %d outside the plan's %d tokens", idx, t)
		}
	}
	if r := len(plan.LogitsIndices); len(logits) != r*d.Vocab {
		return fmt.Errorf("tp: forward: logits holds %d values, want %d rows × %d", len(logits), r, d.Vocab)
	}
	return nil
}

func (s *Shard) attentionBatch(plan *engine.BatchPlan) *ref.AttentionBatch {
	g := &plan.Groups[0]
	s.ctxLen, s.pages = s.ctxLen[:0], s.pages[:0]
	for i := range plan.NumSeqs() {
		s.ctxLen = append(s.ctxLen, plan.Computed[i]+plan.QueryStart[i+1]-plan.QueryStart[i])
	}
	for _, p := range g.PageTable {
		s.pages = append(s.pages, uint32(p))
	}
	s.batch = ref.AttentionBatch{QueryStart: plan.QueryStart, CtxLen: s.ctxLen, PageStart: g.PageTableStart, Pages: s.pages}
	return &s.batch
}

// NewCache returns this rank's paged cache for up to pages pages of pageTokens tokens:
// its KVHeads() heads, each page id given the next free page the first time it is seen
// (so the engine's page ids, whatever their bits, index it). A page past the capacity
// maps outside the arrays, which the attention kernels report as an error.
func (s *Shard) NewCache(pages, pageTokens int) []ref.PagedKV {
	e := pageTokens * s.kvHeads * s.D.HeadDim
	stride := 2 * e * s.D.Layers
	arena := make([]float32, pages*stride)
	index := map[uint32]int{}
	at := func(page uint32) int {
		i, ok := index[page]
		if !ok {
			i = len(index)
			index[page] = i
		}
		if i >= pages {
			return len(arena)
		}
		return i * stride
	}
	out := make([]ref.PagedKV, s.D.Layers)
	for l := range out {
		out[l] = ref.PagedKV{K: arena[l*2*e:], V: arena[l*2*e+e:], PageTokens: pageTokens, KVHeads: s.kvHeads, HeadDim: s.D.HeadDim, PageOffset: at}
	}
	return out
}

func addBias(x, bias []float32, rows int) {
	if bias == nil {
		return
	}
	n := len(bias)
	for r := range rows {
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
