// softmax.cu: row softmax in place, as ref.Softmax.
//   x: [rows, n]
// Grid: rows blocks; block: a multiple of 32 threads.
#include "prelude.cuh"

RESIN_KERNEL void resin_softmax(float* x, int rows, int n) {
  __shared__ float scratch[32];
  int r = RESIN_BID_X;
  if (r >= rows) return;
  float* row = x + (long long)r * n;
  float m = -RESIN_INF;
  for (int i = RESIN_TID_X; i < n; i += RESIN_NTID_X) m = resin_fmaxf(m, row[i]);
  m = resin_block_max(m, scratch);
  float s = 0.0f;
  for (int i = RESIN_TID_X; i < n; i += RESIN_NTID_X) {
    float e = resin_expf(row[i] - m);
    row[i] = e;
    s += e;
  }
  s = resin_block_sum(s, scratch);
  float inv = 1.0f / s;
  for (int i = RESIN_TID_X; i < n; i += RESIN_NTID_X) row[i] *= inv;
}
