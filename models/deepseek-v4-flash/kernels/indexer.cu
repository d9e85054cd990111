// indexer.cu: DeepSeek-V4's lightning indexer for CSA layers, as the model's indexerPick:
// per query row, the compressed entries it may attend (visible = (pos+1) / ratio of its
// sequence's), all of them when there are at most topk, else the topk with the highest
// scores Σ_h w_h·ReLU(q_h·k_e)·index_head_dim^-0.5 (the lower entry first among equal
// scores, as a stable descending sort), listed in ascending order.
//
//   q: [rows, heads, head_dim] (rotated)   w: [rows, heads] (weights_proj, × heads^-0.5)
//   keys: [*, head_dim] the indexer's compressed entries; sequence s's entry e is row
//   key_row0[s] + e   pos, row_seq: [rows] int32
//   picks: [rows, topk] int32, -1 past counts[row]   counts: [rows] int32
//   scores: [rows, max_visible] float32 workspace
//
// deepseekv4flash_indexer_topk_f32: one block of DSV4_IDX_THREADS threads per row. The
// selection is exact: a radix search over the scores' ordered bits finds the topk-th
// largest score T, then the entries above T and the first of those equal to T are listed
// in index order by block prefix sums. The grid depends only on the rows (graph-safe).
#include "prelude.cuh"

#define DSV4_IDX_THREADS 256

// dsv4_key orders float bits as unsigned integers (larger float, larger key).
RESIN_DEVICE unsigned dsv4_key(float f) {
  unsigned u = resin_f2u(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// dsv4_scan returns the inclusive prefix sum of v over the block (scan: one int a thread).
RESIN_DEVICE int dsv4_scan(int v, int* scan) {
  int tid = RESIN_TID_X;
  scan[tid] = v;
  resin_sync();
  for (int o = 1; o < DSV4_IDX_THREADS; o <<= 1) {
    int x = tid >= o ? scan[tid - o] : 0;
    resin_sync();
    scan[tid] += x;
    resin_sync();
  }
  int r = scan[tid];
  resin_sync();
  return r;
}

RESIN_KERNEL void deepseekv4flash_indexer_topk_f32(
    int* __restrict__ picks, int* __restrict__ counts, float* __restrict__ scores,
    const float* __restrict__ q, const float* __restrict__ w, const float* __restrict__ keys,
    const int* __restrict__ key_row0, const int* __restrict__ pos,
    const int* __restrict__ row_seq, int rows, int ratio, int heads, int head_dim, int topk,
    int max_visible, float scale) {
  __shared__ float scratch[32];
  __shared__ int scan[DSV4_IDX_THREADS];
  __shared__ int total;
  int t = RESIN_BID_X;
  if (t >= rows) return;
  int tid = RESIN_TID_X;
  int visible = (pos[t] + 1) / ratio;
  if (visible > max_visible) visible = max_visible;  // the launcher sizes max_visible
  int* out = picks + (long long)t * topk;
  if (visible <= topk) {
    for (int i = tid; i < topk; i += DSV4_IDX_THREADS) out[i] = i < visible ? i : -1;
    if (tid == 0) counts[t] = visible;
    return;
  }
  float* sc = scores + (long long)t * max_visible;
  const float* qt = q + (long long)t * heads * head_dim;
  const float* wt = w + (long long)t * heads;
  const float* kb = keys + (long long)key_row0[row_seq[t]] * head_dim;
  for (int e = tid; e < visible; e += DSV4_IDX_THREADS) {
    const float* k = kb + (long long)e * head_dim;
    float acc = 0.0f;
    for (int h = 0; h < heads; h++) {
      float v = 0.0f;
      for (int d = 0; d < head_dim; d++) v += qt[h * head_dim + d] * k[d];
      acc += (v > 0.0f ? v : 0.0f) * scale * wt[h];
    }
    sc[e] = acc;
  }
  resin_sync();
  // T: the largest key with at least topk scores at or above it.
  unsigned prefix = 0;
  for (int bit = 31; bit >= 0; bit--) {
    unsigned cand = prefix | (1u << bit);
    float n = 0.0f;
    for (int e = tid; e < visible; e += DSV4_IDX_THREADS) n += dsv4_key(sc[e]) >= cand ? 1.0f : 0.0f;
    n = resin_block_sum(n, scratch);
    if (n >= (float)topk) prefix = cand;
  }
  float gt = 0.0f;
  for (int e = tid; e < visible; e += DSV4_IDX_THREADS) gt += dsv4_key(sc[e]) > prefix ? 1.0f : 0.0f;
  int need_eq = topk - (int)resin_block_sum(gt, scratch);
  int eq_base = 0, out_base = 0;
  for (int e0 = 0; e0 < visible; e0 += DSV4_IDX_THREADS) {
    int e = e0 + tid;
    unsigned key = e < visible ? dsv4_key(sc[e]) : 0u;
    int eq = e < visible && key == prefix ? 1 : 0;
    int eq_incl = dsv4_scan(eq, scan);
    if (tid == DSV4_IDX_THREADS - 1) total = eq_incl;
    int sel = e < visible && (key > prefix || (eq && eq_base + eq_incl - 1 < need_eq)) ? 1 : 0;
    resin_sync();
    eq_base += total;
    int sel_incl = dsv4_scan(sel, scan);
    if (sel) out[out_base + sel_incl - 1] = e;
    if (tid == DSV4_IDX_THREADS - 1) total = sel_incl;
    resin_sync();
    out_base += total;
    resin_sync();
  }
  if (tid == 0) counts[t] = topk;
}
