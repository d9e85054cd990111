// head.cu: the model's hc_head before its final norm.
//
//   glm5flash_stream_mean  out[r, d] = (Σ_k streams[r, k, d]) / hc, the sum in stream order
//     (forward.go's hc_head); streams: [rows, hc, dim], out: [rows, dim]; a thread an
//     element.
#include "prelude.cuh"

RESIN_KERNEL void glm5flash_stream_mean(float* __restrict__ out, const float* __restrict__ streams, int rows, int hc,
                                        int dim) {
  long long i = resin_global_tid();
  if (i >= (long long)rows * dim) return;
  long long r = i / dim, d = i % dim;
  float s = 0.0f;
  for (int k = 0; k < hc; k++) s += streams[(r * hc + k) * dim + d];
  out[i] = s / (float)hc;
}
