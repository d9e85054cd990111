// dspark_heads.cu: DSpark's Markov head and confidence cut over a block forward's output,
// as core/dspark's Drafter.Propose: slot i's logits get the Markov bias of the previous
// token (the anchor for slot 0, then the draft just drawn), its draft is the argmax
// (greedy) or the inverse-CDF draw of softmax(logits / T) at the slot's uniform, and the
// confidence head's first slot whose sigmoid is below the threshold cuts the block.
//
//   logits: [S, B, V] float32, the Markov bias added in place
//   q:      [S, B, V] float32 out, slot i's draft distribution (one-hot when greedy)
//   chain:  [S, B] int32 out, every slot's draw; conf: [S, B] out (with the head)
//   ndrafts: [S] int32 out, the drafts after the cut and max_drafts
//   hidden: [S, B, H]; anchors, temps, thresholds, max_drafts: [S]; uniforms: [S, B] double
//   wt: the heads' weights, {w1, w2, gw, gb, jw, jb, cw, cb} (null where absent): w1, w2
//   [V, r] (markov_w1, markov_w2); gated gw [r, H+r], gb [r]; rnn jw [3r, 2r+H], jb [3r];
//   confidence cw [H (+r)], cb [1]
//   head: 0 none, 1 vanilla, 2 gated, 3 rnn
// Grid: S blocks; block: a multiple of 32 threads, at most 1024. r <= DSPARK_MAX_RANK.
#include "prelude.cuh"

#define DSPARK_MAX_RANK 1024
#define DSPARK_MAX_THREADS 1024

#ifndef __noinline__
#define __noinline__ __attribute__((noinline))
#endif

// dspark_sync is the kernel's one barrier: a call site of its own, so that the compiler's
// copies of a loop (tail duplication, unswitching on a thread's own trip count) still
// meet every thread at one __syncthreads (the emulated device checks the site).
static __device__ __noinline__ void dspark_sync() { resin_sync(); }

// dspark_block_sum and dspark_block_max are resin_block_sum and resin_block_max over
// dspark_sync.
RESIN_DEVICE float dspark_block_sum(float v, float* scratch) {
  unsigned lane = RESIN_TID_X % RESIN_WARP, warp = RESIN_TID_X / RESIN_WARP;
  v = resin_warp_sum(v);
  dspark_sync();
  if (lane == 0) scratch[warp] = v;
  dspark_sync();
  v = lane < RESIN_NTID_X / RESIN_WARP ? scratch[lane] : 0.0f;
  return resin_warp_sum(v);
}

RESIN_DEVICE float dspark_block_max(float v, float* scratch) {
  unsigned lane = RESIN_TID_X % RESIN_WARP, warp = RESIN_TID_X / RESIN_WARP;
  v = resin_warp_max(v);
  dspark_sync();
  if (lane == 0) scratch[warp] = v;
  dspark_sync();
  v = lane < RESIN_NTID_X / RESIN_WARP ? scratch[lane] : -RESIN_INF;
  return resin_warp_max(v);
}

RESIN_DEVICE float dspark_sigmoid(float x) { return 1.0f / (1.0f + resin_expf(-x)); }

RESIN_DEVICE float dspark_tanh(float x) {
  // tanh from expf, exact enough for float32 and free of libm: 1 - 2/(exp(2x)+1)
  if (x > 15.0f) return 1.0f;
  if (x < -15.0f) return -1.0f;
  float e = resin_expf(2.0f * x);
  return 1.0f - 2.0f / (e + 1.0f);
}

RESIN_KERNEL void resin_dspark_propose(float* logits, float* q, int* chain, float* conf, int* ndrafts,
                                       const float* hidden, const int* anchors, const float* temps,
                                       const double* uniforms, const float* thresholds, const int* max_drafts,
                                       const float* const* wt, int B, int V,
                                       int H, int r, int head, int has_conf, int conf_markov) {
  __shared__ float e[DSPARK_MAX_RANK], z[DSPARK_MAX_RANK], state[DSPARK_MAX_RANK];
  __shared__ float proj[3 * DSPARK_MAX_RANK];
  __shared__ float scratch[32];
  __shared__ double csum[DSPARK_MAX_THREADS];
  __shared__ int clast[DSPARK_MAX_THREADS];
  __shared__ int sprev, spick;
  __shared__ float sbv[32];
  __shared__ int sbi[32];
  const float *w1 = wt[0], *w2 = wt[1], *gw = wt[2], *gb = wt[3], *jw = wt[4], *jb = wt[5], *cw = wt[6],
              *cb = wt[7];
  int s = RESIN_BID_X, tid = RESIN_TID_X, nt = RESIN_NTID_X;
  unsigned lane = tid % RESIN_WARP, warp = tid / RESIN_WARP;
  float temp = temps[s], threshold = thresholds[s];
  int greedy = temp < 1e-5f;
  for (int j = tid; j < r; j += nt) state[j] = 0.0f;
  if (tid == 0) sprev = anchors[s];
  dspark_sync();
  int n = B;
  for (int i = 0; i < B; i++) {
    const float* h = hidden + ((long long)s * B + i) * H;
    float* row = logits + ((long long)s * B + i) * V;
    float* qr = q + ((long long)s * B + i) * V;
    int prev = sprev;
    if (r > 0) {
      for (int j = tid; j < r; j += nt) e[j] = w1[(long long)prev * r + j];
      dspark_sync();
      if (head == 1) {
        for (int j = tid; j < r; j += nt) z[j] = e[j];
      } else if (head == 2) {
        int in = H + r;
        for (int j = tid; j < r; j += nt) {
          const float* w = gw + (long long)j * in;
          float acc = gb[j];
          for (int t = 0; t < H; t++) acc += w[t] * h[t];
          for (int t = 0; t < r; t++) acc += w[H + t] * e[t];
          z[j] = dspark_sigmoid(acc) * e[j];
        }
      } else if (head == 3) {
        int in = 2 * r + H;
        for (int j = tid; j < 3 * r; j += nt) {
          const float* w = jw + (long long)j * in;
          float acc = jb[j];
          for (int t = 0; t < r; t++) acc += w[t] * state[t] + w[r + t] * e[t];
          for (int t = 0; t < H; t++) acc += w[2 * r + t] * h[t];
          proj[j] = acc;
        }
        dspark_sync();
        for (int j = tid; j < r; j += nt) {
          float g = dspark_sigmoid(proj[j]);
          float cand = dspark_tanh(proj[r + j]);
          state[j] = g * state[j] + (1.0f - g) * cand;
          z[j] = dspark_tanh(proj[2 * r + j]);
        }
      }
      dspark_sync();
      for (int t = tid; t < V; t += nt) {  // bias = markov_w2 · z
        const float* w = w2 + (long long)t * r;
        float acc = 0.0f;
        for (int j = 0; j < r; j++) acc += w[j] * z[j];
        row[t] += acc;
      }
    }
    if (has_conf) {
      float acc = 0.0f;
      for (int j = tid; j < H; j += nt) acc += cw[j] * h[j];
      if (conf_markov)
        for (int j = tid; j < r; j += nt) acc += cw[H + j] * e[j];
      acc = dspark_block_sum(acc, scratch);
      if (tid == 0) {
        acc += cb[0];
        conf[(long long)s * B + i] = acc;
        if (n == B && threshold > 0.0f && dspark_sigmoid(acc) < threshold) n = i;
      }
    }
    dspark_sync();  // the biased row is complete
    if (greedy) {  // the first maximum, NaNs skipped (ref.Argmax)
      float bv = -RESIN_INF;
      int bi = 0x7fffffff;
      for (int t = tid; t < V; t += nt) {
        if (resin_better(row[t], t, bv, bi)) {
          bv = row[t];
          bi = t;
        }
      }
      resin_warp_argmax(&bv, &bi);
      if (lane == 0) {
        sbv[warp] = bv;
        sbi[warp] = bi;
      }
      dspark_sync();
      if (warp == 0) {
        unsigned warps = nt / RESIN_WARP;
        bv = lane < warps ? sbv[lane] : -RESIN_INF;
        bi = lane < warps ? sbi[lane] : 0x7fffffff;
        resin_warp_argmax(&bv, &bi);
        if (lane == 0) spick = bi == 0x7fffffff ? 0 : bi;
      }
      dspark_sync();
      for (int t = tid; t < V; t += nt) qr[t] = t == spick ? 1.0f : 0.0f;
    } else {  // q = softmax(row / T), then the first index whose cumulative q exceeds u
      float mx = -RESIN_INF;
      for (int t = tid; t < V; t += nt) mx = resin_fmaxf(mx, row[t] / temp);
      mx = dspark_block_max(mx, scratch);
      float sum = 0.0f;
      for (int t = tid; t < V; t += nt) {
        float x = resin_expf(row[t] / temp - mx);
        qr[t] = x;
        sum += x;
      }
      sum = dspark_block_sum(sum, scratch);
      float inv = 1.0f / sum;
      // each thread's contiguous chunk: its probabilities, their sum and its last positive
      int chunk = (V + nt - 1) / nt, lo = tid * chunk, hi = lo + chunk < V ? lo + chunk : V;
      double cs = 0.0;
      int last = -1;
      for (int t = lo; t < hi; t++) {
        float p = qr[t] * inv;
        qr[t] = p;
        if (p > 0.0f) {
          cs += (double)p;
          last = t;
        }
      }
      csum[tid] = cs;
      clast[tid] = last;
      dspark_sync();
      if (tid == 0) {
        double u = uniforms[(long long)s * B + i], cum = 0.0;
        int pick = -1, c = 0, lastAll = -1;
        for (; c < nt; c++) {
          if (clast[c] >= 0) lastAll = clast[c];
          if (u < cum + csum[c]) break;
          cum += csum[c];
        }
        if (c < nt) {  // the draw falls in chunk c: walk it
          int clo = c * chunk, chi = clo + chunk < V ? clo + chunk : V;
          for (int t = clo; t < chi; t++) {
            float p = qr[t];
            if (p <= 0.0f) continue;
            cum += (double)p;
            if (u < cum) {
              pick = t;
              break;
            }
          }
          if (pick < 0) pick = clast[c];
        } else {
          pick = lastAll;  // rounding left u past the total
        }
        spick = pick < 0 ? 0 : pick;
      }
      dspark_sync();
    }
    if (tid == 0) {
      chain[(long long)s * B + i] = spick;
      sprev = spick;
    }
    dspark_sync();
  }
  if (tid == 0) {
    int m = max_drafts[s];
    ndrafts[s] = m > 0 && m < n ? m : n;
  }
}
