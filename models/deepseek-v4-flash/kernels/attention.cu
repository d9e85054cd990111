// attention.cu: DeepSeek-V4's attention over a query's keys (K = V: one shared head of
// head_dim values a key), as the model's attendSeq, and the sliding-window K=V store.
//
// deepseekv4flash_sparse_attention_f32: one block per (head, row). A query at position p
// of sequence s attends
//   - its window, positions max(0, p − window + 1) .. p: at or past len0[s] the chunk's row
//     kv[seq_start[s] + j − len0[s]], before it the ring window_kv[win_row0[s] + j % window];
//   - then its compressed entries, rows entry_row0[s] + e of entries: the picks of its row
//     (CSA: picks [rows, topk], -1 past counts[row], the indexer's), or with picks null
//     every visible entry e < (p + 1) / ratio (HCA; ratio 0: none, a sliding layer);
// out[row, head] = Σ_i softmax([q·k_i·scale, sink_head])_i · k_i without the sink's own
// weight, by an online softmax over tiles of the block's threads' keys.
//   q, out: [rows, heads, head_dim]   kv: [rows, head_dim]   sinks: [heads]
//
// deepseekv4flash_window_store_f32: after the attention, each row among the last window
// positions of its chunk writes its K=V row to the ring: window_kv[win_row0[s] + p % window].
#include "prelude.cuh"

#define DSV4_ATTN_THREADS 128
#define DSV4_ATTN_MAX_DIM 512

RESIN_KERNEL void deepseekv4flash_sparse_attention_f32(
    float* __restrict__ out, const float* __restrict__ q, const float* __restrict__ kv,
    const float* __restrict__ window_kv, const float* __restrict__ entries,
    const int* __restrict__ picks, const int* __restrict__ counts,
    const float* __restrict__ sinks, const int* __restrict__ pos,
    const int* __restrict__ row_seq, const int* __restrict__ seq_start,
    const int* __restrict__ len0, const int* __restrict__ win_row0,
    const int* __restrict__ entry_row0, int rows, int heads, int head_dim, int window,
    int ratio, int topk, float scale) {
  __shared__ float scratch[32];
  __shared__ float qs[DSV4_ATTN_MAX_DIM];
  __shared__ float ps[DSV4_ATTN_THREADS];
  __shared__ const float* ks[DSV4_ATTN_THREADS];
  int h = RESIN_BID_X, t = RESIN_BID_Y;
  if (t >= rows || h >= heads) return;
  int tid = RESIN_TID_X;
  int p = pos[t], s = row_seq[t];
  int l0 = len0[s], r0 = seq_start[s];
  const float* qt = q + ((long long)t * heads + h) * head_dim;
  for (int d = tid; d < head_dim; d += DSV4_ATTN_THREADS) qs[d] = qt[d];
  int first = p - window + 1 > 0 ? p - window + 1 : 0;
  int nw = p - first + 1;
  int nc = 0;
  if (picks) nc = counts[t];
  else if (ratio > 0) nc = (p + 1) / ratio;
  int n = nw + nc;
  const float* eb = entries ? entries + (long long)entry_row0[s] * head_dim : entries;
  float m = -RESIN_INF, l = 0.0f;
  float acc[DSV4_ATTN_MAX_DIM / DSV4_ATTN_THREADS];
  for (int i = 0; i < DSV4_ATTN_MAX_DIM / DSV4_ATTN_THREADS; i++) acc[i] = 0.0f;
  resin_sync();
  for (int i0 = 0; i0 < n; i0 += DSV4_ATTN_THREADS) {
    int i = i0 + tid;
    float x = -RESIN_INF;
    const float* k = 0;
    if (i < n) {
      if (i < nw) {
        int j = first + i;
        k = j >= l0 ? kv + (long long)(r0 + j - l0) * head_dim
                    : window_kv + ((long long)win_row0[s] + j % window) * head_dim;
      } else {
        int e = picks ? picks[(long long)t * topk + (i - nw)] : i - nw;
        k = eb + (long long)e * head_dim;
      }
      float dot = 0.0f;
      for (int d = 0; d < head_dim; d++) dot += qs[d] * k[d];
      x = dot * scale;
    }
    float tmax = resin_block_max(x, scratch);
    float mn = resin_fmaxf(m, tmax);
    float corr = resin_expf(m - mn);
    float e = i < n ? resin_expf(x - mn) : 0.0f;
    ps[tid] = e;
    ks[tid] = k;
    float tsum = resin_block_sum(e, scratch);  // its barriers publish ps and ks
    l = l * corr + tsum;
    int cnt = n - i0 < DSV4_ATTN_THREADS ? n - i0 : DSV4_ATTN_THREADS;
    for (int a = 0; a < DSV4_ATTN_MAX_DIM / DSV4_ATTN_THREADS; a++) {
      int d = tid + a * DSV4_ATTN_THREADS;
      if (d >= head_dim) break;
      float v = acc[a] * corr;
      for (int j = 0; j < cnt; j++) v += ps[j] * ks[j][d];
      acc[a] = v;
    }
    m = mn;
    resin_sync();
  }
  float sink = sinks[h];
  float mf = resin_fmaxf(m, sink);
  float corr = resin_expf(m - mf);
  float denom = l * corr + resin_expf(sink - mf);
  float* o = out + ((long long)t * heads + h) * head_dim;
  for (int a = 0; a < DSV4_ATTN_MAX_DIM / DSV4_ATTN_THREADS; a++) {
    int d = tid + a * DSV4_ATTN_THREADS;
    if (d >= head_dim) break;
    o[d] = acc[a] * corr / denom;
  }
}

RESIN_KERNEL void deepseekv4flash_window_store_f32(
    float* __restrict__ window_kv, const float* __restrict__ kv, const int* __restrict__ pos,
    const int* __restrict__ row_seq, const int* __restrict__ seq_start,
    const int* __restrict__ len0, const int* __restrict__ win_row0, int rows, int head_dim,
    int window) {
  long long total = (long long)rows * head_dim;
  for (long long i = resin_global_tid(); i < total; i += (long long)RESIN_NTID_X * RESIN_NCTAID_X) {
    int t = (int)(i / head_dim), d = (int)(i % head_dim);
    int s = row_seq[t], p = pos[t];
    int end = len0[s] + seq_start[s + 1] - seq_start[s];
    if (p < end - window) continue;  // a later row of the chunk takes its ring slot
    window_kv[((long long)win_row0[s] + p % window) * head_dim + d] = kv[i];
  }
}
