package deepseekv4flash

import (
	"fmt"

	"github.com/resin-llm/resin/core/kernels/ref"
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
// shared and routed experts, lm_head) in dt: fp32 reads w's slices; bf16 and int8 keep
// their own form (w's fp32 projections stay, for tests that read them; dropFP32 frees
// them). The whole model only: a tensor- or expert-parallel rank runs fp32.
func NewModelDType(c *Config, w *Weights, maxContext int, dt ref.DType) (*Model, error) {
	m, err := NewModel(c, w, maxContext)
	if err != nil || dt == ref.DTypeFP32 || dt == "" {
		return m, err
	}
	return m, m.hold(dt)
}

// hold makes the model multiply its layers' projections and lm_head as ref.Weight in dt
// (fp32 too: the tests check the wiring on it).
func (m *Model) hold(dt ref.DType) error {
	c, w := m.Config, m.W
	var err error
	m.dtype = dt
	h, d, qr, hd := c.HiddenSize, c.HeadDim, c.QLoraRank, c.NumAttentionHeads*c.HeadDim
	in, si := m.par.inter, m.par.sharedInter
	og, olr := m.par.groups, c.OLoraRank
	gin := m.par.heads * d / og
	for li := range w.Layers {
		l, p := &w.Layers[li], &layerProj{}
		type job struct {
			dst  **ref.Weight
			w    []float32
			n, k int
		}
		jobs := []job{
			{&p.w[pQA], l.QA, qr, h}, {&p.w[pQB], l.QB, hd, qr}, {&p.w[pKV], l.KV, d, h},
			{&p.w[pOB], l.OB, h, og * olr},
			{&p.w[pSharedGate], l.SharedGate, si, h}, {&p.w[pSharedUp], l.SharedUp, si, h},
			{&p.w[pSharedDown], l.SharedDown, h, si},
		}
		if cp := l.Compressor; cp != nil {
			width := len(cp.KV) / h
			jobs = append(jobs, job{&p.w[pCompKV], cp.KV, width, h}, job{&p.w[pCompGate], cp.Gate, width, h})
		}
		if ix := l.Indexer; ix != nil {
			id, ih := c.IndexHeadDim, c.IndexNHeads
			jobs = append(jobs, job{&p.w[pIdxKV], ix.KV, 2 * id, h}, job{&p.w[pIdxGate], ix.Gate, 2 * id, h},
				job{&p.w[pIdxQB], ix.QB, ih * id, qr}, job{&p.w[pIdxW], ix.WeightsProj, ih, h})
		}
		p.oa = make([]*ref.Weight, og)
		for g := range og {
			jobs = append(jobs, job{&p.oa[g], l.OA[g*olr*gin : (g+1)*olr*gin], olr, gin})
		}
		ne := len(l.GateUp) / (2 * in * h)
		p.gateUp, p.down = make([]*ref.Weight, ne), make([]*ref.Weight, ne)
		for e := range ne {
			jobs = append(jobs, job{&p.gateUp[e], l.GateUp[e*2*in*h : (e+1)*2*in*h], 2 * in, h},
				job{&p.down[e], l.Down[e*h*in : (e+1)*h*in], h, in})
		}
		for _, j := range jobs {
			if *j.dst, err = ref.NewWeight(j.w, j.n, j.k, dt); err != nil {
				return fmt.Errorf("layer %d: %w", li, err)
			}
		}
		l.cpu = p
	}
	vl := len(w.Head) / h
	if m.headW, err = ref.NewWeight(w.Head, vl, h, dt); err != nil {
		return fmt.Errorf("lm head: %w", err)
	}
	return nil
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
