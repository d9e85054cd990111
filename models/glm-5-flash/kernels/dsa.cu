// dsa.cu: an MLA layer's DeepSeek sparse attention on the device, each kernel the step of
// the model's Go reference of the same name in dsa_ref.go (forward.go's index and mla):
//
//   glm5flash_indexer_keys   k: [rows, I] in place: LayerNorm (eps 1e-6) · w + b, a block a row.
//   glm5flash_kpool_compress pools j in [j0, j1): pool[j, c] = Σ_s softmax_s(gate[jP+s, c] +
//     ape[s, c]) · key[jP+s, c] over the pool's P tokens (keys, gates: [positions, I],
//     ape: [P, I], pools: [pools, I]); a thread a (pool, channel).
//   glm5flash_indexer_scores score[t, j] = Σ_h hw[t, h] · ReLU(q[t, h]·pool[j] · I^-½) for the
//     complete pools visible to query t (j < (pos0 + t + 1)/P); q: [T, N, I], hw: [T, N]
//     (already scaled by N^-½), score: [T, stride]; a thread a (query, pool).
//   glm5flash_pool_topk      per query (a block each): the top k visible pools by score (ties
//     to the lower pool, as the reference's stable sort), their tokens in ascending pool
//     order, then (tail != 0) the visible tokens of the incomplete pool; sel: [T, max_sel]
//     token positions, count: [T]. The k-th largest score is found by a 32-step bisection
//     on its order-preserving bits (no sort), the selection compacted by block scans.
//   glm5flash_sparse_mla     absorbed NoPE MLA over the latent (R wide) of the selected
//     tokens, a block a (head, query): qa = W_ukᵀ·q_h, p = softmax(qa·latent_j · scale),
//     out_h = W_uv·(Σ_j p_j·latent_j); kvb: [H, dn + dv, R] (W_uk rows then W_uv rows),
//     latent: [positions, R], q: [T, H, dn], out: [T, H, dv]. Dynamic shared memory:
//     (2R + max_sel) floats.
// Latents, keys, gates and pools are addressed by position (pool index) in one contiguous
// buffer per sequence. A batch of rows from several sequences (decode steps, ragged chunks)
// gives each row its position (row_pos) and its sequence's slot (row_slot) in pools of such
// buffers, slot_stride elements apart; null tables mean one sequence, rows at pos0..:
//   glm5flash_scatter_rows   dst[slot][pos] = src[row] (a batch's new latents, keys, gates).
//   glm5flash_kpool_close    for each row that completes a pool (pos + 1 ≡ 0 mod P), that
//     pool of its slot, as glm5flash_kpool_compress computes it.
#include "prelude.cuh"

RESIN_KERNEL void glm5flash_indexer_keys(float* __restrict__ k, const float* __restrict__ w,
                                         const float* __restrict__ b, int rows, int dim) {
  __shared__ float scratch[32];
  int r = RESIN_BID_X;
  if (r >= rows) return;
  float* x = k + (long long)r * dim;
  float s = 0.0f;
  for (int i = RESIN_TID_X; i < dim; i += RESIN_NTID_X) s += x[i];
  float mean = resin_block_sum(s, scratch) / (float)dim;
  float v = 0.0f;
  for (int i = RESIN_TID_X; i < dim; i += RESIN_NTID_X) v += (x[i] - mean) * (x[i] - mean);
  float inv = resin_rsqrtf(resin_block_sum(v, scratch) / (float)dim + 1e-6f);
  for (int i = RESIN_TID_X; i < dim; i += RESIN_NTID_X) x[i] = (x[i] - mean) * inv * w[i] + b[i];
}

RESIN_KERNEL void glm5flash_kpool_compress(float* __restrict__ pools, const float* __restrict__ keys,
                                           const float* __restrict__ gates, const float* __restrict__ ape,
                                           int j0, int j1, int pool, int dim) {
  long long i = resin_global_tid();
  if (i >= (long long)(j1 - j0) * dim) return;
  int j = j0 + (int)(i / dim), c = (int)(i % dim);
  long long base = (long long)j * pool;
  float mx = -RESIN_INF;
  for (int s = 0; s < pool; s++) mx = resin_fmaxf(mx, gates[(base + s) * dim + c] + ape[s * dim + c]);
  float sum = 0.0f, acc = 0.0f;
  for (int s = 0; s < pool; s++) {
    float e = resin_expf(gates[(base + s) * dim + c] + ape[s * dim + c] - mx);
    sum += e;
    acc += e * keys[(base + s) * dim + c];
  }
  pools[(long long)j * dim + c] = acc / sum;
}

RESIN_KERNEL void glm5flash_indexer_scores(float* __restrict__ score, const float* __restrict__ q,
                                           const float* __restrict__ hw, const float* __restrict__ pools,
                                           const int* __restrict__ row_pos, const int* __restrict__ row_slot,
                                           long long pool_slot_stride, int tokens, int pos0, int pool,
                                           int heads, int dim, int stride, float dscale) {
  int t = RESIN_BID_Y;
  int j = RESIN_BID_X * RESIN_NTID_X + RESIN_TID_X;
  if (t >= tokens) return;
  int pos = row_pos ? row_pos[t] : pos0 + t;
  if (j >= (pos + 1) / pool) return;
  long long slot = row_slot ? row_slot[t] : 0;
  const float* pk = pools + slot * pool_slot_stride + (long long)j * dim;
  float acc = 0.0f;
  for (int h = 0; h < heads; h++) {
    const float* qh = q + ((long long)t * heads + h) * dim;
    float s = 0.0f;
    for (int d = 0; d < dim; d++) s += qh[d] * pk[d];
    acc += hw[t * heads + h] * resin_fmaxf(s * dscale, 0.0f);
  }
  score[(long long)t * stride + j] = acc;
}

// dsa_key maps a score to bits whose unsigned order is the scores' order (−0 as +0).
RESIN_DEVICE unsigned dsa_key(float f) {
  unsigned u = resin_f2u(f);
  if (u == 0x80000000u) u = 0;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// dsa_scan returns the exclusive prefix sum of flag over the block's threads (scan holds
// blockDim.x ints of shared memory) and, in *total, the sum.
RESIN_DEVICE int dsa_scan(int flag, int* scan, int* total) {
  int tid = RESIN_TID_X, n = RESIN_NTID_X;
  resin_sync();
  scan[tid] = flag;
  for (int o = 1; o < n; o <<= 1) {
    resin_sync();
    int add = tid >= o ? scan[tid - o] : 0;
    resin_sync();
    scan[tid] += add;
  }
  resin_sync();
  *total = scan[n - 1];
  return scan[tid] - flag;
}

RESIN_KERNEL void glm5flash_pool_topk(int* __restrict__ sel, int* __restrict__ count,
                                      const float* __restrict__ score, const int* __restrict__ row_pos,
                                      int tokens, int pos0, int pool, int k, int tail, int stride,
                                      int max_sel) {
  __shared__ float scratch[32];
  __shared__ int scan[1024];
  int t = RESIN_BID_X;
  if (t >= tokens) return;
  int tid = RESIN_TID_X, nt = RESIN_NTID_X;
  int pos = row_pos ? row_pos[t] : pos0 + t, visible = (pos + 1) / pool;
  const float* sc = score + (long long)t * stride;
  int* out = sel + (long long)t * max_sel;
  // The k-th largest key T: the largest with at least k keys ≥ T.
  unsigned T = 0;
  if (visible > k) {
    for (int b = 31; b >= 0; b--) {
      unsigned cand = T | (1u << b);
      int n = 0;
      for (int j = tid; j < visible; j += nt) n += dsa_key(sc[j]) >= cand;
      if ((int)resin_block_sum((float)n, scratch) >= k) T = cand;
    }
  }
  int above = 0;
  for (int j = tid; j < visible; j += nt) above += visible > k ? dsa_key(sc[j]) > T : 1;
  int need = k - (int)resin_block_sum((float)above, scratch);  // ties at T to take, lowest pools first
  int ties = 0, taken = 0;
  for (int j0 = 0; j0 < visible; j0 += nt) {
    int j = j0 + tid;
    unsigned key = j < visible ? dsa_key(sc[j]) : 0;
    int tie = j < visible && visible > k && key == T;
    int tieTotal, selTotal;
    int tieRank = ties + dsa_scan(tie, scan, &tieTotal);
    int chosen = j < visible && (visible <= k || key > T || (tie && tieRank < need));
    int slot = taken + dsa_scan(chosen, scan, &selTotal);
    if (chosen)
      for (int s = 0; s < pool; s++) out[slot * pool + s] = j * pool + s;
    ties += tieTotal;
    taken += selTotal;
  }
  int n = taken * pool;
  if (tail)
    for (int p = visible * pool + tid; p <= pos; p += nt) out[n + p - visible * pool] = p;
  if (tail) n += pos + 1 - visible * pool;
  if (tid == 0) count[t] = n;
}

RESIN_KERNEL void glm5flash_sparse_mla(float* __restrict__ out, const float* __restrict__ q,
                                       const float* __restrict__ kvb, const float* __restrict__ latents,
                                       const int* __restrict__ sel, const int* __restrict__ count,
                                       const int* __restrict__ row_slot, long long latent_slot_stride,
                                       int tokens, int heads, int dn, int dv, int rank, int max_sel,
                                       float scale) {
  extern __shared__ float mla_smem[];
  __shared__ float scratch[32];
  float* qa = mla_smem;          // [rank]
  float* ctx = qa + rank;        // [rank]
  float* p = ctx + rank;         // [max_sel]
  int h = RESIN_BID_X, t = RESIN_BID_Y;
  if (h >= heads || t >= tokens) return;
  int tid = RESIN_TID_X, nt = RESIN_NTID_X;
  int lane = tid % RESIN_WARP, warp = tid / RESIN_WARP, warps = nt / RESIN_WARP;
  const float* wuk = kvb + (long long)h * (dn + dv) * rank;
  const float* wuv = wuk + (long long)dn * rank;
  const float* qh = q + ((long long)t * heads + h) * dn;
  const int* toks = sel + (long long)t * max_sel;
  int n = count[t];
  const float* latent = latents + (row_slot ? (long long)row_slot[t] : 0) * latent_slot_stride;
  for (int r = tid; r < rank; r += nt) {
    float a = 0.0f;
    for (int d = 0; d < dn; d++) a += qh[d] * wuk[(long long)d * rank + r];
    qa[r] = a;
  }
  resin_sync();
  for (int j = warp; j < n; j += warps) {
    const float* lat = latent + (long long)toks[j] * rank;
    float s = 0.0f;
    for (int r = lane; r < rank; r += RESIN_WARP) s += qa[r] * lat[r];
    s = resin_warp_sum(s);
    if (lane == 0) p[j] = s * scale;
  }
  resin_sync();
  float mx = -RESIN_INF;
  for (int j = tid; j < n; j += nt) mx = resin_fmaxf(mx, p[j]);
  mx = resin_block_max(mx, scratch);
  float part = 0.0f;
  for (int j = tid; j < n; j += nt) {
    p[j] = resin_expf(p[j] - mx);
    part += p[j];
  }
  float sum = resin_block_sum(part, scratch);
  resin_sync();
  for (int r = tid; r < rank; r += nt) {
    float c = 0.0f;
    for (int j = 0; j < n; j++) c += p[j] / sum * latent[(long long)toks[j] * rank + r];
    ctx[r] = c;
  }
  resin_sync();
  float* oh = out + ((long long)t * heads + h) * dv;
  for (int d = warp; d < dv; d += warps) {
    float s = 0.0f;
    for (int r = lane; r < rank; r += RESIN_WARP) s += wuv[(long long)d * rank + r] * ctx[r];
    s = resin_warp_sum(s);
    if (lane == 0) oh[d] = s;
  }
}

RESIN_KERNEL void glm5flash_scatter_rows(float* __restrict__ dst, const float* __restrict__ src,
                                         const int* __restrict__ row_pos, const int* __restrict__ row_slot,
                                         long long slot_stride, int rows, int dim) {
  long long i = resin_global_tid();
  if (i >= (long long)rows * dim) return;
  int r = (int)(i / dim), c = (int)(i % dim);
  dst[(long long)row_slot[r] * slot_stride + (long long)row_pos[r] * dim + c] = src[i];
}

RESIN_KERNEL void glm5flash_kpool_close(float* __restrict__ pools, const float* __restrict__ keys,
                                        const float* __restrict__ gates, const float* __restrict__ ape,
                                        const int* __restrict__ row_pos, const int* __restrict__ row_slot,
                                        long long key_slot_stride, long long pool_slot_stride, int rows,
                                        int pool, int dim) {
  long long i = resin_global_tid();
  if (i >= (long long)rows * dim) return;
  int r = (int)(i / dim), c = (int)(i % dim);
  int pos = row_pos[r];
  if ((pos + 1) % pool != 0) return;
  long long slot = row_slot[r];
  const float* ks = keys + slot * key_slot_stride;
  const float* gs = gates + slot * key_slot_stride;
  long long base = (long long)(pos / pool) * pool;
  float mx = -RESIN_INF;
  for (int s = 0; s < pool; s++) mx = resin_fmaxf(mx, gs[(base + s) * dim + c] + ape[s * dim + c]);
  float sum = 0.0f, acc = 0.0f;
  for (int s = 0; s < pool; s++) {
    float e = resin_expf(gs[(base + s) * dim + c] + ape[s * dim + c] - mx);
    sum += e;
    acc += e * ks[(base + s) * dim + c];
  }
  pools[slot * pool_slot_stride + (long long)(pos / pool) * dim + c] = acc / sum;
}
