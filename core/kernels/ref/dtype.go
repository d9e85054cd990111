package ref

import (
	"fmt"
	"strings"
)

// DType is the form a model holds its projection weights in on the CPU, and multiplies
// them in: float32 (MatMulT), bfloat16 widened to float32 as read (MatMulTBF16), 8-bit
// blocks of 32 with a scale each (MatMulTInt8), or float8 e4m3 in blocks of 128×128 with
// a scale each (MatMulTFP8: a checkpoint's FP8 linears as stored, others quantised at
// load by QuantizeFP8; a model keeps MXFP4 routed experts as stored, MatMulTFP4, dtype
// "fp4"). Activations, norms, embeddings and the KV cache stay float32 in every one.
type DType string

const (
	DTypeFP32 DType = "fp32"
	DTypeBF16 DType = "bf16"
	DTypeInt8 DType = "int8"
	DTypeFP8  DType = "fp8"
	// DTypeFP4 is a Weight's dtype for a checkpoint's MXFP4 experts (WeightFP4), kept so
	// under --dtype fp8; not a --dtype of its own.
	DTypeFP4 DType = "fp4"
)

// DTypes lists the dtypes ParseDType accepts.
var DTypes = []DType{DTypeFP32, DTypeBF16, DTypeInt8, DTypeFP8}

// ParseDType reads a --dtype value: fp32 (or float32, f32; "" is fp32), bf16 (bfloat16),
// int8 (q8_0) or fp8 (e4m3).
func ParseDType(s string) (DType, error) {
	switch strings.ToLower(s) {
	case "", "fp32", "float32", "f32":
		return DTypeFP32, nil
	case "bf16", "bfloat16":
		return DTypeBF16, nil
	case "int8", "q8_0", "q8":
		return DTypeInt8, nil
	case "fp8", "e4m3", "float8_e4m3fn":
		return DTypeFP8, nil
	}
	return "", fmt.Errorf("dtype %q: want fp32, bf16, int8 or fp8", s)
}

// Kernel says what runs a product with weights of dtype dt on this CPU, for logs and
// `resin doctor`: "<dtype>: <kernel>".
func (dt DType) Kernel() string {
	switch dt {
	case DTypeBF16:
		mr, _ := gemmMicro()
		switch {
		case hasAMXBF16:
			return "bf16: AMX tiles (TDPBF16PS) for prefill and decode batches, a one-sequence decode step on the AVX-512 GEMV (faster there), activations rounded to bf16 in both, products summed in fp32 (RESIN_AMX=off computes in fp32 instead)"
		case mr == 0:
			return "bf16: widened to fp32 in blocks; gonum GEMM (no AVX2+FMA)"
		}
		amx := "no AMX: " + AMX().Reason
		if a := AMX(); a.Granted && a.BF16 {
			amx = "AMX granted but not used (RESIN_AMX=off, or no AVX-512 for its packing)"
		}
		prefill := fmt.Sprintf("own GEMM (%s micro-kernel)", GEMMKernel())
		if hasBF16Dot {
			prefill = "prefill on AVX-512 BF16 dot products, activations rounded to bf16 (RESIN_BF16_DOT=on)"
		} else if canBF16Dot {
			prefill += "; RESIN_BF16_DOT=on runs prefill on AVX-512 BF16 dot products (activations rounded to bf16)"
		}
		return fmt.Sprintf("bf16: widened to fp32 as read; %s GEMV, %s; %s", gemvKernel(), prefill, amx)
	case DTypeInt8:
		amx := ""
		if hasAMXInt8 {
			amx = "; prefill on AMX tiles (TDPBSUD, the same sums; RESIN_AMX=off declines)"
		}
		return fmt.Sprintf("int8: blocks of 32, Q8_0×Q8_0 with exact int32 block sums; %s%s", Int8Kernel(), amx)
	case DTypeFP8:
		return fmt.Sprintf("fp8: an FP8 checkpoint's tensors as stored (FP8 e4m3 in 128×128 blocks, MXFP4 experts, bf16 and fp32 the rest), else every projection quantised to e4m3 in 128×128 blocks at load; %s dot products, batches widened in runs for the %s", PackedKernel(), fp32Kernel())
	}
	return "fp32: " + fp32Kernel()
}

// fp32Kernel names the float32 GEMM.
func fp32Kernel() string {
	if b := GEMMBackend(); b != "own" {
		return b + " GEMM"
	}
	return "own GEMM (" + GEMMKernel() + " micro-kernel)"
}

// gemvKernel names the lanes the GEMV kernels run in.
func gemvKernel() string {
	if hasSkinnyAVX512 {
		return "AVX-512"
	}
	return "AVX2+FMA"
}

// Weight is a projection's weight [n, k] (row-major, as a Linear's) in a DType, the form
// a model's forward multiplies by. Build one with NewWeight; the zero value holds nothing.
type Weight struct {
	DType DType
	N, K  int
	f32   []float32
	bf16  []uint16
	// fp32Only: a bf16 weight's products computed in float32 (NewWeightAsStored).
	fp32Only bool
	q8       *Int8Matrix
	f8       *FP8Matrix
	f4       *FP4Matrix
}

// WeightFP8 holds a checkpoint's FP8 weight as stored (not copied), dtype fp8.
func WeightFP8(w *FP8Matrix) (*Weight, error) {
	if err := w.check(); err != nil {
		return nil, err
	}
	return &Weight{DType: DTypeFP8, N: w.N, K: w.K, f8: w}, nil
}

// WeightFP4 holds a checkpoint's FP4 weight as stored (not copied), dtype fp4.
func WeightFP4(w *FP4Matrix) (*Weight, error) {
	if err := w.check(); err != nil {
		return nil, err
	}
	return &Weight{DType: DTypeFP4, N: w.N, K: w.K, f4: w}, nil
}

// NewWeight holds w [n, k] as dt: fp32 keeps w itself (no copy), bf16 rounds each value
// to the nearest bfloat16 (exact for weights loaded from a bfloat16 checkpoint), int8
// quantises it (QuantizeInt8), fp8 quantises it to e4m3 in 128×128 blocks (QuantizeFP8).
// w is not kept by bf16, int8 and fp8 weights.
func NewWeight(w []float32, n, k int, dt DType) (*Weight, error) {
	if err := checkDims("NewWeight", n, k); err != nil {
		return nil, err
	}
	if err := checkLen("NewWeight", "w", len(w), n*k); err != nil {
		return nil, err
	}
	out := &Weight{DType: dt, N: n, K: k}
	switch dt {
	case DTypeFP32:
		out.f32 = w[:n*k]
	case DTypeBF16:
		out.bf16 = make([]uint16, n*k)
		for i, v := range w[:n*k] {
			out.bf16[i] = BF16(v)
		}
	case DTypeInt8:
		q, err := QuantizeInt8(w, n, k)
		if err != nil {
			return nil, err
		}
		out.q8 = q
	case DTypeFP8:
		q, err := QuantizeFP8(w, n, k)
		if err != nil {
			return nil, err
		}
		out.f8 = q
	default:
		return nil, fmt.Errorf("ref.NewWeight: dtype %q: want fp32, bf16, int8 or fp8", dt)
	}
	return out, nil
}

// NewWeightAsStored is NewWeight for a checkpoint's own tensor kept in the dtype it is
// stored in (--dtype fp8 holds a checkpoint's bf16 tensors in bf16): its products are
// computed in float32 on the weights it holds, as the checkpoint's dequantised fp32
// forward computes, a bf16 weight widened as read and never on AMX tiles (which round
// the activations to bf16 as well: NewWeight's bf16 where AMX runs).
func NewWeightAsStored(w []float32, n, k int, dt DType) (*Weight, error) {
	if dt != DTypeBF16 {
		return NewWeight(w, n, k, dt)
	}
	if err := checkDims("NewWeightAsStored", n, k); err != nil {
		return nil, err
	}
	if err := checkLen("NewWeightAsStored", "w", len(w), n*k); err != nil {
		return nil, err
	}
	out := &Weight{DType: dt, N: n, K: k, bf16: make([]uint16, n*k), fp32Only: true}
	for i, v := range w[:n*k] {
		out.bf16[i] = BF16(v)
	}
	return out, nil
}

// Bytes is the memory the weight's values take in its dtype.
func (w *Weight) Bytes() int64 {
	switch {
	case w.f8 != nil:
		return w.f8.Bytes()
	case w.f4 != nil:
		return w.f4.Bytes()
	case w.q8 != nil:
		return w.q8.Bytes()
	case w.bf16 != nil:
		return 2 * int64(len(w.bf16))
	}
	return 4 * int64(len(w.f32))
}

// MatMulT computes out = x·wᵀ: x [m, K], out [m, N], on the dtype's product.
func (w *Weight) MatMulT(out, x []float32, m int) error {
	switch {
	case w == nil:
		return fmt.Errorf("ref.Weight.MatMulT: no weight")
	case w.f8 != nil:
		return MatMulTFP8(out, x, w.f8, m)
	case w.f4 != nil:
		return MatMulTFP4(out, x, w.f4, m)
	case w.q8 != nil:
		return MatMulTInt8(out, x, w.q8, m)
	case w.bf16 != nil && w.fp32Only:
		return matMulTBF16F32(out, x, w.bf16, m, w.K, w.N)
	case w.bf16 != nil:
		return MatMulTBF16(out, x, w.bf16, m, w.K, w.N)
	}
	return MatMulT(out, x, w.f32, m, w.K, w.N)
}
