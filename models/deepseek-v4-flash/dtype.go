package deepseekv4flash

import (
	"fmt"

	"github.com/resin-llm/resin/core/kernels/ref"
	"github.com/resin-llm/resin/core/weights"
)

// The projections a layer's forward multiplies by, held as ref.Weight in the model's
// dtype (NewModelDType): attention (q_a, q_b, kv, o_a per group, o_b), the compressor's
// and indexer's projections, the shared expert and every routed expert. The router, the
// hyper-connections' fn and the norms stay fp32 (they are small, and the router's top-k
// would flip on rounding). A nil *layerProj (fp32) multiplies the Layer's slices.
const (
	pQA = iota
	pQB
	pKV
	pOB
	pCompKV
	pCompGate
	pIdxKV
	pIdxGate
	pIdxQB
	pIdxW
	pSharedGate
	pSharedUp
	pSharedDown
	numProj
)

// layerProj is one layer's projections in the model's dtype.
type layerProj struct {
	w            [numProj]*ref.Weight
	oa           []*ref.Weight // [oGroups] o_a's block per group
	gateUp, down []*ref.Weight // [experts] the routed experts'
}

// at is projection i, nil when p is (fp32) or the layer has none.
func (p *layerProj) at(i int) *ref.Weight {
	if p == nil {
		return nil
	}
	return p.w[i]
}

// expert is routed expert e's gate_up (down: false) or down weight, nil in fp32.
func (p *layerProj) expert(e int, down bool) *ref.Weight {
	if p == nil {
		return nil
	}
	if down {
		return p.down[e]
	}
	return p.gateUp[e]
}

// group is o_a's block for group g, nil in fp32.
func (p *layerProj) group(g int) *ref.Weight {
	if p == nil {
		return nil
	}
	return p.oa[g]
}

// matMulT computes y = x·wᵀ (x [n, in], y [n, out]) on q when set, else on the fp32 w.
func matMulT(y, x, w []float32, q *ref.Weight, n, in, out int) error {
	if q == nil {
		return ref.MatMulT(y, x, w, n, in, out)
	}
	if q.N != out || q.K != in {
		return fmt.Errorf("%s weight [%d, %d], want [%d, %d]", q.DType, q.N, q.K, out, in)
	}
	return q.MatMulT(y, x, n)
}

// linearQ is linear on q when set.
func linearQ(x, w []float32, q *ref.Weight, n, in, out int) ([]float32, error) {
	y := make([]float32, n*out)
	return y, matMulT(y, x, w, q, n, in, out)
}

// NewModelDType is NewModel holding the projections (attention, compressor, indexer,
// shared and routed experts, lm_head) in dt: fp32 reads w's slices; bf16, int8 and fp8
// keep their own form (fp8 quantised from w, as no checkpoint is at hand: Load keeps a
// checkpoint's FP8 and MXFP4 tensors as stored); w's fp32 projections stay, for tests that
// read them (dropFP32 frees them). The whole model only: a tensor- or expert-parallel rank
// runs fp32.
func NewModelDType(c *Config, w *Weights, maxContext int, dt ref.DType) (*Model, error) {
	return newModelPacked(c, w, maxContext, dt, "")
}

// newModelPacked is NewModelDType reading, for dt fp8, the projections dir's checkpoint
// stores as FP8 (128×128 blocks) or, routed experts, MXFP4 as stored (holdPacked);
// dir "" or one without safetensors quantises every projection at load.
func newModelPacked(c *Config, w *Weights, maxContext int, dt ref.DType, dir string) (*Model, error) {
	m, err := NewModel(c, w, maxContext)
	if err != nil || dt == ref.DTypeFP32 || dt == "" {
		return m, err
	}
	var pk *gpuPacked
	if dt == ref.DTypeFP8 && dir != "" {
		if pk, err = openGPUPacked(dir, m); err != nil {
			return nil, fmt.Errorf("fp8: %w", err)
		}
		defer pk.close()
	}
	return m, m.hold(dt, pk)
}

// hold makes the model multiply its layers' projections and lm_head as ref.Weight in dt
// (fp32 too: the tests check the wiring on it). With pk (dt fp8, a checkpoint whose
// quantization_config is FP8), a projection the checkpoint stores as FP8 in 128×128
// blocks is held as its bytes and scales, routed experts stored as MXFP4 as their nibbles
// and scales (ref.WeightFP8, WeightFP4), and the others as DeepSeek ships them: bf16 (the
// compressors', the indexer's weights_proj) in bf16, float32 (lm_head) in fp32; no tensor
// is rounded again. Without pk, fp8 quantises every projection (QuantizeFP8).
func (m *Model) hold(dt ref.DType, pk *gpuPacked) error {
	c, w := m.Config, m.W
	var err error
	m.dtype = dt
	h, d, qr, hd := c.HiddenSize, c.HeadDim, c.QLoraRank, c.NumAttentionHeads*c.HeadDim
	in, si := m.par.inter, m.par.sharedInter
	og, olr := m.par.groups, c.OLoraRank
	gin := m.par.heads * d / og
	w.packed = PackedWeights{}
	for li := range w.Layers {
		l, p := &w.Layers[li], &layerProj{}
		type job struct {
			dst  **ref.Weight
			src  *[]float32 // the field w is (whole) or a part of, as the checkpoint names it
			part bool
			w    []float32
			n, k int
		}
		jobs := []job{
			{&p.w[pQA], &l.QA, false, l.QA, qr, h}, {&p.w[pQB], &l.QB, false, l.QB, hd, qr},
			{&p.w[pKV], &l.KV, false, l.KV, d, h}, {&p.w[pOB], &l.OB, false, l.OB, h, og * olr},
			{&p.w[pSharedGate], &l.SharedGate, false, l.SharedGate, si, h},
			{&p.w[pSharedUp], &l.SharedUp, false, l.SharedUp, si, h},
			{&p.w[pSharedDown], &l.SharedDown, false, l.SharedDown, h, si},
		}
		if cp := l.Compressor; cp != nil {
			width := len(cp.KV) / h
			jobs = append(jobs, job{&p.w[pCompKV], &cp.KV, false, cp.KV, width, h},
				job{&p.w[pCompGate], &cp.Gate, false, cp.Gate, width, h})
		}
		if ix := l.Indexer; ix != nil {
			id, ih := c.IndexHeadDim, c.IndexNHeads
			jobs = append(jobs, job{&p.w[pIdxKV], &ix.KV, false, ix.KV, 2 * id, h},
				job{&p.w[pIdxGate], &ix.Gate, false, ix.Gate, 2 * id, h},
				job{&p.w[pIdxQB], &ix.QB, false, ix.QB, ih * id, qr},
				job{&p.w[pIdxW], &ix.WeightsProj, false, ix.WeightsProj, ih, h})
		}
		p.oa = make([]*ref.Weight, og)
		oaPacked, err := m.packedOA(pk, l, p.oa)
		if err != nil {
			return fmt.Errorf("layer %d: wo_a: %w", li, err)
		}
		if !oaPacked {
			for g := range og {
				jobs = append(jobs, job{&p.oa[g], &l.OA, true, l.OA[g*olr*gin : (g+1)*olr*gin], olr, gin})
			}
		}
		ne := len(l.GateUp) / (2 * in * h)
		p.gateUp, p.down = make([]*ref.Weight, ne), make([]*ref.Weight, ne)
		for _, bank := range []struct {
			src  *[]float32
			dst  []*ref.Weight
			n, k int
		}{{&l.GateUp, p.gateUp, 2 * in, h}, {&l.Down, p.down, h, in}} {
			ok, err := m.packedExperts(pk, bank.src, bank.dst, bank.n, bank.k)
			if err != nil {
				return fmt.Errorf("layer %d: routed experts: %w", li, err)
			}
			if ok {
				continue
			}
			for e := range ne {
				jobs = append(jobs, job{&bank.dst[e], bank.src, true, (*bank.src)[e*bank.n*bank.k : (e+1)*bank.n*bank.k], bank.n, bank.k})
			}
		}
		for _, j := range jobs {
			if !j.part {
				ok, err := m.packedFP8(pk, j.src, j.dst, j.n, j.k)
				if err != nil {
					return fmt.Errorf("layer %d: %w", li, err)
				}
				if ok {
					continue
				}
			}
			if *j.dst, err = newWeight(pk != nil, j.w, j.n, j.k, storedDType(pk, j.src, dt)); err != nil {
				return fmt.Errorf("layer %d: %w", li, err)
			}
		}
		l.cpu = p
	}
	vl := len(w.Head) / h
	if ok, err := m.packedFP8(pk, &w.Head, &m.headW, vl, h); err != nil || ok {
		return err
	}
	if m.headW, err = newWeight(pk != nil, w.Head, vl, h, storedDType(pk, &w.Head, dt)); err != nil {
		return fmt.Errorf("lm head: %w", err)
	}
	return nil
}

// storedDType is the dtype hold keeps field src in when pk does not hold it packed: dt
// without pk; with it, bf16 for a tensor the checkpoint stores in bf16, else fp32.
func storedDType(pk *gpuPacked, src *[]float32, dt ref.DType) ref.DType {
	if pk == nil {
		return dt
	}
	if _, sdt, _, ok := pk.stored(src); ok && sdt == weights.BF16 {
		return ref.DTypeBF16
	}
	return ref.DTypeFP32
}

// newWeight holds w [n, k] in dt; asStored (--dtype fp8: a checkpoint's tensor in the
// dtype it is stored in) computes its products in float32 as the checkpoint's fp32
// dequantisation does (ref.NewWeightAsStored), not on AMX's bf16-rounded activations.
func newWeight(asStored bool, w []float32, n, k int, dt ref.DType) (*ref.Weight, error) {
	if asStored {
		return ref.NewWeightAsStored(w, n, k, dt)
	}
	return ref.NewWeight(w, n, k, dt)
}

// DType is the form the model's projections are multiplied in.
func (m *Model) DType() ref.DType {
	if m.dtype == "" {
		return ref.DTypeFP32
	}
	return m.dtype
}

// WeightBytes is the memory the projections held in the model's dtype take (0 in fp32,
// which reads the Weights' slices).
func (m *Model) WeightBytes() int64 {
	var n int64
	if m.headW != nil {
		n += m.headW.Bytes()
	}
	for li := range m.W.Layers {
		p := m.W.Layers[li].cpu
		if p == nil {
			continue
		}
		for _, w := range p.w {
			if w != nil {
				n += w.Bytes()
			}
		}
		for _, ws := range [][]*ref.Weight{p.oa, p.gateUp, p.down} {
			for _, w := range ws {
				n += w.Bytes()
			}
		}
	}
	return n
}

// dropFP32 frees the fp32 copies of the projections the model holds in another dtype
// (the MTP head's block keeps its own; an lm_head tied to the embeddings stays, as the
// embedding reads it). After it only the dtype's forward runs: not the GPU's, not MTP's
// reading of the main layers.
func (m *Model) dropFP32() {
	w := m.W
	if m.headW == nil {
		return
	}
	for li := range w.Layers {
		l := &w.Layers[li]
		l.QA, l.QB, l.KV, l.OA, l.OB = nil, nil, nil, nil, nil
		l.SharedGate, l.SharedUp, l.SharedDown, l.GateUp, l.Down = nil, nil, nil, nil, nil
		if cp := l.Compressor; cp != nil {
			cp.KV, cp.Gate = nil, nil
		}
		if ix := l.Indexer; ix != nil {
			ix.KV, ix.Gate, ix.QB, ix.WeightsProj = nil, nil, nil, nil
		}
	}
	if len(w.Head) > 0 && len(w.Embed) > 0 && &w.Head[0] != &w.Embed[0] {
		w.Head = nil
	}
}

// compressorWidth is the per-token projection width of l's compressor.
func compressorWidth(l *Layer, hidden int) int {
	if q := l.cpu.at(pCompKV); q != nil {
		return q.N
	}
	return len(l.Compressor.KV) / hidden
}

// expertSlice is expert e's block of size values in w, nil when w was dropped (the
// expert's weight is then in the model's dtype).
func expertSlice(w []float32, e, size int) []float32 {
	if len(w) < (e+1)*size {
		return nil
	}
	return w[e*size : (e+1)*size]
}

// faceOA is o_a's block for group g (size values), nil when dropped.
func faceOA(l *Layer, g, size int) []float32 { return expertSlice(l.OA, g, size) }
