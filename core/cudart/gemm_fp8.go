package cudart

import (
	"fmt"
	"math"
	"runtime"
	"unsafe"

	"github.com/ebitengine/purego"
)

// scaleMode is a cublasLtMatmulMatrixScale_t (cuBLAS 12.9+).
type scaleMode int32

const (
	scaleVec128     scaleMode = 4 // CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F: one float32 per 128 inputs of a row
	scaleBlk128x128 scaleMode = 5 // CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F: one float32 per 128×128 block
)

// BlockScaledFP8MinVersion is the first cuBLASLt with the VEC128_32F and BLK128x128_32F
// scale modes (12.9.0).
const BlockScaledFP8MinVersion = 120900

// BlockScaledFP8 reports whether cuBLASLt runs MatMulFP8Block on d: cuBLASLt 12.9 or later
// on a compute capability 9.0 GPU (Hopper), the one architecture those scale modes are
// documented for (Blackwell's block-scaled modes are MXFP8's VEC32_UE8M0 instead). When it
// does not, say why; callers then run the CUDA fallback kernel (core/kernels/cuda.FP8Gemm),
// which computes the same product.
func BlockScaledFP8(d *Device) (bool, string) {
	if d == nil {
		return false, "no device"
	}
	return BlockScaledFP8On(d.Info)
}

// BlockScaledFP8On is BlockScaledFP8 for a device described by info (Devices' list), for
// reports that open no device (resin doctor).
func BlockScaledFP8On(info DeviceInfo) (bool, string) {
	v, err := CublasLtVersion()
	if err != nil {
		return false, fmt.Sprintf("no cuBLASLt: %v", err)
	}
	if v < BlockScaledFP8MinVersion {
		return false, fmt.Sprintf("cuBLASLt %d predates the block-scaled FP8 modes of %d", v, BlockScaledFP8MinVersion)
	}
	if info.Major != 9 || info.Minor != 0 {
		return false, fmt.Sprintf("cuBLASLt's VEC128/BLK128x128 FP8 modes need compute capability 9.0, the device is %d.%d", info.Major, info.Minor)
	}
	return true, fmt.Sprintf("cuBLASLt %d on sm_90", v)
}

// FP8BlockGemm is out[M, N] = x[M, K] · w[N, K]ᵀ over float8 e4m3 operands with
// DeepSeek's fine-grained scales, accumulated in float32:
//
//	out[i, j] = Σ_g (Σ_{k in g} x[i,k]·w[j,k]) · xScale[g·XScaleLD + i] · wScale[(j/128)·ceil(K/128) + g]
//
// x is quantised per row and group g of 128 columns (core/kernels/cuda.FP8Quant), its
// scales outer-dimension-major (M contiguous, XScaleLD must be 0 or M); w and wScale are
// the checkpoint's weight and weight_scale_inv as stored ([ceil(N/128), ceil(K/128)]
// float32, row-major). These are the layouts PyTorch's _scaled_mm hands cuBLASLt for
// 1x128 and 128x128 scaling ("outer-dim-major", and "near-inner-dim-major with 16-byte
// aligned strides", aten/src/ATen/native/cuda/ScaledBlas.cpp is_blockwise_1x128_scaling
// and is_blockwise_128x128_scaling): so ceil(K/128) must be a multiple of 4, as it is for
// K a multiple of 512 (every DeepSeek-V4 and GLM-5 FP8 linear); K and N multiples of 16. In cuBLASLt's column-major terms w is the A slot,
// transposed, with BLK128x128_32F, and x the B slot with VEC128_32F: the TN layout FP8
// GEMMs require. OutType is BF16 or F32.
type FP8BlockGemm struct {
	M, N, K  int
	XScaleLD int
	OutType  DType
}

func (g FP8BlockGemm) String() string {
	return fmt.Sprintf("fp8 block gemm m=%d n=%d k=%d e4m3·e4m3→%s", g.M, g.N, g.K, g.OutType)
}

func (g FP8BlockGemm) check() error {
	if g.M <= 0 || g.N <= 0 || g.K <= 0 || g.M > math.MaxInt32 || g.N > math.MaxInt32 || g.K > math.MaxInt32 {
		return fmt.Errorf("%v: dimensions must be positive int32s", g)
	}
	if g.K%16 != 0 || g.N%16 != 0 {
		return fmt.Errorf("%v: cuBLASLt's FP8 GEMMs need K and N multiples of 16 (16-byte rows)", g)
	}
	if kb := (g.K + 127) / 128; kb%4 != 0 {
		return fmt.Errorf("%v: cuBLASLt reads BLK128x128 scales in rows padded to 16 bytes, and the checkpoint's rows of ceil(K/128) = %d scales are not", g, kb)
	}
	if g.XScaleLD != 0 && g.XScaleLD < g.M {
		return fmt.Errorf("%v: activation scale leading dimension %d below M", g, g.XScaleLD)
	}
	if g.OutType != BF16 && g.OutType != F32 {
		return fmt.Errorf("%v: the output must be bf16 or f32", g)
	}
	return nil
}

// MatMulFP8Block computes g on stream s (see FP8BlockGemm) through cuBLASLt's block-scaled
// FP8 modes, with a cached plan as Gemm has; each call sets the plan's two scale
// pointers. Only the plan's first call allocates (TestEmulatedFP8BlockGemm counts). It must run inside Device.Do of the
// Blas's device and may be captured into a CUDA graph. Where BlockScaledFP8 is false,
// cuBLASLt refuses the plan (CUBLAS_STATUS_NOT_SUPPORTED or no algorithm).
func (b *Blas) MatMulFP8Block(c *Ctx, s *Stream, g FP8BlockGemm, out, x, xScale, w, wScale DevicePtr) error {
	if err := g.check(); err != nil {
		return err
	}
	if b.plans == nil {
		return fmt.Errorf("%v: cublasLt handle: %w", g, ErrClosed)
	}
	if c.dev != b.dev {
		return fmt.Errorf("%v: context of device %d, handle of device %d", g, c.dev.Info.Ordinal, b.dev.Info.Ordinal)
	}
	if g.XScaleLD != 0 && g.XScaleLD != g.M {
		// cuBLASLt takes no leading dimension for a scale tensor: a padded one is read as M-wide.
		return fmt.Errorf("%v: cuBLASLt reads the activation scales %d-wide, not with stride %d", g, g.M, g.XScaleLD)
	}
	spec := GemmSpec{M: g.M, N: g.N, K: g.K, TransB: true, AType: E4M3, BType: E4M3, OutType: g.OutType, Alpha: 1}
	key := spec.key(x, w, out, out)
	key.scaleA, key.scaleB = scaleBlk128x128, scaleVec128 // the A slot is w, the B slot x
	p, err := b.plan(key)
	if err != nil {
		return fmt.Errorf("%v: %w", g, err)
	}
	b.scalePtrs = [2]uintptr{uintptr(wScale), uintptr(xScale)}
	api := b.api
	for i := range b.scalePtrs {
		id := descAScalePtr + int32(i) // B_SCALE_POINTER follows A's
		b.attrCall = [4]uintptr{p.op, uintptr(id), uintptr(unsafe.Pointer(&b.scalePtrs[i])), 8}
		r, _, _ := purego.SyscallN(api.setAttr, b.attrCall[:]...)
		if err := api.check("cublasLtMatmulDescSetAttribute", int32(r)); err != nil {
			return fmt.Errorf("%v: set scale pointer attribute %d: %w", g, id, err)
		}
	}
	b.alpha, b.beta = 1, 0
	b.call = [matmulArgs]uintptr{b.h, p.op,
		uintptr(unsafe.Pointer(&b.alpha)), uintptr(w), p.a, uintptr(x), p.b,
		uintptr(unsafe.Pointer(&b.beta)), uintptr(out), p.c, uintptr(out), p.d,
		uintptr(unsafe.Pointer(&p.algo[0])), uintptr(b.ws.Ptr), uintptr(p.wsSize), s.handle()}
	r, _, _ := purego.SyscallN(api.matmul, b.call[:]...)
	runtime.KeepAlive(b)
	runtime.KeepAlive(p)
	if err := api.check("cublasLtMatmul", int32(r)); err != nil {
		return fmt.Errorf("%v: %w", g, err)
	}
	return nil
}
