package deepseekv4flash

import (
	"fmt"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/weights"
	"github.com/resin-llm/resin/models/deepseek-v4-flash/kernels"
)

// gpuLinears runs the GPU path's x·wᵀ GEMMs (cuBLASLt) with every weight matrix in one
// element type: float32, or bf16 (half the memory; the float32 input rounded to bf16 by
// kernels.CastBF16 first, float32 accumulation and output either way).
type gpuLinears struct {
	blas    *cudart.Blas
	vk      *kernels.Kernels // the cast's (bf16 only)
	dt      cudart.DType     // cudart.F32 or cudart.BF16
	scratch cudart.DevicePtr // [scratchElems] bf16: a GEMM's rounded input
	elems   int
}

// newGPULinears returns the GEMMs of dt, with room for inputs of up to maxElems values.
func newGPULinears(a *gpuArena, c *cudart.Ctx, blas *cudart.Blas, vk *kernels.Kernels, dt cudart.DType, maxElems int) (*gpuLinears, error) {
	l := &gpuLinears{blas: blas, vk: vk, dt: dt}
	switch dt {
	case cudart.F32:
	case cudart.BF16:
		var err error
		if l.scratch, err = a.alloc(c, 2*maxElems); err != nil {
			return nil, err
		}
		l.elems = maxElems
	default:
		return nil, fmt.Errorf("gpu: weights in %v (float32 or bf16)", dt)
	}
	return l, nil
}

// size is the bytes of one weight element.
func (l *gpuLinears) size() int {
	if l.dt == cudart.BF16 {
		return 2
	}
	return 4
}

// at is the address of element i of the weights at w.
func (l *gpuLinears) at(w cudart.DevicePtr, i int) cudart.DevicePtr {
	return w + cudart.DevicePtr(i*l.size())
}

// weights uploads a weight matrix in the linears' element type.
func (l *gpuLinears) weights(a *gpuArena, c *cudart.Ctx, v []float32) (cudart.DevicePtr, error) {
	if l.dt == cudart.F32 {
		return upload(a, c, v, 4)
	}
	h := make([]uint16, len(v))
	for i, f := range v {
		h[i] = weights.Float32ToBF16(f)
	}
	return upload(a, c, h, 2)
}

// matMulT computes out [n, outDim] float32 = x [n, in] float32 · w [outDim, in]ᵀ on s.
func (l *gpuLinears) matMulT(c *cudart.Ctx, s *cudart.Stream, out, x, w cudart.DevicePtr, n, in, outDim int) error {
	if l.dt == cudart.F32 {
		return l.blas.MatMulT(c, s, cudart.F32, out, x, w, n, in, outDim)
	}
	if n*in > l.elems {
		return fmt.Errorf("gpu: a GEMM input of %d×%d values, the cast scratch holds %d", n, in, l.elems)
	}
	cast, err := kernels.CastBF16(l.scratch, x, n*in)
	if err != nil {
		return err
	}
	if err := l.vk.Run(c, s, &cast); err != nil {
		return err
	}
	g := cudart.GemmSpec{M: n, N: outDim, K: in, TransB: true, AType: cudart.BF16, BType: cudart.BF16, OutType: cudart.F32, Alpha: 1}
	return l.blas.Gemm(c, s, g, l.scratch, w, 0, out)
}
