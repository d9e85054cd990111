// attention.cu: DeepSeek-V4's attention over a query's keys (K = V: one shared head of
// head_dim values a key), as the model's attendSeq, and the sliding-window K=V store.
//
// deepseekv4flash_sparse_attention_f32: one block per (group of `group` heads, row), group
// 1, 2 or 4 (DSV4_ATTN_GROUP), so that a key is read once for the group's heads. A query
// at position p
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
#define DSV4_ATTN_GROUP 4

RESIN_KERNEL void deepseekv4flash_sparse_attention_f32(
    float* __restrict__ out, const float* __restrict__ q, const float* __restrict__ kv,
    const float* __restrict__ window_kv, const float* __restrict__ entries,
    const int* __restrict__ picks, const int* __restrict__ counts,
    const float* __restrict__ sinks, const int* __restrict__ pos,
    const int* __restrict__ row_seq, const int* __restrict__ seq_start,
    const int* __restrict__ len0, const int* __restrict__ win_row0,
    const int* __restrict__ entry_row0, int rows, int heads, int head_dim, int window,
    int ratio, int topk, float scale, int group) {
  __shared__ float scratch[32];
  __shared__ float qs[DSV4_ATTN_GROUP][DSV4_ATTN_MAX_DIM];
  __shared__ float ps[DSV4_ATTN_GROUP][DSV4_ATTN_THREADS];
  __shared__ const float* ks[DSV4_ATTN_THREADS];
  int h0 = RESIN_BID_X * group, t = RESIN_BID_Y;
  if (t >= rows || h0 >= heads) return;
  int tid = RESIN_TID_X;
  int p = pos[t], s = row_seq[t];
  int l0 = len0[s], r0 = seq_start[s];
  for (int g = 0; g < group; g++) {
    const float* qt = q + ((long long)t * heads + h0 + g) * head_dim;
    for (int d = tid; d < head_dim; d += DSV4_ATTN_THREADS) qs[g][d] = qt[d];
  }
  int first = p - window + 1 > 0 ? p - window + 1 : 0;
  int nw = p - first + 1;
  int nc = 0;
  if (picks) nc = counts[t];
  else if (ratio > 0) nc = (p + 1) / ratio;
  int n = nw + nc;
  const float* eb = entries ? entries + (long long)entry_row0[s] * head_dim : entries;
  float m[DSV4_ATTN_GROUP], l[DSV4_ATTN_GROUP];
  float acc[DSV4_ATTN_GROUP][DSV4_ATTN_MAX_DIM / DSV4_ATTN_THREADS];
  for (int g = 0; g < DSV4_ATTN_GROUP; g++) {
    m[g] = -RESIN_INF;
    l[g] = 0.0f;
    for (int i = 0; i < DSV4_ATTN_MAX_DIM / DSV4_ATTN_THREADS; i++) acc[g][i] = 0.0f;
  }
  resin_sync();
  for (int i0 = 0; i0 < n; i0 += DSV4_ATTN_THREADS) {
    int i = i0 + tid;
    float x[DSV4_ATTN_GROUP];
    const float* k = 0;
    for (int g = 0; g < DSV4_ATTN_GROUP; g++) x[g] = -RESIN_INF;
    if (i < n) {
      if (i < nw) {
        int j = first + i;
        k = j >= l0 ? kv + (long long)(r0 + j - l0) * head_dim
                    : window_kv + ((long long)win_row0[s] + j % window) * head_dim;
      } else {
        int e = picks ? picks[(long long)t * topk + (i - nw)] : i - nw;
        k = eb + (long long)e * head_dim;
      }
      // The key's values are read once for the group's heads (K = V, one KV head).
      float dot[DSV4_ATTN_GROUP];
      for (int g = 0; g < DSV4_ATTN_GROUP; g++) dot[g] = 0.0f;
      for (int d = 0; d < head_dim; d++) {
        float kd = k[d];
        for (int g = 0; g < DSV4_ATTN_GROUP; g++)
          if (g < group) dot[g] += qs[g][d] * kd;
      }
      for (int g = 0; g < DSV4_ATTN_GROUP; g++) x[g] = dot[g] * scale;
    }
    ks[tid] = k;
    float corr[DSV4_ATTN_GROUP] = {1.0f, 1.0f, 1.0f, 1.0f};
#pragma unroll
    for (int g = 0; g < DSV4_ATTN_GROUP; g++) {
      if (g >= group) break;  // uniform over the block: every thread leaves at once
      float tmax = resin_block_max(x[g], scratch);
      float mn = resin_fmaxf(m[g], tmax);
      corr[g] = resin_expf(m[g] - mn);
      float e = i < n ? resin_expf(x[g] - mn) : 0.0f;
      ps[g][tid] = e;
      float tsum = resin_block_sum(e, scratch);  // its barriers publish ps and ks
      l[g] = l[g] * corr[g] + tsum;
      m[g] = mn;
    }
    int cnt = n - i0 < DSV4_ATTN_THREADS ? n - i0 : DSV4_ATTN_THREADS;
    for (int a = 0; a < DSV4_ATTN_MAX_DIM / DSV4_ATTN_THREADS; a++) {
      int d = tid + a * DSV4_ATTN_THREADS;
      if (d >= head_dim) break;
      float v[DSV4_ATTN_GROUP];
      for (int g = 0; g < DSV4_ATTN_GROUP; g++) v[g] = acc[g][a] * corr[g];
      for (int j = 0; j < cnt; j++) {
        float kd = ks[j][d];
        for (int g = 0; g < DSV4_ATTN_GROUP; g++)
          if (g < group) v[g] += ps[g][j] * kd;
      }
      for (int g = 0; g < DSV4_ATTN_GROUP; g++) acc[g][a] = v[g];
    }
    resin_sync();
  }
  for (int g = 0; g < group; g++) {
    float sink = sinks[h0 + g];
    float mf = resin_fmaxf(m[g], sink);
    float c = resin_expf(m[g] - mf);
    float denom = l[g] * c + resin_expf(sink - mf);
    float* o = out + ((long long)t * heads + h0 + g) * head_dim;
    for (int a = 0; a < DSV4_ATTN_MAX_DIM / DSV4_ATTN_THREADS; a++) {
      int d = tid + a * DSV4_ATTN_THREADS;
      if (d >= head_dim) break;
      o[d] = acc[g][a] * c / denom;
    }
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
