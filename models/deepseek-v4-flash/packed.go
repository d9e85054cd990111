package deepseekv4flash

import (
	"fmt"

	"github.com/resin-llm/resin/core/kernels/cuda"
	"github.com/resin-llm/resin/core/kernels/ref"
	"github.com/resin-llm/resin/core/weights"
)

// PackedWeights counts the projections a model loaded with --dtype fp8 holds as its
// checkpoint stores them: FP8 linears (a byte a weight and a scale per 128×128 block) and
// MXFP4 routed experts (half a byte a weight and a scale per 32), with the bytes they
// take and the bytes their float32 form would.
type PackedWeights struct {
	FP8, FP4         int
	Bytes, FP32Bytes int64
}

// PackedWeights is what the model holds as its checkpoint stores it (zero unless loaded
// by Load with dtype fp8 from an FP8 checkpoint).
func (m *Model) PackedWeights() PackedWeights { return m.W.packed }

// add counts w, whose float32 form is n values.
func (p *PackedWeights) add(w *ref.Weight, n int) {
	if w.DType == ref.DTypeFP4 {
		p.FP4++
	} else {
		p.FP8++
	}
	p.Bytes += w.Bytes()
	p.FP32Bytes += 4 * int64(n)
}

// packedFP8 sets *dst to field src ([n, k]) as pk's checkpoint stores it, when that is
// FP8 in 128×128 blocks; false (nothing set) otherwise, or without pk.
func (m *Model) packedFP8(pk *gpuPacked, src *[]float32, dst **ref.Weight, n, k int) (bool, error) {
	p, ok, err := pk.fp8(src)
	if err != nil || !ok {
		return false, err
	}
	if p.Out != n || p.In != k {
		return false, fmt.Errorf("fp8 weight stored [%d, %d], the model multiplies [%d, %d]", p.Out, p.In, n, k)
	}
	w, err := ref.WeightFP8(&ref.FP8Matrix{N: n, K: k, W: p.W, Scale: p.Scale, BlockRows: 128, BlockCols: 128})
	if err != nil {
		return false, err
	}
	*dst = w
	m.W.packed.add(w, n*k)
	return true, nil
}

// packedOA sets oa[g] to wo_a's block of output group g as the checkpoint stores it, when
// that is FP8 cut in whole scale blocks by group (splitFP8); false otherwise.
func (m *Model) packedOA(pk *gpuPacked, l *Layer, oa []*ref.Weight) (bool, error) {
	p, ok, err := pk.fp8(&l.OA)
	if err != nil || !ok {
		return false, err
	}
	parts, split := splitFP8(p, len(oa))
	if !split {
		return false, nil
	}
	olr, gin := m.Config.OLoraRank, len(l.OA)/(len(oa)*m.Config.OLoraRank)
	for g, q := range parts {
		if q.Out != olr || q.In != gin {
			return false, fmt.Errorf("group %d stored [%d, %d], the model multiplies [%d, %d]", g, q.Out, q.In, olr, gin)
		}
		w, err := ref.WeightFP8(&ref.FP8Matrix{N: olr, K: gin, W: q.W, Scale: q.Scale, BlockRows: 128, BlockCols: 128})
		if err != nil {
			return false, err
		}
		oa[g] = w
		m.W.packed.add(w, olr*gin)
	}
	return true, nil
}

// packedExperts sets dst[e] to routed expert e's weight [n, k] of bank src (gate_up or
// down) as the checkpoint stores it, when every expert is MXFP4: its nibbles as stored and
// its E8M0 scales widened to float32; false otherwise.
func (m *Model) packedExperts(pk *gpuPacked, src *[]float32, dst []*ref.Weight, n, k int) (bool, error) {
	bank, ok, err := pk.mxfp4(src)
	if err != nil || !ok {
		return false, err
	}
	if bank.Experts != len(dst) || bank.Out != n || bank.In != k {
		return false, fmt.Errorf("mxfp4 bank stored %d × [%d, %d], the model multiplies %d × [%d, %d]", bank.Experts, bank.Out, bank.In, len(dst), n, k)
	}
	const g = cuda.MXFP4Group
	sk := (k + g - 1) / g
	for e := range dst {
		sc := make([]float32, n*sk)
		for i, b := range bank.Scale[e*n*sk : (e+1)*n*sk] {
			sc[i] = weights.E8M0ToFloat32(b)
		}
		w, err := ref.WeightFP4(&ref.FP4Matrix{N: n, K: k, Group: g, W: bank.W[e*n*k/2 : (e+1)*n*k/2], Scale: sc})
		if err != nil {
			return false, fmt.Errorf("expert %d: %w", e, err)
		}
		dst[e] = w
		m.W.packed.add(w, n*k)
	}
	return true, nil
}
