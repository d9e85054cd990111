// mhc.cu: manifold-constrained hyper-connections (mHC; DeepSeek-V4, GLM-5-Next) around a
// block, as ref.HyperConnWeights, ref.HyperCollapse and ref.HyperExpand. The residual is
// hc streams per token; the projection fn·RMSNorm(streams) is a GEMM (cuBLASLt) on the raw
// streams, and the unweighted norm's 1/rms is applied here, to the GEMM's hc·(2+hc)
// outputs instead of its hc·dim inputs (fn·(x/rms) = (fn·x)/rms).
//
// resin_mhc_pre_f32: one block per token.
//   streams: [rows, hc, dim]   mix: [rows, mix_width] fn·streams (not yet normalised)
//   base: [mix_width]   scale: [3]
//   head = 0: mix_width = (2+hc)·hc = [pre | post | comb]; writes post [rows, hc],
//             comb [rows, hc, hc] (Sinkhorn: row softmax + eps, columns normalised, then
//             iters−1 times rows and columns) and collapsed [rows, dim] = Σ_i pre_i·stream_i
//   head = 1: mix_width = hc, the final collapse (hc_head): pre only, post and comb unused
//   pre_i = sigmoid(mix_i/rms·scale[0] + base_i) + eps, rms over the token's hc·dim values
//
// resin_mhc_post_f32: one thread per output value.
//   out[t, k, d] = post[t, k]·block[t, d] + Σ_j comb[t, j, k]·streams[t, j, d]
// hc <= RESIN_MHC_MAX_HC.
#include "prelude.cuh"

#define RESIN_MHC_MAX_HC 16

RESIN_DEVICE float resin_mhc_sigmoid(float x) { return 1.0f / (1.0f + resin_expf(-x)); }

RESIN_KERNEL void resin_mhc_pre_f32(float* __restrict__ post, float* __restrict__ comb,
                                    float* __restrict__ collapsed,
                                    const float* __restrict__ streams,
                                    const float* __restrict__ mix, const float* __restrict__ base,
                                    const float* __restrict__ scale, int rows, int hc, int dim,
                                    int iters, float eps, float norm_eps, int head) {
  __shared__ float scratch[32];
  __shared__ float pre[RESIN_MHC_MAX_HC];
  __shared__ float m[RESIN_MHC_MAX_HC * RESIN_MHC_MAX_HC];
  int t = RESIN_BID_X;
  if (t >= rows) return;
  const float* st = streams + (long long)t * hc * dim;
  long long n = (long long)hc * dim;
  float ss = 0.0f;
  for (long long i = RESIN_TID_X; i < n; i += RESIN_NTID_X) ss += st[i] * st[i];
  ss = resin_block_sum(ss, scratch);
  float inv = resin_rsqrtf(ss / (float)n + norm_eps);
  int width = head ? hc : (2 + hc) * hc;
  const float* mx = mix + (long long)t * width;
  if (RESIN_TID_X == 0) {
    for (int i = 0; i < hc; i++) pre[i] = resin_mhc_sigmoid(mx[i] * inv * scale[0] + base[i]) + eps;
    if (!head) {
      for (int i = 0; i < hc; i++)
        post[(long long)t * hc + i] = 2.0f * resin_mhc_sigmoid(mx[hc + i] * inv * scale[1] + base[hc + i]);
      for (int i = 0; i < hc * hc; i++) m[i] = mx[2 * hc + i] * inv * scale[2] + base[2 * hc + i];
      for (int r = 0; r < hc; r++) {  // row softmax, then + eps
        float mmax = m[r * hc];
        for (int j = 1; j < hc; j++) mmax = resin_fmaxf(mmax, m[r * hc + j]);
        float sum = 0.0f;
        for (int j = 0; j < hc; j++) {
          m[r * hc + j] = resin_expf(m[r * hc + j] - mmax);
          sum += m[r * hc + j];
        }
        for (int j = 0; j < hc; j++) m[r * hc + j] /= sum;
      }
      for (int i = 0; i < hc * hc; i++) m[i] += eps;
      int passes = iters < 1 ? 1 : iters;  // the column pass always runs
      for (int it = 0; it < passes; it++) {
        if (it > 0) {
          for (int r = 0; r < hc; r++) {
            float s = 0.0f;
            for (int j = 0; j < hc; j++) s += m[r * hc + j];
            for (int j = 0; j < hc; j++) m[r * hc + j] /= s + eps;
          }
        }
        for (int j = 0; j < hc; j++) {
          float s = 0.0f;
          for (int r = 0; r < hc; r++) s += m[r * hc + j];
          for (int r = 0; r < hc; r++) m[r * hc + j] /= s + eps;
        }
      }
      for (int i = 0; i < hc * hc; i++) comb[(long long)t * hc * hc + i] = m[i];
    }
  }
  resin_sync();
  float* out = collapsed + (long long)t * dim;
  for (int d = RESIN_TID_X; d < dim; d += RESIN_NTID_X) {
    float acc = 0.0f;
    for (int i = 0; i < hc; i++) acc += pre[i] * st[(long long)i * dim + d];
    out[d] = acc;
  }
}

RESIN_KERNEL void resin_mhc_post_f32(float* __restrict__ out, const float* __restrict__ streams,
                                     const float* __restrict__ block,
                                     const float* __restrict__ post,
                                     const float* __restrict__ comb, int rows, int hc, int dim) {
  long long total = (long long)rows * hc * dim;
  for (long long i = resin_global_tid(); i < total; i += (long long)RESIN_NTID_X * RESIN_NCTAID_X) {
    int d = (int)(i % dim);
    long long tk = i / dim;
    int k = (int)(tk % hc);
    long long t = tk / hc;
    const float* cb = comb + t * hc * hc;
    const float* st = streams + t * hc * dim;
    float o = post[t * hc + k] * block[t * dim + d];
    for (int j = 0; j < hc; j++) o += cb[j * hc + k] * st[(long long)j * dim + d];
    out[i] = o;
  }
}
