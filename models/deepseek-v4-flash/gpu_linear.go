package deepseekv4flash

import (
	"fmt"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/gpurunner"
	"github.com/resin-llm/resin/core/kernels/cuda"
	"github.com/resin-llm/resin/core/weights"
	"github.com/resin-llm/resin/models/deepseek-v4-flash/kernels"
)

// gpuLinears runs the GPU path's x·wᵀ GEMMs (cuBLASLt) with every dense weight matrix in
// one element type: float32, or bf16 (half the memory; the float32 input rounded to bf16
// by kernels.CastBF16 first, float32 accumulation and output either way).
//
// With usePacked, weights can also stay as the checkpoint ships them (core/gpurunner's
// Linears): fp8Weights uploads an FP8 e4m3 linear with its 128×128 scales (1 byte a
// parameter plus 4 bytes per 16384, against 4 for float32: the float32 path's
// dequantisation costs 4× an FP8 linear's size, the bf16 path's 2×), mxfp4Weights an
// MXFP4 expert bank (half a byte a parameter plus one byte per 32, against 4: 7.5× less)
// or an FP8 one.
// Their addresses are matMulT's and expertsMatMulT's w as a dense weight's are, so a
// caller swaps the upload and keeps its GEMM calls: matMulT runs a packed FP8 weight
// through cuBLASLt's block-scaled FP8 GEMM on sm_90 with cuBLASLt 12.9+ (else the
// fallback kernel, both after quantising the input per 128 columns), and expertsMatMulT
// runs an MXFP4 bank as one W4A16 launch over the masked layout. describe says which ran.
//
// gpu.go and gpu_moe.go upload through fieldWeights and mxfp4Weights (gpu_packed.go) when
// OpenGPU found the checkpoint's tensors packed; the host's float32 copy (Model) stays.
type gpuLinears struct {
	blas    *cudart.Blas
	vk      *kernels.Kernels // the cast's (bf16 only)
	dt      cudart.DType     // cudart.F32 or cudart.BF16
	scratch cudart.DevicePtr // [scratchElems] bf16: a GEMM's rounded input
	elems   int

	q      *gpurunner.Linears                     // the packed weights' path (nil before usePacked)
	packed map[cudart.DevicePtr]*gpurunner.Linear // the packed weights by address
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

// usePacked readies packed weights: inputs of up to maxRows rows and maxIn columns, the FP8
// path chosen by path (gpurunner.FP8Auto: cuBLASLt where the device has it). Its scratch
// (maxRows·maxIn·3 bytes plus the scales) comes from a.
func (l *gpuLinears) usePacked(a *gpuArena, c *cudart.Ctx, d *cudart.Device, kk *cuda.Kernels, maxRows, maxIn int, path gpurunner.FP8Path) error {
	alloc := func(c *cudart.Ctx, n int64) (cudart.DevicePtr, error) { return a.alloc(c, int(n)) }
	q, err := gpurunner.NewLinears(c, d, l.blas, kk, gpurunner.LinearOptions{MaxRows: maxRows, MaxIn: maxIn, FP8: path, Alloc: alloc})
	if err != nil {
		return err
	}
	l.q, l.packed = q, map[cudart.DevicePtr]*gpurunner.Linear{}
	return nil
}

// fp8Weights uploads an FP8 weight, or bank of experts, as the checkpoint ships it (see
// gpurunner.PackedFP8).
func (l *gpuLinears) fp8Weights(a *gpuArena, c *cudart.Ctx, p gpurunner.PackedFP8) (cudart.DevicePtr, error) {
	if err := p.Check(); err != nil {
		return 0, fmt.Errorf("gpu: %w", err)
	}
	return l.packedAt(a, c, gpurunner.LinearFP8Block, p.Out, p.In, max(p.Experts, 1), p.W, p.Scale, 4)
}

// mxfp4Weights uploads an MXFP4 bank as the checkpoint ships it (see gpurunner.PackedMXFP4).
func (l *gpuLinears) mxfp4Weights(a *gpuArena, c *cudart.Ctx, p gpurunner.PackedMXFP4) (cudart.DevicePtr, error) {
	if err := p.Check(); err != nil {
		return 0, fmt.Errorf("gpu: %w", err)
	}
	return l.packedAt(a, c, gpurunner.LinearMXFP4, p.Out, p.In, p.Experts, p.W, p.Scale, 1)
}

func (l *gpuLinears) packedAt(a *gpuArena, c *cudart.Ctx, d gpurunner.LinearDType, out, in, experts int, w []byte, scale any, scaleSize int) (cudart.DevicePtr, error) {
	if l.q == nil {
		return 0, fmt.Errorf("gpu: a packed %v weight before usePacked", d)
	}
	wp, err := upload(a, c, w, 1)
	if err != nil {
		return 0, err
	}
	var sp cudart.DevicePtr
	switch s := scale.(type) {
	case []float32:
		sp, err = upload(a, c, s, scaleSize)
	case []byte:
		sp, err = upload(a, c, s, scaleSize)
	}
	if err != nil {
		return 0, err
	}
	lw, err := l.q.LinearAt(d, out, in, experts, wp, sp)
	if err != nil {
		return 0, err
	}
	l.packed[wp] = lw
	return wp, nil
}

// checkpointWeights uploads the GEMM weight name [out, in]: packed when r is not nil and
// the checkpoint stores it as FP8 (F8_E4M3), else v (its float32 values) in the linears'
// element type.
func (l *gpuLinears) checkpointWeights(a *gpuArena, c *cudart.Ctx, r *gpurunner.PackedReader, name string, out, in int, v []float32) (cudart.DevicePtr, error) {
	if r != nil && l.q != nil {
		if dt, ok := r.Stored(name); ok && dt == weights.F8E4M3 {
			p, err := r.ReadFP8(name, out, in)
			if err != nil {
				return 0, err
			}
			return l.fp8Weights(a, c, p)
		}
	}
	return l.weights(a, c, v)
}

// describe names the GEMM paths: the dense element type, and the packed weights' count,
// device bytes (against their float32 size) and paths, a line each.
func (l *gpuLinears) describe() string {
	s := fmt.Sprintf("dense weights %v", l.dt)
	if l.q != nil && len(l.packed) > 0 {
		var bytes, f32 int64
		for _, w := range l.packed {
			bytes += w.Bytes()
			f32 += 4 * int64(max(w.Experts, 1)*w.Out*w.In)
		}
		s += fmt.Sprintf("; %d weights packed, %.1f MiB on the device (%.1f MiB in float32)\n", len(l.packed), float64(bytes)/(1<<20), float64(f32)/(1<<20))
		s += l.q.Describe()
	}
	return s
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
// A packed weight (fp8Weights, or an MXFP4 bank of one) runs its own path.
func (l *gpuLinears) matMulT(c *cudart.Ctx, s *cudart.Stream, out, x, w cudart.DevicePtr, n, in, outDim int) error {
	if lw := l.packed[w]; lw != nil {
		if lw.In != in || lw.Out != outDim {
			return fmt.Errorf("gpu: a GEMM of %d×%d over a packed %v weight [%d, %d]", outDim, in, lw.DType, lw.Out, lw.In)
		}
		return l.q.Forward(c, s, lw, out, x, n)
	}
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

// expertsMatMulT computes ye [experts, maxRows, outDim] float32 from xe [experts, maxRows,
// in] (cuda.MoEGather's layout) with the expert weights at w ([experts, outDim, in]):
// an MXFP4 bank (mxfp4Weights) in one W4A16 launch, an FP8 bank (fp8Weights with Experts;
// usePacked's maxRows must cover experts·maxRows) in one quantisation and one grouped FP8
// launch, both reading counts (the masked layout's, on the device) and writing zeros past
// each count; dense weights as one GEMM per expert over its whole block of maxRows rows
// (rows past the count are the gather's zeros).
func (l *gpuLinears) expertsMatMulT(c *cudart.Ctx, s *cudart.Stream, ye, xe, counts, w cudart.DevicePtr, experts, maxRows, in, outDim int) error {
	if lw := l.packed[w]; lw != nil {
		if lw.Experts != experts || lw.In != in || lw.Out != outDim {
			return fmt.Errorf("gpu: experts %d × [%d, %d] over a packed %v weight %d × [%d, %d]", experts, outDim, in, lw.DType, lw.Experts, lw.Out, lw.In)
		}
		return l.q.Experts(c, s, lw, ye, xe, counts, maxRows)
	}
	for ex := range experts {
		x, y := xe+cudart.DevicePtr(4*ex*maxRows*in), ye+cudart.DevicePtr(4*ex*maxRows*outDim)
		if err := l.matMulT(c, s, y, x, l.at(w, ex*outDim*in), maxRows, in, outDim); err != nil {
			return err
		}
	}
	return nil
}
