package glm5flash

import (
	"fmt"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kernels/ref"
	"github.com/resin-llm/resin/core/kvslab"
)

// held is a model's projections in its dtype (NewTextModelDType): each keyed by the
// address of the weights' field it replaces, so that the forward passes the field
// (m.dense(x, &w.q, ...)) and multiplies whichever form the model holds. The routed
// experts are held per expert. What stays fp32 in every dtype: the router (its top-k
// would flip on rounding), the mHC fn, MLA's kv_b (read per head inside the absorbed
// attention), the MTP head, the norms, embeddings and the cache.
type held struct {
	dtype   ref.DType
	proj    map[*[]float32]*ref.Weight
	experts map[*[]float32][]*ref.Weight
}

// dense is x·wᵀ on the model's form of *w: x [rows, in], w [out, in].
func (m *TextModel) dense(x []float32, w *[]float32, rows, in, out int) []float32 {
	if m.held != nil {
		if q := m.held.proj[w]; q != nil {
			return heldDense(x, q, rows, in, out)
		}
	}
	return dense(x, *w, rows, in, out)
}

// expertDense is x·wᵀ on expert e's block of *w ([experts, out, in]).
func (m *TextModel) expertDense(x []float32, w *[]float32, e, rows, in, out int) []float32 {
	if m.held != nil {
		if qs := m.held.experts[w]; qs != nil {
			return heldDense(x, qs[e], rows, in, out)
		}
	}
	return dense(x, (*w)[e*out*in:(e+1)*out*in], rows, in, out)
}

// expertMatMulT writes x·wᵀ on expert e's block of *w into y.
func (m *TextModel) expertMatMulT(y, x []float32, w *[]float32, e, rows, in, out int) error {
	if m.held != nil {
		if qs := m.held.experts[w]; qs != nil {
			return qs[e].MatMulT(y, x, rows)
		}
	}
	return ref.MatMulT(y, x, (*w)[e*out*in:(e+1)*out*in], rows, in, out)
}

// heldDense is x·qᵀ: the shapes are fixed by the loader and NewTextModelDType, so a
// mismatch is a bug here (as in dense).
func heldDense(x []float32, q *ref.Weight, rows, in, out int) []float32 {
	if q.N != out || q.K != in {
		panic(fmt.Sprintf("glm5flash: %s weight [%d, %d] multiplied as [%d, %d]", q.DType, q.N, q.K, out, in))
	}
	y := make([]float32, rows*out)
	if err := q.MatMulT(y, x, rows); err != nil {
		panic(err)
	}
	return y
}

// hold makes the model multiply its projections (KDA's q, k, v, f_a, f_b, b, g_a, g_b,
// o; MLA's q_a, q_b, kv_a, o; the indexer's wq_b, wk, gate, weights_proj; the dense MLPs
// and shared experts; every routed expert; lm_head) as ref.Weight in dt; fp32 too (the
// tests check the wiring on it). The fp32 slices stay until dropFP32. The whole model
// only: a tensor- or expert-parallel rank runs fp32. With pk (dt fp8 on a fine-grained
// FP8 checkpoint), a projection the checkpoint stores as FP8 is held as its bytes and
// 128×128-block scales (ref.WeightFP8, every routed expert's too), and the others as
// stored: bf16 (the KDA projections GLM ships so) in bf16, the rest fp32; no tensor is
// rounded again. Without pk, fp8 quantises every projection (ref.QuantizeFP8).
func (m *TextModel) hold(dt ref.DType, pk *gpuFP8) error {
	c, w := m.Config, m.W
	h := &held{dtype: dt, proj: map[*[]float32]*ref.Weight{}, experts: map[*[]float32][]*ref.Weight{}}
	D := c.HiddenSize
	w.packed = PackedWeights{}
	put := func(f *[]float32, n, k int) error {
		if len(*f) == 0 {
			return nil
		}
		q, err := m.packedFP8(pk, *f, n, k)
		if err == nil && q == nil {
			q, err = newWeight(pk != nil, *f, n, k, storedDType(pk, w, *f, dt))
		}
		if err != nil {
			return err
		}
		h.proj[f] = q
		return nil
	}
	// rows is a [n, k] projection whose k is known: n follows from its length.
	rows := func(f *[]float32, k int) error { return put(f, len(*f)/k, k) }
	mlp := func(p *mlpWeights) error {
		return firstErr(rows(&p.gate, D), rows(&p.up, D), put(&p.down, D, p.width))
	}
	for li := range w.layers {
		ly := &w.layers[li]
		var err error
		if a := ly.kda; a != nil {
			Dh := c.LinearHeadDim
			L := len(a.q) / D
			err = firstErr(rows(&a.q, D), rows(&a.k, D), rows(&a.v, D), rows(&a.fa, D), put(&a.fb, L, Dh),
				rows(&a.b, D), rows(&a.ga, D), put(&a.gb, L, Dh), put(&a.o, D, L))
		}
		if a := ly.mla; a != nil && err == nil {
			Q := c.QLoraRank
			err = firstErr(rows(&a.qa, D), rows(&a.qb, Q), rows(&a.kva, D), put(&a.o, D, len(a.o)/D))
			if ix := a.idx; ix != nil && err == nil {
				err = firstErr(rows(&ix.wqb, Q), rows(&ix.wk, D), rows(&ix.gate, D), rows(&ix.wProj, D))
			}
		}
		if ly.dense != nil && err == nil {
			err = mlp(ly.dense)
		}
		if e := ly.moe; e != nil && err == nil {
			err = mlp(&e.shared)
			F := m.moeInter()
			ne := len(e.gateUp) / (2 * F * D)
			var gu, dn []*ref.Weight
			if err == nil {
				gu, dn, err = m.packedExperts(pk, e, ne, F)
			}
			// split holds each of the ne experts [n, k] of bank f in the bank's dtype.
			split := func(f []float32, n, k int) ([]*ref.Weight, error) {
				sdt := storedDType(pk, w, f, dt)
				ws := make([]*ref.Weight, ne)
				for x := range ws {
					var err error
					if ws[x], err = newWeight(pk != nil, f[x*n*k:(x+1)*n*k], n, k, sdt); err != nil {
						return nil, err
					}
				}
				return ws, nil
			}
			if gu == nil && err == nil {
				gu, err = split(e.gateUp, 2*F, D)
			}
			if dn == nil && err == nil {
				dn, err = split(e.down, D, F)
			}
			h.experts[&e.gateUp], h.experts[&e.down] = gu, dn
		}
		if err != nil {
			return fmt.Errorf("layer %d: %w", li, err)
		}
	}
	if err := rows(&w.lmHead, D); err != nil {
		return fmt.Errorf("lm head: %w", err)
	}
	m.held = h
	return nil
}

// firstErr is the first non-nil error of errs.
func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// DType is the form the model's projections are multiplied in.
func (m *TextModel) DType() ref.DType {
	if m.held == nil {
		return ref.DTypeFP32
	}
	return m.held.dtype
}

// WeightBytes is the memory the projections held in the model's dtype take (0 in fp32,
// which reads the weights' slices).
func (m *TextModel) WeightBytes() int64 {
	if m.held == nil {
		return 0
	}
	var n int64
	for _, q := range m.held.proj {
		n += q.Bytes()
	}
	for _, qs := range m.held.experts {
		for _, q := range qs {
			n += q.Bytes()
		}
	}
	return n
}

// dropFP32 frees the fp32 copies of the projections the model holds in another dtype (an
// lm_head tied to the embeddings stays, as the embedding reads it; so does the MTP
// head's). After it only the dtype's forward runs: not the GPU's.
func (m *TextModel) dropFP32() {
	if m.held == nil {
		return
	}
	w := m.W
	for f := range m.held.proj {
		if f == &w.lmHead && len(w.embed) > 0 && len(w.lmHead) > 0 && &w.lmHead[0] == &w.embed[0] {
			continue
		}
		*f = nil
	}
	for f := range m.held.experts {
		*f = nil
	}
}

// LoadTextDType is LoadText with the projections held and multiplied in dt and their fp32
// copies dropped (fp32 or "": LoadText); fp8 keeps a fine-grained FP8 checkpoint's FP8
// linears as stored (hold).
func LoadTextDType(dir string, pageTokens int, seed uint64, dt ref.DType) (*TextRunner, error) {
	r, err := LoadText(dir, pageTokens, seed)
	if err != nil || dt == "" || dt == ref.DTypeFP32 {
		return r, err
	}
	var pk *gpuFP8
	if dt == ref.DTypeFP8 {
		if pk, _, err = openGPUFP8(dir, r.Model.Config.Quant); err != nil {
			return nil, fmt.Errorf("load %s as %s: %w", dir, dt, err)
		}
		defer pk.close()
	}
	if err := r.Model.hold(dt, pk); err != nil {
		return nil, fmt.Errorf("load %s as %s: %w", dir, dt, err)
	}
	r.Model.dropFP32()
	return r, nil
}

// OpenDType is Open with the projections in dtype (fp32, bf16 or int8; see
// ref.ParseDType): the entry point of `--dtype`.
func OpenDType(dir string, cacheBytes int64, dtype string) (engine.Runner, *kvslab.Pool, error) {
	dt, err := ref.ParseDType(dtype)
	if err != nil {
		return nil, nil, err
	}
	r, err := LoadTextDType(dir, 0, 0, dt)
	if err != nil {
		return nil, nil, err
	}
	pool, err := r.NewPool(cacheBytes)
	if err != nil {
		return nil, nil, err
	}
	return r, pool, nil
}
