// rmsnorm.cu: RMSNorm, as ref.RMSNorm.
//   x: [rows, dim]  w: [dim]  out: [rows, dim]
//   out[r, i] = x[r, i] / sqrt(mean_j x[r, j]^2 + eps) * w[i]
// out may alias x (in place), as ref.RMSNorm allows: neither is __restrict__.
// Grid: rows blocks; block: a multiple of 32 threads.
#include "prelude.cuh"

RESIN_KERNEL void resin_rmsnorm(float* out, const float* x, const float* __restrict__ w, int rows,
                                int dim, float eps) {
  __shared__ float scratch[32];
  int r = RESIN_BID_X;
  if (r >= rows) return;
  const float* row = x + (long long)r * dim;
  float ss = 0.0f;
  for (int i = RESIN_TID_X; i < dim; i += RESIN_NTID_X) ss += row[i] * row[i];
  ss = resin_block_sum(ss, scratch);
  float inv = resin_rsqrtf(ss / (float)dim + eps);
  float* o = out + (long long)r * dim;
  for (int i = RESIN_TID_X; i < dim; i += RESIN_NTID_X) o[i] = row[i] * inv * w[i];
}
