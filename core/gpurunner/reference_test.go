package gpurunner

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kernels/ref"
	"github.com/resin-llm/resin/core/weights"
)

// The CPU reference of the dense model, for the GPU parity tests: models/llama's forward
// (core must not import models) in plain core/kernels/ref calls over float32, with its
// own host cache. Page ids are the plan's; page p sits at p·PageTokens·kvDim.

// randomDense returns a config of the given sizes with a rotary table of theta 10000, and
// seeded random weights rounded to bf16, so that the reference and the GPU read the same
// parameters.
func randomDense(vocab, hidden, layers, heads, kvHeads, headDim, inter, maxContext int, seed uint64) (*DenseConfig, *DenseWeights) {
	rope, err := ref.NewRopeTable(headDim, maxContext, 10000)
	if err != nil {
		panic(err)
	}
	c := &DenseConfig{Name: "dense-test", Vocab: vocab, Hidden: hidden, Layers: layers, Heads: heads, KVHeads: kvHeads,
		HeadDim: headDim, Intermediate: inter, RMSNormEps: 1e-5, MaxContext: maxContext, PageTokens: 16,
		RopeCos: rope.Cos, RopeSin: rope.Sin, RopeDim: rope.Dim, EOS: []int32{0}}
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	mat := func(rows, cols int) []float32 {
		v := make([]float32, rows*cols)
		s := 1 / math.Sqrt(float64(cols))
		for i := range v {
			v[i] = weights.BF16ToFloat32(weights.Float32ToBF16(float32((rng.Float64()*2 - 1) * s)))
		}
		return v
	}
	norm := func(n int) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = weights.BF16ToFloat32(weights.Float32ToBF16(float32(1 + 0.1*(rng.Float64()*2-1))))
		}
		return v
	}
	q, kv := heads*headDim, kvHeads*headDim
	w := &DenseWeights{Embed: mat(vocab, hidden), Norm: norm(hidden), Head: mat(vocab, hidden)}
	for range layers {
		w.Layers = append(w.Layers, DenseLayer{
			AttnNorm: norm(hidden), MLPNorm: norm(hidden), Q: mat(q, hidden), K: mat(kv, hidden), V: mat(kv, hidden),
			O: mat(hidden, q), Gate: mat(inter, hidden), Up: mat(inter, hidden), Down: mat(hidden, inter),
		})
	}
	return c, w
}

// withVariants turns on the Qwen options of c (q/k/v biases as Qwen2, an o bias, per-head
// q/k norms as Qwen3) with seeded random bf16 parameters for them in w.
func withVariants(c *DenseConfig, w *DenseWeights, qkvBias, oBias, qkNorm bool, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 0xb1a5))
	vec := func(n int, center, spread float64) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = weights.BF16ToFloat32(weights.Float32ToBF16(float32(center + spread*(rng.Float64()*2-1))))
		}
		return v
	}
	c.QKVBias, c.OBias, c.QKNorm = qkvBias, oBias, qkNorm
	for i := range w.Layers {
		l := &w.Layers[i]
		if qkvBias {
			l.QBias, l.KBias, l.VBias = vec(c.QDim(), 0, 0.5), vec(c.KVDim(), 0, 0.5), vec(c.KVDim(), 0, 0.5)
		}
		if oBias {
			l.OBias = vec(c.Hidden, 0, 0.2)
		}
		if qkNorm {
			l.QNorm, l.KNorm = vec(c.HeadDim, 1, 0.3), vec(c.HeadDim, 1, 0.3)
		}
	}
}

// addBias adds bias to each of the rows of x; a nil bias adds nothing (models/llama's).
func addBias(x, bias []float32, rows int) {
	if bias == nil {
		return
	}
	n := len(bias)
	for r := range rows {
		for i, b := range bias {
			x[r*n+i] += b
		}
	}
}

// refDense is the reference forward with its host cache of pages pages.
type refDense struct {
	c    *DenseConfig
	w    *DenseWeights
	rope *ref.RopeTable
	kv   []ref.PagedKV
}

func newRefDense(c *DenseConfig, w *DenseWeights, pages int) *refDense {
	r := &refDense{c: c, w: w, rope: &ref.RopeTable{Dim: c.RopeDim, MaxPos: c.MaxContext, Cos: c.RopeCos, Sin: c.RopeSin}}
	for range c.Layers {
		n := pages * c.PageTokens * c.KVDim()
		r.kv = append(r.kv, ref.PagedKV{K: make([]float32, n), V: make([]float32, n), PageTokens: c.PageTokens, KVHeads: c.KVHeads, HeadDim: c.HeadDim})
	}
	return r
}

// forward returns the logits of plan's LogitsIndices rows, [rows, vocab].
func (r *refDense) forward(plan *engine.BatchPlan) ([]float32, error) {
	c, w := r.c, r.w
	t, h, q, kv, in := plan.NumTokens(), c.Hidden, c.QDim(), c.KVDim(), c.Intermediate
	eps := c.RMSNormEps
	x, hn := make([]float32, t*h), make([]float32, t*h)
	qs, ks, vs, att, o := make([]float32, t*q), make([]float32, t*kv), make([]float32, t*kv), make([]float32, t*q), make([]float32, t*h)
	gate, up := make([]float32, t*in), make([]float32, t*in)
	a := ref.Attention{Heads: c.Heads, Scale: float32(1 / math.Sqrt(float64(c.HeadDim))), Window: c.Window}
	if err := ref.Embedding(x, w.Embed, plan.Tokens, h); err != nil {
		return nil, err
	}
	for l, lw := range w.Layers {
		err := firstErr(ref.RMSNorm(hn, x, lw.AttnNorm, t, h, eps), ref.MatMulT(qs, hn, lw.Q, t, h, q),
			ref.MatMulT(ks, hn, lw.K, t, h, kv), ref.MatMulT(vs, hn, lw.V, t, h, kv))
		if err != nil {
			return nil, fmt.Errorf("layer %d: %w", l, err)
		}
		// As models/llama: the biases, then each q and k head's norm, then rotary.
		addBias(qs, lw.QBias, t)
		addBias(ks, lw.KBias, t)
		addBias(vs, lw.VBias, t)
		if c.QKNorm {
			err = firstErr(ref.RMSNorm(qs, qs, lw.QNorm, t*c.Heads, c.HeadDim, eps), ref.RMSNorm(ks, ks, lw.KNorm, t*c.KVHeads, c.HeadDim, eps))
		}
		if err == nil {
			err = firstErr(r.rope.RoPENeoX(qs, plan.Positions, t, c.Heads, c.HeadDim), r.rope.RoPENeoX(ks, plan.Positions, t, c.KVHeads, c.HeadDim),
				r.kv[l].StoreKV(ks, vs, plan.Groups[0].SlotMapping))
		}
		if err != nil {
			return nil, fmt.Errorf("layer %d: %w", l, err)
		}
		for i := 0; i < plan.NumSeqs(); i++ {
			s, e := int(plan.QueryStart[i]), int(plan.QueryStart[i+1])
			var pages []uint32
			for _, p := range plan.PageTableOf(0, i) {
				pages = append(pages, uint32(p))
			}
			if err := ref.PagedAttention(att[s*q:e*q], qs[s*q:e*q], &r.kv[l], pages, int(plan.Computed[i])+e-s, e-s, a); err != nil {
				return nil, err
			}
		}
		if err := ref.MatMulT(o, att, lw.O, t, q, h); err != nil {
			return nil, fmt.Errorf("layer %d: %w", l, err)
		}
		addBias(o, lw.OBias, t)
		err = firstErr(ref.Add(x, x, o), ref.RMSNorm(hn, x, lw.MLPNorm, t, h, eps),
			ref.MatMulT(gate, hn, lw.Gate, t, h, in), ref.MatMulT(up, hn, lw.Up, t, h, in),
			ref.SiLUMulSplit(gate, gate, up, t, in), ref.MatMulT(o, gate, lw.Down, t, in, h), ref.Add(x, x, o))
		if err != nil {
			return nil, fmt.Errorf("layer %d: %w", l, err)
		}
	}
	rows := len(plan.LogitsIndices)
	sel := make([]float32, rows*h)
	for j, idx := range plan.LogitsIndices {
		copy(sel[j*h:], x[int(idx)*h:int(idx+1)*h])
	}
	logits := make([]float32, rows*c.Vocab)
	if err := firstErr(ref.RMSNorm(sel, sel, w.Norm, rows, h, eps), ref.MatMulT(logits, sel, w.Head, rows, h, c.Vocab)); err != nil {
		return nil, err
	}
	return logits, nil
}
