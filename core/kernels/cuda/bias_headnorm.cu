// bias_headnorm.cu: the attention variants of the Qwen family on the fused QKV activation,
// as models/llama's forward (addBias, then ref.RMSNorm per head, both before rotary).
//
// resin_add_bias_bf16: x [rows, dim] += bias [dim] in place, the sum rounded to bf16 once
// (the fused q|k|v bias after the QKV GEMM, the o bias after the output projection).
// Grid-stride; any grid.
//
// resin_head_rmsnorm_bf16: the per-head RMSNorm of q and k in place (Qwen3's q_norm and
// k_norm). x holds tokens rows of stride elements; each row starts with its heads query
// heads and then its kv_heads key heads, head_dim elements each (the fused QKV layout),
// so head j of token t is x[t*stride + j*head_dim ...] for every j < heads + kv_heads:
//   h[i] = h[i] / sqrt(mean_e h[e]^2 + eps) * w[i],  w = q_w for j < heads, else k_w.
// The values after the key heads are not touched. One warp per head; head_dim ≤ 256 (8
// elements per lane, held in registers). Grid: ceil(tokens*(heads+kv_heads) / warps per
// block) blocks; block: a multiple of 32 threads.
#include "prelude.cuh"

#define RESIN_HEADNORM_PER_LANE 8  // 8 * 32 = 256 = MaxHeadDim

RESIN_KERNEL void resin_add_bias_bf16(resin_bf16* __restrict__ x, const resin_bf16* __restrict__ bias,
                                      int rows, int dim) {
  long long total = (long long)rows * dim;
  for (long long t = resin_global_tid(); t < total; t += (long long)RESIN_NTID_X * RESIN_NCTAID_X)
    x[t] = resin_f2bf(resin_bf2f(x[t]) + resin_bf2f(bias[t % dim]));
}

RESIN_KERNEL void resin_head_rmsnorm_bf16(resin_bf16* __restrict__ x, const resin_bf16* __restrict__ q_w,
                                          const resin_bf16* __restrict__ k_w, int tokens, int heads,
                                          int kv_heads, int head_dim, long long stride, float eps) {
  int per = heads + kv_heads;
  long long row = (long long)RESIN_BID_X * (RESIN_NTID_X / RESIN_WARP) + RESIN_TID_X / RESIN_WARP;
  if (row >= (long long)tokens * per) return;  // the whole warp leaves together
  int lane = RESIN_TID_X % RESIN_WARP;
  long long t = row / per;
  int j = (int)(row % per);
  resin_bf16* h = x + t * stride + (long long)j * head_dim;
  const resin_bf16* w = j < heads ? q_w : k_w;
  float v[RESIN_HEADNORM_PER_LANE];
  float ss = 0.0f;
#pragma unroll
  for (int i = 0; i < RESIN_HEADNORM_PER_LANE; i++) {
    int e = lane + i * RESIN_WARP;
    v[i] = e < head_dim ? resin_bf2f(h[e]) : 0.0f;
    ss += v[i] * v[i];
  }
  ss = resin_warp_sum(ss);
  float inv = resin_rsqrtf(ss / (float)head_dim + eps);
#pragma unroll
  for (int i = 0; i < RESIN_HEADNORM_PER_LANE; i++) {
    int e = lane + i * RESIN_WARP;
    if (e < head_dim) h[e] = resin_f2bf(v[i] * inv * resin_bf2f(w[e]));
  }
}
