// add_rmsnorm.cu: the fused residual add and RMSNorm of a pre-norm transformer layer, as
// ref.Add followed by ref.RMSNorm.
//   x, residual, out: [rows, dim]  w: [dim]
//   residual[r, i] = residual[r, i] + x[r, i]                 (stored in the element type)
//   out[r, i] = residual[r, i] / sqrt(mean_j residual[r, j]^2 + eps) * w[i]
// The norm reads the stored (for bf16: rounded) new residual, so out is exactly the RMSNorm
// of what the next layer adds to. The sum of squares is accumulated in float32.
// Grid: rows blocks; block: a multiple of 32 threads (the launcher uses 256).
#include "prelude.cuh"

template <typename T>
RESIN_DEVICE void resin_add_rmsnorm(T* __restrict__ out, T* __restrict__ residual,
                                    const T* __restrict__ x, const T* __restrict__ w, int rows,
                                    int dim, float eps) {
  __shared__ float scratch[32];
  int r = RESIN_BID_X;
  if (r >= rows) return;
  long long base = (long long)r * dim;
  float ss = 0.0f;
  for (int i = RESIN_TID_X; i < dim; i += RESIN_NTID_X) {
    resin_store(residual, base + i, resin_load(residual, base + i) + resin_load(x, base + i));
    float v = resin_load(residual, base + i);  // the stored value: rounded for bf16
    ss += v * v;
  }
  ss = resin_block_sum(ss, scratch);
  float inv = resin_rsqrtf(ss / (float)dim + eps);
  // Each thread reads back only the elements it wrote itself.
  for (int i = RESIN_TID_X; i < dim; i += RESIN_NTID_X)
    resin_store(out, base + i, resin_load(residual, base + i) * inv * resin_load(w, i));
}

RESIN_KERNEL void resin_add_rmsnorm_f32(float* out, float* residual, const float* x,
                                        const float* w, int rows, int dim, float eps) {
  resin_add_rmsnorm(out, residual, x, w, rows, dim, eps);
}

RESIN_KERNEL void resin_add_rmsnorm_bf16(resin_bf16* out, resin_bf16* residual,
                                         const resin_bf16* x, const resin_bf16* w, int rows,
                                         int dim, float eps) {
  resin_add_rmsnorm(out, residual, x, w, rows, dim, eps);
}

// resin_rmsnorm_bf16 is RMSNorm without the add (the first layer's input norm and the
// final norm), as ref.RMSNorm: out may alias x.
RESIN_KERNEL void resin_rmsnorm_bf16(resin_bf16* out, const resin_bf16* x, const resin_bf16* w,
                                     int rows, int dim, float eps) {
  __shared__ float scratch[32];
  int r = RESIN_BID_X;
  if (r >= rows) return;
  long long base = (long long)r * dim;
  float ss = 0.0f;
  for (int i = RESIN_TID_X; i < dim; i += RESIN_NTID_X) {
    float v = resin_load(x, base + i);
    ss += v * v;
  }
  ss = resin_block_sum(ss, scratch);
  float inv = resin_rsqrtf(ss / (float)dim + eps);
  for (int i = RESIN_TID_X; i < dim; i += RESIN_NTID_X)
    resin_store(out, base + i, resin_load(x, base + i) * inv * resin_load(w, i));
}
