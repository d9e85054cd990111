// kda_prep.cu: the element-wise and per-row steps around a KDA layer's recurrence
// (kda.cu), each the model's Go reference in ref.go (forward.go's kda, step by step):
//
//   glm5flash_causal_conv_silu  x, out: [tokens, channels]  w: [channels, kernel]
//                               state: [channels, kernel−1] (oldest first), updated
//     out[t, c] = SiLU(Σ_j w[c, j]·x̃[t − (kernel−1) + j, c]), x̃ = state then x.
//     A thread per channel carries the window in registers (kernel ≤ 8); a one-token
//     update is the same launch with tokens = 1. With group < channels the output is
//     split by channel groups, [channels/group, tokens, group] (KDA's [q; k; v] become
//     three contiguous [tokens, L] blocks); group = channels is the plain layout. With
//     snapshots non-null the state after each token t is also written to snapshots[t]
//     ([tokens, channels, kernel−1]), for restoring after rejected drafts. seqs sequences
//     run at once (grid y): sequence b's tokens are rows b·tokens.. of x and out (the
//     split's blocks are [seqs·tokens, group]) and its state is state[slots[b]]
//     (state[b] when slots is null) in a pool of [channels, kernel−1] states, or with
//     offsets non-null the state at state + offsets[b] floats (KDAStep's table); with
//     seq_start non-null sequence b is rows seq_start[b] to seq_start[b+1] instead (tokens
//     is then the rows' total). Grid (ceil(channels/256), seqs), block 256.
//   glm5flash_l2norm            x: [rows, dim] in place: x / sqrt(Σx² + 1e-6) · mul.
//   glm5flash_kda_gate          g: [tokens, heads·dh] in place, with f = g + dt_bias[h·dh+j]
//     and a = exp(A_log[h]): lower_bound·sigmoid(a·f) when has_lower_bound, else
//     −a·softplus(f) (the bounded and the unbounded forget gate).
//   glm5flash_sigmoid           x: [n] in place (β).
//   glm5flash_gated_rmsnorm     x, gate: [rows, dim]  w: [dim]
//     out = RMSNorm(x)·w·sigmoid(gate) (the per-head output norm; out may be x).
//   glm5flash_to_bf16           out[i] = bf16(x[i]) (round to nearest even), n elements: a
//     GEMM's bf16 operand from fp32 activations (KDA's projections are bf16 in checkpoints).
// The per-row kernels run a block a row (blockDim a multiple of 32), the rest a thread an
// element.
#include "prelude.cuh"

#define GLM5FLASH_CONV_MAX_KERNEL 8

RESIN_KERNEL void glm5flash_causal_conv_silu(float* __restrict__ out, float* __restrict__ state,
                                             const int* __restrict__ slots,
                                             const long long* __restrict__ offsets,
                                             const int* __restrict__ seq_start,
                                             float* __restrict__ snapshots,
                                             const float* __restrict__ x, const float* __restrict__ w,
                                             int tokens, int channels, int kernel, int group,
                                             int seqs) {
  long long c = resin_global_tid();
  if (c >= channels) return;
  int b = RESIN_BID_Y;
  long long slot = slots ? slots[b] : b;
  long long rows = seq_start ? (long long)tokens : (long long)seqs * tokens;
  long long first = seq_start ? seq_start[b] : (long long)b * tokens;
  int n = seq_start ? seq_start[b + 1] - seq_start[b] : tokens;
  int m = kernel - 1;
  float win[GLM5FLASH_CONV_MAX_KERNEL];
  float* st = (offsets ? state + offsets[b] : state + slot * channels * m) + (long long)c * m;
  const float* wc = w + c * kernel;
  // The window's loops run over the constant bound, guarded by m, so that win stays in
  // registers (a loop to m indexes it at run time and puts it in local memory).
#pragma unroll
  for (int j = 0; j < GLM5FLASH_CONV_MAX_KERNEL; j++) win[j] = j < m ? st[j] : 0.0f;
  for (int t = 0; t < n; t++) {
    long long row = first + t;
    float xv = x[row * channels + c];
    float s = wc[m] * xv;
#pragma unroll
    for (int j = 0; j < GLM5FLASH_CONV_MAX_KERNEL; j++)
      if (j < m) s += wc[j] * win[j];
    out[(c / group) * rows * group + row * group + c % group] = s / (1.0f + resin_expf(-s));
#pragma unroll
    for (int j = 0; j < GLM5FLASH_CONV_MAX_KERNEL; j++) {
      if (j + 1 < m) win[j] = win[j + 1];
      else if (j + 1 == m) win[j] = xv;
    }
    if (snapshots)
#pragma unroll
      for (int j = 0; j < GLM5FLASH_CONV_MAX_KERNEL; j++)
        if (j < m) snapshots[(row * channels + c) * m + j] = win[j];
  }
#pragma unroll
  for (int j = 0; j < GLM5FLASH_CONV_MAX_KERNEL; j++)
    if (j < m) st[j] = win[j];
}

RESIN_KERNEL void glm5flash_l2norm(float* __restrict__ x, int rows, int dim, float mul) {
  __shared__ float scratch[32];
  int r = RESIN_BID_X;
  if (r >= rows) return;
  float* row = x + (long long)r * dim;
  float ss = 0.0f;
  for (int i = RESIN_TID_X; i < dim; i += RESIN_NTID_X) ss += row[i] * row[i];
  ss = resin_block_sum(ss, scratch);
  float inv = resin_rsqrtf(ss + 1e-6f);
  for (int i = RESIN_TID_X; i < dim; i += RESIN_NTID_X) row[i] = row[i] * inv * mul;
}

RESIN_KERNEL void glm5flash_kda_gate(float* __restrict__ g, const float* __restrict__ a_log,
                                     const float* __restrict__ dt_bias, int tokens, int heads, int dh,
                                     int has_lower_bound, float lower_bound) {
  long long i = resin_global_tid();
  long long L = (long long)heads * dh;
  if (i >= (long long)tokens * L) return;
  int hj = (int)(i % L);
  float a = resin_expf(a_log[hj / dh]);
  float f = g[i] + dt_bias[hj];
  if (has_lower_bound) {
    g[i] = lower_bound / (1.0f + resin_expf(-a * f));
  } else {
    float sp = f > 20.0f ? f : resin_logf(1.0f + resin_expf(f));
    g[i] = -a * sp;
  }
}

RESIN_KERNEL void glm5flash_sigmoid(float* __restrict__ x, int n) {
  long long i = resin_global_tid();
  if (i < n) x[i] = 1.0f / (1.0f + resin_expf(-x[i]));
}

RESIN_KERNEL void glm5flash_gated_rmsnorm(float* out, const float* x,
                                          const float* __restrict__ gate, const float* __restrict__ w,
                                          int rows, int dim, float eps) {
  __shared__ float scratch[32];
  int r = RESIN_BID_X;
  if (r >= rows) return;
  const float* row = x + (long long)r * dim;
  const float* gr = gate + (long long)r * dim;
  float ss = 0.0f;
  for (int i = RESIN_TID_X; i < dim; i += RESIN_NTID_X) ss += row[i] * row[i];
  ss = resin_block_sum(ss, scratch);
  float inv = resin_rsqrtf(ss / (float)dim + eps);
  float* o = out + (long long)r * dim;
  for (int i = RESIN_TID_X; i < dim; i += RESIN_NTID_X) {
    float v = row[i] * inv * w[i];
    o[i] = v * (1.0f / (1.0f + resin_expf(-gr[i])));
  }
}

RESIN_KERNEL void glm5flash_to_bf16(resin_bf16* __restrict__ out, const float* __restrict__ x, int n) {
  long long i = resin_global_tid();
  if (i < n) out[i] = resin_f2bf(x[i]);
}
