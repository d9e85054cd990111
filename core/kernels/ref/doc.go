// Package ref holds the CPU reference operators that Resin's models are built from: GEMM
// (on the BLAS core/blas loads, else the package's own, or gonum), RMSNorm, rotary embeddings, SiLU-and-mul,
// softmax, embedding gather, attention over a paged KV cache, MoE top-k routing, argmax,
// mHC hyper-connections and the Kimi Delta Attention recurrence with its causal
// convolution.
//
// They are the specification the CUDA kernels in core/kernels/cuda are checked against, and
// the CPU backend of every model. Each one is written as plain loops over indices with the
// shapes in a comment; only the GEMMs go through optimised code. The speed of the CPU
// backend comes from a few fast forms beside them:
//   - without a BLAS library (core/blas: RESIN_BLAS), the package's own GEMM (sgemm.go):
//     packed and cache-blocked, on 14×32 AVX-512 or 6×16 AVX2+FMA micro-kernels in
//     assembly (sgemm_amd64.s), about as fast as OpenBLAS on the models' prefill shapes;
//     from 9 rows up a row's bits depend on k, not on the rows beside it or the number
//     of workers; MatMulTBF16 runs it (and the GEMV and skinny kernels) on bfloat16
//     weights;
//   - weights in fewer bytes (dtype.go: DType, Weight, the forms a model's --dtype picks):
//     bfloat16 (MatMulTBF16) and 8-bit blocks of 32 with a scale each (int8.go:
//     QuantizeInt8, MatMulTInt8, Q8_0×Q8_0 with exact int32 block sums on AVX-512 VNNI,
//     int8_amd64.s), a decode step reading a half or a bit over a quarter of fp32's bytes;
//     AMX reports whether the OS grants AMX tiles (no kernel uses them yet);
//   - a worker pool of GOMAXPROCS-1 goroutines (parallel.go) that the caller and its idle
//     workers share: large GEMMs split in one block per participant, PagedAttentionBatch
//     (the models' attention, checked against PagedAttention) across sequences, kv heads,
//     query tiles and key blocks, the elementwise operators (RMSNorm, Add, RoPE, SiLUMul)
//     by rows and KDAChunked by heads; ParallelRange lends it to a model's own loops;
//   - AVX2 assembly on amd64 with the scalar forms' own steps and roundings, so their
//     values to the bit: SiLUMul (and SiLUMulClamped), the prefill softmax's row max and
//     exponentials (their float64 sum to its rounding), NeoX RoPE and AxpyF64
//     (expf_amd64.s);
//   - AVX2+FMA kernels (fma_amd64.go), equal to the reference within float32 rounding:
//     decode attention reading keys and values in place from their pages (attn_amd64.s),
//     and products of 2 to 8 rows, a decode batch's, streaming the weight once
//     (skinny_amd64.s; in 16 lanes where the CPU has AVX-512).
//
// Every vector form has a scalar fallback for other CPUs and architectures, tested against
// it by switching the kernels off.
//
// Conventions: every tensor is a row-major []float32; a shape [a, b, c] means element
// (i, j, l) lives at index (i*b+j)*c+l. Operators write into out slices the caller owns and
// allocate nothing (a GEMM on a BLAS library included), except that a GEMM that
// gonum splits across goroutines allocates a few small objects per call (MatMulT
// 64x512x512: 18 allocs, 2 KB),
// KDAStep allocates its per-call scratch (DV values), and PagedAttentionBatch's GEMMs for
// prefills allocate as MatMul does.
// A shape that does not match the slices, or an index out of range, is reported as an error
// naming the argument; no operator panics on bad input.
package ref

import "fmt"

// checkLen reports an error when slice name holds fewer than want elements.
func checkLen(op, name string, got, want int) error {
	if got < want {
		return fmt.Errorf("ref.%s: %s has %d elements, the shape needs %d", op, name, got, want)
	}
	return nil
}

// checkDims reports an error when any dimension is negative.
func checkDims(op string, dims ...int) error {
	for _, d := range dims {
		if d < 0 {
			return fmt.Errorf("ref.%s: negative dimension %d", op, d)
		}
	}
	return nil
}
