package cuda

import (
	"fmt"
	"math"

	"github.com/resin-llm/resin/core/cudart"
)

// argKind is the C type of one kernel parameter.
type argKind uint8

const (
	argPtr argKind = iota + 1 // any pointer
	argI32                    // int
	argI64                    // long long
	argF32                    // float
)

// argBuf records a kernel's parameters with their C types before they are handed to
// cudart.Args, so that a test can compare them with the kernel's signature without a GPU.
// Each launcher reuses its own argBuf: packing allocates nothing.
type argBuf struct {
	kinds [cudart.MaxArgs]argKind
	vals  [cudart.MaxArgs]uint64
	n     int
	over  bool
}

func (b *argBuf) reset() *argBuf { b.n, b.over = 0, false; return b }

func (b *argBuf) put(k argKind, v uint64) *argBuf {
	if b.n == cudart.MaxArgs {
		b.over = true
		return b
	}
	b.kinds[b.n], b.vals[b.n] = k, v
	b.n++
	return b
}

func (b *argBuf) ptr(p cudart.DevicePtr) *argBuf { return b.put(argPtr, uint64(p)) }
func (b *argBuf) i32(v int) *argBuf              { return b.put(argI32, uint64(uint32(int32(v)))) }
func (b *argBuf) i64(v int64) *argBuf            { return b.put(argI64, uint64(v)) }
func (b *argBuf) f32(v float32) *argBuf          { return b.put(argF32, uint64(math.Float32bits(v))) }

func (b *argBuf) flag(v bool) *argBuf {
	if v {
		return b.i32(1)
	}
	return b.i32(0)
}

// into copies the parameters into a, in order.
func (b *argBuf) into(a *cudart.Args) *cudart.Args {
	a.Reset()
	for i := range b.n {
		switch v := b.vals[i]; b.kinds[i] {
		case argPtr:
			a.Ptr(cudart.DevicePtr(v))
		case argI32:
			a.I32(int32(uint32(v)))
		case argI64:
			a.I64(int64(v))
		case argF32:
			a.F32(math.Float32frombits(uint32(v)))
		}
	}
	return a
}

// launchSpec is one kernel launch worked out on the host: which kernel, its geometry and
// its parameters. Building it needs no GPU; Kernels.launch queues it.
type launchSpec struct {
	kernel kernelID
	grid   cudart.Dim3
	block  cudart.Dim3
	shared int
	args   argBuf
}

// launch queues spec's kernel on s.
func (k *Kernels) launch(c *cudart.Ctx, s *cudart.Stream, spec *launchSpec) error {
	if spec.args.over {
		return fmt.Errorf("cuda: %s takes more than %d parameters", kernelNames[spec.kernel].entry, cudart.MaxArgs)
	}
	return c.Launch(k.fn[spec.kernel], spec.grid, spec.block, spec.shared, s, spec.args.into(&k.args))
}

// kernelID names the kernels launched through a launchSpec.
type kernelID int

const (
	kAddRMSNormF32 kernelID = iota
	kAddRMSNormBF16
	kRMSNormBF16
	kRopeKVF32
	kRopeKVBF16
	kSiLUMulBF16
	kEmbeddingBF16
	kPrefillAttention
	kDecodeAttention
	kDecodeReduce
	kSample
	kAddBiasBF16
	kHeadRMSNormBF16
	kHyperPre
	kHyperPost
	kMoERoute
	kMoELayout
	kMoEGather
	kSwiGLUClamped
	kMoECombine
	kMoEMaskRows
	kFP8QuantF32
	kFP8QuantBF16
	kFP8GemmF32
	kFP8GemmBF16
	kMXFP4GemmF32
	kMXFP4GemmBF16
	kCastBF16
	kVerifyDrafts
	numKernels
)

// kernelNames gives each kernelID's source file and entry point.
var kernelNames = [numKernels]struct{ file, entry string }{
	kAddRMSNormF32:    {"add_rmsnorm.cu", "resin_add_rmsnorm_f32"},
	kAddRMSNormBF16:   {"add_rmsnorm.cu", "resin_add_rmsnorm_bf16"},
	kRMSNormBF16:      {"add_rmsnorm.cu", "resin_rmsnorm_bf16"},
	kRopeKVF32:        {"rope_kv.cu", "resin_rope_kv_f32"},
	kRopeKVBF16:       {"rope_kv.cu", "resin_rope_kv_bf16"},
	kSiLUMulBF16:      {"silu_mul.cu", "resin_silu_mul_bf16"},
	kEmbeddingBF16:    {"embedding.cu", "resin_embedding_bf16"},
	kPrefillAttention: {"flash_attention.cu", "resin_prefill_attention_bf16"},
	kDecodeAttention:  {"flash_attention.cu", "resin_decode_attention_bf16"},
	kDecodeReduce:     {"flash_attention.cu", "resin_decode_reduce_bf16"},
	kSample:           {"sampling.cu", "resin_sample"},
	kAddBiasBF16:      {"bias_headnorm.cu", "resin_add_bias_bf16"},
	kHeadRMSNormBF16:  {"bias_headnorm.cu", "resin_head_rmsnorm_bf16"},
	kHyperPre:         {"mhc.cu", "resin_mhc_pre_f32"},
	kHyperPost:        {"mhc.cu", "resin_mhc_post_f32"},
	kMoERoute:         {"moe_masked.cu", "resin_moe_route_f32"},
	kMoELayout:        {"moe_masked.cu", "resin_moe_masked_layout"},
	kMoEGather:        {"moe_masked.cu", "resin_moe_gather_f32"},
	kSwiGLUClamped:    {"moe_masked.cu", "resin_swiglu_clamped_f32"},
	kMoECombine:       {"moe_masked.cu", "resin_moe_combine_f32"},
	kMoEMaskRows:      {"moe_masked.cu", "resin_moe_mask_rows"},
	kFP8QuantF32:      {"quant_linear.cu", "resin_fp8_quant_f32"},
	kFP8QuantBF16:     {"quant_linear.cu", "resin_fp8_quant_bf16"},
	kFP8GemmF32:       {"quant_linear.cu", "resin_fp8_block_gemm_f32"},
	kFP8GemmBF16:      {"quant_linear.cu", "resin_fp8_block_gemm_bf16"},
	kMXFP4GemmF32:     {"quant_linear.cu", "resin_mxfp4_gemm_f32"},
	kMXFP4GemmBF16:    {"quant_linear.cu", "resin_mxfp4_gemm_bf16"},
	kCastBF16:         {"quant_linear.cu", "resin_cast_bf16"},
	kVerifyDrafts:     {"verify.cu", "resin_verify_drafts"},
}
