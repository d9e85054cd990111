package glm5flash

import (
	"fmt"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/gpurunner"
	"github.com/resin-llm/resin/core/kernels/ref"
)

// The MLP, expert and lm_head weights in bf16 (GPUOptions.Weights), through core/gpurunner's
// Linears: each weight rounded to bf16 (nearest even) and uploaded with UploadBF16, the
// activation cast to bf16 by Linears.Forward, fp32 accumulation and output. The routed
// experts are one bf16 linear each, run over their blocks of the masked layout as the
// fp32 path runs them (Linears runs only MXFP4 and FP8 banks as one). The MTP layer's
// eh_proj, MoE and own head (if any) follow the same choice. The router, the mHC mixes and
// the MLA projections (gpuDSA, the MTP layer's too) stay fp32; the KDA projections follow
// GPUOptions.KDAWeights.

// newLinears makes the model's Linears for steps of rows rows and inputs up to maxIn, the
// FP8 linears (gpu_fp8.go) on path (gpurunner.FP8Auto: cuBLASLt where dev has it).
func (g *gpuModel) newLinears(c *cudart.Ctx, dev *cudart.Device, rows, maxIn int, path gpurunner.FP8Path) error {
	lin, err := gpurunner.NewLinears(c, dev, g.blas, g.kk, gpurunner.LinearOptions{MaxRows: rows, MaxIn: maxIn, FP8: path})
	if err != nil {
		return fmt.Errorf("gpu: bf16 weights: %w", err)
	}
	g.lin = lin
	return nil
}

// bf16Linear uploads w [out, in] rounded to bf16 as one of the model's linears (freed by
// close).
func (g *gpuModel) bf16Linear(c *cudart.Ctx, w []float32, out, in int) (*gpurunner.Linear, error) {
	h := make([]uint16, len(w))
	for i, v := range w {
		h[i] = ref.BF16(v)
	}
	l, err := g.lin.UploadBF16(c, h, out, in)
	if err != nil {
		return nil, fmt.Errorf("gpu: bf16 weights: %w", err)
	}
	g.linears = append(g.linears, l)
	return l, nil
}

// linear computes out [n, outDim] = x [n, in] · wᵀ: through l where the weight is one of
// the Linears (bf16), else the fp32 GEMM on w.
func (g *gpuModel) linear(c *cudart.Ctx, l *gpurunner.Linear, out, x, w cudart.DevicePtr, n, in, outDim int) error {
	if l != nil {
		return g.lin.Forward(c, g.s, l, out, x, n)
	}
	return g.gemm(c, out, x, w, n, in, outDim)
}

// closeLinears frees the bf16 weights and the Linears' scratch.
func (g *gpuModel) closeLinears(c *cudart.Ctx) {
	for _, l := range g.linears {
		l.Free(c)
	}
	g.linears = nil
	if g.lin != nil {
		g.lin.Close(c)
		g.lin = nil
	}
	if g.elin != nil {
		g.elin.Close(c)
		g.elin = nil
	}
}
