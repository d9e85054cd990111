// argmax.cu: row argmax, as ref.ArgmaxRows: the first maximum, NaNs skipped, 0 for a row
// of NaNs (engine's argmax, sampling.cu's greedy token: an MTP draft chained on the device
// is then the token the host's sampler would pick, never an id outside the vocabulary).
//   x: [rows, n]  out: [rows]
// Grid: rows blocks; block: a multiple of 32 threads.
#include "prelude.cuh"

RESIN_KERNEL void resin_argmax(int* out, const float* x, int rows, int n) {
  __shared__ float sv[32];
  __shared__ int si[32];
  int r = RESIN_BID_X;
  if (r >= rows) return;
  const float* row = x + (long long)r * n;
  float bv = -RESIN_INF;
  int bi = 0x7fffffff;  // "none yet": loses to any real element, -inf included
  for (int i = RESIN_TID_X; i < n; i += RESIN_NTID_X) {
    if (resin_better(row[i], i, bv, bi)) {
      bv = row[i];
      bi = i;
    }
  }
  resin_warp_argmax(&bv, &bi);
  unsigned lane = RESIN_TID_X % RESIN_WARP, warp = RESIN_TID_X / RESIN_WARP;
  if (lane == 0) {
    sv[warp] = bv;
    si[warp] = bi;
  }
  resin_sync();
  if (warp == 0) {
    unsigned warps = RESIN_NTID_X / RESIN_WARP;
    bv = lane < warps ? sv[lane] : -RESIN_INF;
    bi = lane < warps ? si[lane] : 0x7fffffff;
    resin_warp_argmax(&bv, &bi);
    if (lane == 0) out[r] = bi == 0x7fffffff ? 0 : bi;
  }
}
