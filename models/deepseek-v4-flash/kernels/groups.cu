// groups.cu: the float32 → bf16 cast before a GEMM on bf16 weights, and the layout
// change around V4's grouped output projection (wo_a): the attention output
// [rows, groups, group_dim] becomes [groups, rows, group_dim] so that each group's block
// of wo_a is one contiguous GEMM, and the groups' results [groups, rows, rank] go back to
// [rows, groups, rank] for wo_b.
//
// deepseekv4flash_add_rows_f32: x[t, i, :] += y[t, :] for x [rows, rep, dim], y [rows, dim]
// (the MTP head's e_proj output added to each of its h_proj streams); one thread per value.
//
// deepseekv4flash_swap01_f32: dst[j, i, k] = src[i, j, k] for src [a, b, c]; one thread per
// value.
//
// deepseekv4flash_shard_ids: out[i] = in[i] - start where lo <= in[i] < hi, else -1: token
// ids as a tensor-parallel rank's embedding shard looks them up (the MTP head's input
// tokens, drafted on the device); one thread per id.
#include "prelude.cuh"

RESIN_KERNEL void deepseekv4flash_swap01_f32(float* __restrict__ dst, const float* __restrict__ src,
                                             int a, int b, int c) {
  long long total = (long long)a * b * c;
  for (long long t = resin_global_tid(); t < total; t += (long long)RESIN_NTID_X * RESIN_NCTAID_X) {
    int k = (int)(t % c);
    long long ij = t / c;
    int j = (int)(ij % b);
    long long i = ij / b;
    dst[((long long)j * a + i) * c + k] = src[t];
  }
}

// deepseekv4flash_cast_bf16: dst[i] = src[i] rounded to bfloat16 (nearest even), the
// input of a GEMM on bf16 weights; one thread per value.
RESIN_KERNEL void deepseekv4flash_cast_bf16(resin_bf16* __restrict__ dst, const float* __restrict__ src,
                                            long long n) {
  for (long long t = resin_global_tid(); t < n; t += (long long)RESIN_NTID_X * RESIN_NCTAID_X)
    dst[t] = resin_f2bf(src[t]);
}

RESIN_KERNEL void deepseekv4flash_add_rows_f32(float* __restrict__ x, const float* __restrict__ y, int rows,
                                               int rep, int dim) {
  long long total = (long long)rows * rep * dim;
  for (long long t = resin_global_tid(); t < total; t += (long long)RESIN_NTID_X * RESIN_NCTAID_X) {
    int k = (int)(t % dim);
    long long row = t / dim / rep;
    x[t] += y[row * dim + k];
  }
}

RESIN_KERNEL void deepseekv4flash_shard_ids(int* __restrict__ out, const int* __restrict__ in, int n, int start,
                                            int lo, int hi) {
  for (long long t = resin_global_tid(); t < n; t += (long long)RESIN_NTID_X * RESIN_NCTAID_X) {
    int id = in[t];
    out[t] = (id >= lo && id < hi) ? id - start : -1;
  }
}
