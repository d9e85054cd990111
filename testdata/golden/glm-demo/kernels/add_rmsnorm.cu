// add_rmsnorm.cu: the glm-demo model's own fused kernel: the residual add that ends a
// sub-layer and the RMSNorm that starts the next, in one pass over the row.
//
//   residual: [rows, dim]   x: [rows, dim]   w: [dim]   out: [rows, dim]
//   residual[r] += x[r];  out[r, i] = residual[r, i] / sqrt(mean(residual[r]^2) + eps) * w[i]
//
// Grid: rows blocks; block: a multiple of 32 threads striding over the row. Written on
// Resin's prelude (core/kernels/cuda/prelude.cuh) so it compiles under NVRTC and clang-16
// alike. Reference: AddRMSNormRef in ref.go.
#include "prelude.cuh"

RESIN_KERNEL void glmdemo_add_rmsnorm(float* __restrict__ out, float* __restrict__ residual,
                                           const float* __restrict__ x, const float* __restrict__ w,
                                           int rows, int dim, float eps) {
  __shared__ float scratch[32];
  int r = RESIN_BID_X;
  if (r >= rows) return;
  float* res = residual + (long long)r * dim;
  const float* xr = x + (long long)r * dim;
  float ss = 0.0f;
  for (int i = RESIN_TID_X; i < dim; i += RESIN_NTID_X) {
    float v = res[i] + xr[i];
    res[i] = v;
    ss += v * v;
  }
  ss = resin_block_sum(ss, scratch);
  float inv = resin_rsqrtf(ss / (float)dim + eps);
  float* o = out + (long long)r * dim;
  for (int i = RESIN_TID_X; i < dim; i += RESIN_NTID_X) o[i] = res[i] * inv * w[i];
}
