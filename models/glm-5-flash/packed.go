package glm5flash

import (
	"fmt"

	"github.com/resin-llm/resin/core/gpurunner"
	"github.com/resin-llm/resin/core/kernels/ref"
	"github.com/resin-llm/resin/core/weights"
)

// PackedWeights counts the projections a model loaded with --dtype fp8 holds as its
// fine-grained FP8 checkpoint stores them (a byte a weight and a scale per 128×128
// block), with the bytes they take and the bytes their float32 form would.
type PackedWeights struct {
	FP8              int
	Bytes, FP32Bytes int64
}

// PackedWeights is what the model holds as its checkpoint stores it (zero unless loaded
// by LoadTextDType as fp8 from an FP8 checkpoint).
func (m *TextModel) PackedWeights() PackedWeights { return m.W.packed }

// add counts w, whose float32 form is n values.
func (p *PackedWeights) add(w *ref.Weight, n int) {
	p.FP8++
	p.Bytes += w.Bytes()
	p.FP32Bytes += 4 * int64(n)
}

// storedDType is the dtype hold keeps the tensor f (read whole, or a routed expert bank)
// in when pk does not hold it packed: dt without pk; with it, bf16 for a tensor the
// checkpoint stores in bf16, else fp32 (stored in neither, a bank read per expert: fp32).
func storedDType(pk *gpuFP8, w *TextWeights, f []float32, dt ref.DType) ref.DType {
	if pk == nil {
		return dt
	}
	if len(f) > 0 {
		if dts, ok := pk.r.Stored(w.names[&f[0]]); ok && dts == weights.BF16 {
			return ref.DTypeBF16
		}
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

// packedFP8 returns the tensor f ([n, k], read whole) as pk's checkpoint stores it, when
// that is FP8; nil otherwise, or without pk.
func (m *TextModel) packedFP8(pk *gpuFP8, f []float32, n, k int) (*ref.Weight, error) {
	if pk == nil || len(f) == 0 {
		return nil, nil
	}
	name := m.W.names[&f[0]]
	p, ok, err := pk.read(name, n, k)
	if err != nil || !ok {
		return nil, err
	}
	q, err := holdFP8(p, name)
	if err == nil {
		m.W.packed.add(q, n*k)
	}
	return q, err
}

// holdFP8 holds one stored FP8 weight p (counted by the caller).
func holdFP8(p gpurunner.PackedFP8, name string) (*ref.Weight, error) {
	q, err := ref.WeightFP8(&ref.FP8Matrix{N: p.Out, K: p.In, W: p.W, Scale: p.Scale, BlockRows: 128, BlockCols: 128})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return q, nil
}

// countAll counts each of ws (a bank the model holds packed).
func (m *TextModel) countAll(ws []*ref.Weight) {
	for _, q := range ws {
		m.W.packed.add(q, q.N*q.K)
	}
}

// packedExperts returns the ne routed experts' gate_up [2F, D] and down [D, F] weights of
// e as pk's checkpoint stores them, when FP8: from the fused banks (experts.gate_up_proj,
// experts.down_proj), or the per-expert tensors with gate and up stacked by rows when F
// fills whole 128-row scale blocks. A slice is nil when its experts are not all FP8.
func (m *TextModel) packedExperts(pk *gpuFP8, e *moeWeights, ne, F int) (gateUp, down []*ref.Weight, err error) {
	if pk == nil || len(e.gateUp) == 0 {
		return nil, nil, nil
	}
	D := m.Config.HiddenSize
	if e.perExpert == "" {
		bank := func(f []float32, out, in int) ([]*ref.Weight, error) {
			name := m.W.names[&f[0]]
			if !pk.stored(name) {
				return nil, nil
			}
			b, err := pk.r.ReadFP8Bank(name, ne, out, in)
			if err != nil {
				return nil, err
			}
			ws := make([]*ref.Weight, ne)
			for x := range ne {
				p, err := b.Expert(x)
				if err == nil {
					ws[x], err = holdFP8(p, fmt.Sprintf("%s expert %d", name, x))
				}
				if err != nil {
					return nil, err
				}
			}
			return ws, nil
		}
		if gateUp, err = bank(e.gateUp, 2*F, D); err == nil {
			down, err = bank(e.down, D, F)
		}
		m.countAll(gateUp)
		m.countAll(down)
		return gateUp, down, err
	}
	gateUp, down = make([]*ref.Weight, ne), make([]*ref.Weight, ne)
	for x := range ne {
		ep := fmt.Sprintf("%sexperts.%d.", e.perExpert, x)
		gate, okG, err := pk.read(ep+"gate_proj.weight", F, D)
		if err != nil {
			return nil, nil, err
		}
		up, okU, err := pk.read(ep+"up_proj.weight", F, D)
		if err != nil {
			return nil, nil, err
		}
		if okG && okU && F%128 == 0 && gateUp != nil {
			s, err := gpurunner.StackFP8(gate, up)
			if err == nil {
				gateUp[x], err = holdFP8(s, ep+"gate_up")
			}
			if err != nil {
				return nil, nil, err
			}
		} else {
			gateUp = nil // mixed storage: every expert's gate_up from fp32
		}
		dn, ok, err := pk.read(ep+"down_proj.weight", D, F)
		if err != nil {
			return nil, nil, err
		}
		if ok && down != nil {
			if down[x], err = holdFP8(dn, ep+"down_proj.weight"); err != nil {
				return nil, nil, err
			}
		} else {
			down = nil
		}
	}
	m.countAll(gateUp)
	m.countAll(down)
	return gateUp, down, nil
}
