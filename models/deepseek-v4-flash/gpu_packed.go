package deepseekv4flash

import (
	"errors"
	"fmt"
	"slices"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/gpurunner"
	"github.com/resin-llm/resin/core/weights"
)

// gpuPacked is where the GPU runner finds the checkpoint's tensors as they are stored, for
// newGPUModel to upload them packed (gpuLinears' fp8Weights and mxfp4Weights) instead of
// Model's float32 copy: a gpurunner.PackedReader over the shards, and for each field of
// Model.W the param that names it (params, the one table of the model's names). A field
// the checkpoint does not store as FP8 (or, for routed experts, MXFP4) is uploaded from
// its float32 values as before.
type gpuPacked struct {
	ck     *weights.Checkpoint
	r      *gpurunner.PackedReader
	q      *weights.Quant
	params map[*[]float32]param
}

// openGPUPacked opens dir's checkpoint for m's packed tensors: nil (and no error) when dir
// has no safetensors (random weights) or its config has no quantization_config (nothing is
// stored packed). close releases it once the weights are uploaded.
func openGPUPacked(dir string, m *Model) (*gpuPacked, error) {
	q := m.Config.Quant
	if q == nil || q.Method == "modelopt" {
		return nil, nil
	}
	ck, err := weights.Open(dir)
	if errors.Is(err, weights.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	r, err := gpurunner.NewPackedReader(ck, q)
	if err != nil {
		ck.Close()
		return nil, err
	}
	p := &gpuPacked{ck: ck, r: r, q: q, params: map[*[]float32]param{}}
	for _, pr := range params(m.Config, m.W, m.W.MTP != nil) {
		if pr.dst != nil {
			p.params[pr.dst] = pr
		}
	}
	return p, nil
}

func (p *gpuPacked) close() {
	if p != nil {
		p.r.Close()
		p.ck.Close()
	}
}

// stored returns the name under which the checkpoint holds field dst, and its stored type.
func (p *gpuPacked) stored(dst *[]float32) (string, weights.DType, param, bool) {
	pr, ok := p.params[dst]
	if !ok {
		return "", "", pr, false
	}
	for _, name := range slices.Concat(pr.names[:], pr.alias) {
		if dt, ok := p.r.Stored(name); ok {
			return name, dt, pr, true
		}
	}
	return "", "", pr, false
}

// fp8 reads field dst ([out, in]) as the checkpoint's FP8 weight; ok is false when it is
// stored otherwise (bf16, f32, or not a matrix), or in scale blocks other than the 128×128
// the GPU's FP8 linears take (then its float32 values are uploaded).
func (p *gpuPacked) fp8(dst *[]float32) (_ gpurunner.PackedFP8, ok bool, err error) {
	if p == nil || p.q.BlockSize != [2]int{128, 128} {
		return gpurunner.PackedFP8{}, false, nil
	}
	name, dt, pr, found := p.stored(dst)
	if !found || dt != weights.F8E4M3 || len(pr.shape) != 2 || pr.experts > 0 {
		return gpurunner.PackedFP8{}, false, nil
	}
	w, err := p.r.ReadFP8(name, pr.shape[0], pr.shape[1])
	return w, err == nil, err
}

// mxfp4 reads the routed experts' bank dst ([experts, out, in]: gate_up, gate rows then
// up rows, or down) as MXFP4: the fused tensor, or the per-expert w1/w3 (w2) tensors of
// DeepSeek's layout stacked. ok is false when the experts are not all stored as FP4.
func (p *gpuPacked) mxfp4(dst *[]float32) (_ gpurunner.PackedMXFP4, ok bool, err error) {
	if p == nil || p.q.ExpertDType != weights.ExpertFP4 {
		return gpurunner.PackedMXFP4{}, false, nil
	}
	pr, found := p.params[dst]
	if !found || pr.experts == 0 {
		return gpurunner.PackedMXFP4{}, false, nil
	}
	e, out, in := pr.experts, pr.shape[1], pr.shape[2]
	isFP4 := func(name string) bool {
		dt, ok := p.r.Stored(name)
		return ok && (dt == weights.I8 || dt == weights.U8)
	}
	if name := pr.names[ModuleNames]; isFP4(name) {
		w, err := p.r.ReadMXFP4(name, e, out, in)
		return w, err == nil, err
	}
	for _, pat := range []string{pr.names[UpstreamNames], pr.names[HybridNames]} {
		if !isFP4(fmt.Sprintf(pat, 0, pr.expertLeaf[0])) {
			continue
		}
		rows := out
		if pr.expertLeaf[1] != "" {
			rows /= 2
		}
		bank := gpurunner.PackedMXFP4{Experts: e, Out: out, In: in}
		for ex := range e {
			for _, leaf := range pr.expertLeaf {
				if leaf == "" {
					continue
				}
				name := fmt.Sprintf(pat, ex, leaf)
				if !isFP4(name) {
					return gpurunner.PackedMXFP4{}, false, nil // mixed storage: the float32 copy
				}
				w, err := p.r.ReadMXFP4(name, 1, rows, in)
				if err != nil {
					return gpurunner.PackedMXFP4{}, false, err
				}
				bank.W = append(bank.W, w.W...)
				bank.Scale = append(bank.Scale, w.Scale...)
			}
		}
		return bank, true, bank.Check()
	}
	return gpurunner.PackedMXFP4{}, false, nil
}

// splitFP8 cuts an FP8 weight [groups·rows, in] into groups weights [rows, in] (wo_a's
// output groups), each with scale blocks of its own rows; ok is false when a group's
// 128-row blocks would straddle the checkpoint's (rows neither a multiple nor a divisor
// of 128).
func splitFP8(p gpurunner.PackedFP8, groups int) ([]gpurunner.PackedFP8, bool) {
	if groups <= 0 || p.Out%groups != 0 {
		return nil, false
	}
	rows := p.Out / groups
	if rows%128 != 0 && 128%rows != 0 {
		return nil, false
	}
	sc := (p.In + 127) / 128
	var out []gpurunner.PackedFP8
	for g := range groups {
		q := gpurunner.PackedFP8{Out: rows, In: p.In, W: p.W[g*rows*p.In : (g+1)*rows*p.In]}
		for b := 0; b < rows; b += 128 {
			r := (g*rows + b) / 128
			q.Scale = append(q.Scale, p.Scale[r*sc:(r+1)*sc]...)
		}
		out = append(out, q)
	}
	return out, true
}

// fieldWeights uploads the GEMM weight in field src of Model.W: packed when pk finds it
// stored as FP8, else its float32 values in the linears' element type.
func (l *gpuLinears) fieldWeights(a *gpuArena, c *cudart.Ctx, pk *gpuPacked, src *[]float32) (cudart.DevicePtr, error) {
	if l.q != nil {
		p, ok, err := pk.fp8(src)
		if err != nil {
			return 0, err
		}
		if ok {
			return l.fp8Weights(a, c, p)
		}
	}
	return l.weights(a, c, *src)
}
