// flash_attention.cu: attention over the paged bf16 KV cache, FlashAttention-style (key
// tiles in shared memory, an online softmax in float32), as ref.PagedAttention per
// sequence. Three kernels:
//   resin_prefill_attention_bf16  ragged prefill: every query row of every sequence
//   resin_decode_attention_bf16   split-K decode: one query per sequence, all query heads of
//                                 a GQA group in one block, the context cut in partitions
//   resin_decode_reduce_bf16      merges the decode partitions by log-sum-exp
//
// The batch is a BatchPlan's (B sequences, T tokens):
//   q: [T, q_stride] bf16, query head h at q + t*q_stride + h*head_dim
//   out: [T, heads, head_dim] bf16
//   query_start: [B+1] int32; sequence b's queries are tokens query_start[b]..[b+1]-1
//   seq_lens: [B] int32, tokens in the cache after this step's keys were written
//     (Computed + Scheduled); query row j of b sits at position seq_lens[b]-n_b+j, so a
//     chunk of a prompt attends to the cached pages before it and to itself, causally.
//   page_table_start: [B+1] int32, page_table: uint32 kvslab page ids (BatchPlan's ragged
//     GroupPlan.PageTable): token t of b is token t%page_tokens of page
//     page_table[page_table_start[b] + t/page_tokens].
//   k_cache, v_cache: bf16; token t of page id p, kv head g, at
//     resin_page_slot_base(p) + k_offset + ((t%page_tokens)*kv_heads + g)*head_dim
//     (v_offset for values); one pointer twice for a kvslab arena (KVSlabLayout).
//   A query at position p sees keys [max(0, p-window+1), p] (window 0: [0, p]); query head
//   h reads kv head h / (heads/kv_heads). head_dim is even and at most 256; every element
//   offset above is even (the kernels read bf16 pairs as 32-bit words).
#include "prelude.cuh"

#define RESIN_FA_THREADS 128  // 4 warps
#define RESIN_FA_KEYS 32      // keys per tile: lane j scores key j
#define RESIN_FA_MAX_DIM 256
#define RESIN_FA_ROWS 4                        // query rows per warp
#define RESIN_FA_QROWS 16                      // query rows per block: 4 warps x 4 rows
#define RESIN_FA_KW (RESIN_FA_MAX_DIM / 2 + 1)  // words per key row, padded: no bank conflicts
#define RESIN_FA_VW (RESIN_FA_MAX_DIM / 2)      // words per value (and query) row

RESIN_DEVICE float resin_lo_bf(unsigned w) { return resin_u2f(w << 16); }
RESIN_DEVICE float resin_hi_bf(unsigned w) { return resin_u2f(w & 0xffff0000u); }

RESIN_DEVICE unsigned resin_pack_bf(float lo, float hi) {
  return (unsigned)resin_f2bf(lo) | ((unsigned)resin_f2bf(hi) << 16);
}

// resin_u4 is 16 bytes (8 bf16) read or written in one access.
struct alignas(16) resin_u4 {
  unsigned x, y, z, w;
};

// RESIN_FA_ALIGN16 aligns a shared array that resin_fa_load_tile writes 16 bytes at a
// time: a shared array of unsigned is only promised 4-byte alignment, and a misaligned
// 16-byte shared store faults.
#define RESIN_FA_ALIGN16 __attribute__((aligned(16)))

// resin_fa_load_tile loads keys t0..t0+31 of kv head kvh into ks and vs; keys at or past
// end are zeros (their scores are masked, and zero values keep 0*v finite). Where every
// key row starts on 16 bytes (vec), the block reads 16 bytes per thread and access,
// spread over all its threads; otherwise 4.
RESIN_DEVICE void resin_fa_load_tile(unsigned* ks, unsigned* vs, const resin_bf16* k_cache,
                                     const resin_bf16* v_cache, const unsigned* pages, int t0,
                                     int end, int kvh, int kv_heads, int head_dim,
                                     int page_tokens, long long slab_elems, long long page_elems,
                                     long long k_offset, long long v_offset, bool vec) {
  int words = head_dim / 2;
  if (vec) {
    int quads = words / 4, n = RESIN_FA_KEYS * quads;
    for (int e = RESIN_TID_X; e < n; e += RESIN_NTID_X) {
      int j = e / quads, c = e - j * quads, t = t0 + j;
      unsigned* kd = ks + j * RESIN_FA_KW + 4 * c;  // padded rows: not 16-byte aligned
      resin_u4* vd = (resin_u4*)(vs + j * RESIN_FA_VW + 4 * c);
      if (t >= end) {
        kd[0] = kd[1] = kd[2] = kd[3] = 0u;
        vd->x = vd->y = vd->z = vd->w = 0u;
        continue;
      }
      long long base = resin_page_slot_base(pages[t / page_tokens], slab_elems, page_elems) +
                       ((long long)(t % page_tokens) * kv_heads + kvh) * head_dim;
      resin_u4 kq = ((const resin_u4*)(k_cache + base + k_offset))[c];
      kd[0] = kq.x;
      kd[1] = kq.y;
      kd[2] = kq.z;
      kd[3] = kq.w;
      *vd = ((const resin_u4*)(v_cache + base + v_offset))[c];
    }
    return;
  }
  unsigned lane = RESIN_TID_X % RESIN_WARP, warp = RESIN_TID_X / RESIN_WARP;
  for (int j = warp; j < RESIN_FA_KEYS; j += RESIN_FA_THREADS / RESIN_WARP) {
    int t = t0 + j;
    const unsigned* kr = 0;
    const unsigned* vr = 0;
    if (t < end) {
      long long base = resin_page_slot_base(pages[t / page_tokens], slab_elems, page_elems) +
                       ((long long)(t % page_tokens) * kv_heads + kvh) * head_dim;
      kr = (const unsigned*)(k_cache + base + k_offset);
      vr = (const unsigned*)(v_cache + base + v_offset);
    }
    for (int w = lane; w < words; w += RESIN_WARP) {
      ks[j * RESIN_FA_KW + w] = kr ? kr[w] : 0u;
      vs[j * RESIN_FA_VW + w] = vr ? vr[w] : 0u;
    }
  }
}

// resin_fa_vec reports whether every key and value row starts on 16 bytes.
RESIN_DEVICE bool resin_fa_vec(const resin_bf16* k_cache, const resin_bf16* v_cache, int head_dim,
                               long long slab_elems, long long page_elems, long long k_offset,
                               long long v_offset) {
  unsigned long long a = (unsigned long long)k_cache | (unsigned long long)v_cache;
  long long e = slab_elems | page_elems | k_offset | v_offset | (long long)head_dim;
  return (a & 15u) == 0 && (e & 7) == 0;
}

// resin_fa_attend folds one key tile into a warp's four query rows: rows qrow0 + r*qstep
// of qsm, where row r sees keys [lo[r], hi[r]] (lo > hi: none). m, l and acc are the
// rows' running maximum, sum and unnormalised output; lane owns dimensions 2w and 2w+1 of
// words w = lane + 32*i.
RESIN_DEVICE void resin_fa_attend(const unsigned* ks, const unsigned* vs, const unsigned* qsm,
                                  int qrow0, int qstep, int t0, const int* lo, const int* hi,
                                  int head_dim, float scale, float* m, float* l,
                                  float (*acc)[8]) {
  int lane = RESIN_TID_X % RESIN_WARP;
  int words = head_dim / 2;
  float s[RESIN_FA_ROWS] = {0.0f, 0.0f, 0.0f, 0.0f};
  const unsigned* kr = ks + lane * RESIN_FA_KW;
  for (int w = 0; w < words; w++) {
    unsigned kw = kr[w];
    float k0 = resin_lo_bf(kw), k1 = resin_hi_bf(kw);
#pragma unroll
    for (int r = 0; r < RESIN_FA_ROWS; r++) {
      unsigned qw = qsm[(qrow0 + r * qstep) * RESIN_FA_VW + w];
      s[r] += resin_lo_bf(qw) * k0 + resin_hi_bf(qw) * k1;
    }
  }
  int t = t0 + lane;
  float p[RESIN_FA_ROWS];
#pragma unroll
  for (int r = 0; r < RESIN_FA_ROWS; r++) {
    p[r] = 0.0f;
    float sc = t >= lo[r] && t <= hi[r] ? s[r] * scale : -RESIN_INF;
    float mn = resin_fmaxf(m[r], resin_warp_max(sc));
    if (mn == -RESIN_INF) continue;  // warp-uniform: no key of the tile, none before
    p[r] = resin_expf(sc - mn);
    float corr = resin_expf(m[r] - mn);  // 0 while m is -inf
    l[r] = l[r] * corr + resin_warp_sum(p[r]);
    m[r] = mn;
#pragma unroll
    for (int i = 0; i < 8; i++) acc[r][i] *= corr;
  }
  for (int j = 0; j < RESIN_FA_KEYS; j++) {
    float pj[RESIN_FA_ROWS];
#pragma unroll
    for (int r = 0; r < RESIN_FA_ROWS; r++) pj[r] = resin_shfl_f32(p[r], j);
    const unsigned* vr = vs + j * RESIN_FA_VW;
#pragma unroll
    for (int i = 0; i < 4; i++) {
      int w = lane + RESIN_WARP * i;
      if (w < words) {
        unsigned vw = vr[w];
        float v0 = resin_lo_bf(vw), v1 = resin_hi_bf(vw);
#pragma unroll
        for (int r = 0; r < RESIN_FA_ROWS; r++) {
          acc[r][2 * i] += pj[r] * v0;
          acc[r][2 * i + 1] += pj[r] * v1;
        }
      }
    }
  }
}

// resin_fa_load_q copies query rows into qsm: row i is token tok(i)'s head head(i), or
// zeros for i >= n (rows past the block's queries).
RESIN_DEVICE void resin_fa_store_q(unsigned* qsm, int i, const resin_bf16* src, int words) {
  for (int w = RESIN_TID_X % RESIN_WARP; w < words; w += RESIN_WARP)
    qsm[i * RESIN_FA_VW + w] = src ? ((const unsigned*)src)[w] : 0u;
}

// resin_fa_write_out stores a row's normalised output as bf16.
RESIN_DEVICE void resin_fa_write_out(resin_bf16* dst, const float* acc, float l, int words) {
  int lane = RESIN_TID_X % RESIN_WARP;
  float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
  for (int i = 0; i < 4; i++) {
    int w = lane + RESIN_WARP * i;
    if (w < words) ((unsigned*)dst)[w] = resin_pack_bf(acc[2 * i] * inv, acc[2 * i + 1] * inv);
  }
}

// resin_prefill_attention_bf16: grid (T/16 + B, heads), block RESIN_FA_THREADS. Block x of
// sequence b is its query tile x - (query_start[b]/16 + b) (a sequence of n rows has at most
// n/16 + 1 tiles, so the grid covers every tile without a host-side tile list); a tile past
// the sequence's rows exits. skip_decode leaves sequences with one query to the decode
// kernel.
RESIN_KERNEL void resin_prefill_attention_bf16(
    resin_bf16* __restrict__ out, const resin_bf16* __restrict__ q,
    const resin_bf16* __restrict__ k_cache, const resin_bf16* __restrict__ v_cache,
    const int* __restrict__ query_start, const int* __restrict__ seq_lens,
    const int* __restrict__ page_table_start, const unsigned* __restrict__ page_table, int batch,
    int heads, int kv_heads, int head_dim, int page_tokens, float scale, int window,
    int skip_decode, long long q_stride, long long slab_elems, long long page_elems,
    long long k_offset, long long v_offset) {
  __shared__ unsigned ks[RESIN_FA_KEYS * RESIN_FA_KW];
  __shared__ RESIN_FA_ALIGN16 unsigned vs[RESIN_FA_KEYS * RESIN_FA_VW];  // 16-byte stores
  __shared__ unsigned qsm[RESIN_FA_QROWS * RESIN_FA_VW];
  int x = RESIN_BID_X, h = RESIN_BID_Y;
  int lo_b = 0, hi_b = batch - 1;  // the last sequence whose first tile is at or before x
  while (lo_b < hi_b) {
    int mid = (lo_b + hi_b + 1) / 2;
    if (query_start[mid] / RESIN_FA_QROWS + mid <= x)
      lo_b = mid;
    else
      hi_b = mid - 1;
  }
  int b = lo_b;
  int q0 = query_start[b], n = query_start[b + 1] - q0;
  int row0 = (x - (q0 / RESIN_FA_QROWS + b)) * RESIN_FA_QROWS;
  if (row0 < 0 || row0 >= n || (skip_decode && n == 1)) return;
  int len = seq_lens[b];
  int first = len - n;  // position of the sequence's first query row
  int kvh = h / (heads / kv_heads);
  int words = head_dim / 2;
  bool vec = resin_fa_vec(k_cache, v_cache, head_dim, slab_elems, page_elems, k_offset, v_offset);
  const unsigned* pages = page_table + page_table_start[b];
  unsigned warp = RESIN_TID_X / RESIN_WARP;
  for (int i = warp; i < RESIN_FA_QROWS; i += RESIN_FA_THREADS / RESIN_WARP)
    resin_fa_store_q(qsm, i, row0 + i < n ? q + (long long)(q0 + row0 + i) * q_stride + (long long)h * head_dim : 0,
                     words);

  int rows = n - row0 < RESIN_FA_QROWS ? n - row0 : RESIN_FA_QROWS;
  int lo[RESIN_FA_ROWS], hi[RESIN_FA_ROWS];
  float m[RESIN_FA_ROWS], l[RESIN_FA_ROWS], acc[RESIN_FA_ROWS][8];
#pragma unroll
  for (int r = 0; r < RESIN_FA_ROWS; r++) {
    int i = warp * RESIN_FA_ROWS + r;
    int p = first + row0 + i;
    hi[r] = i < rows ? p : -1;
    lo[r] = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
    m[r] = -RESIN_INF;
    l[r] = 0.0f;
#pragma unroll
    for (int d = 0; d < 8; d++) acc[r][d] = 0.0f;
  }
  int p_first = first + row0, end = first + row0 + rows;  // keys [t_lo, end)
  int t_lo = window > 0 && p_first - window + 1 > 0 ? p_first - window + 1 : 0;
  for (int t0 = t_lo; t0 < end; t0 += RESIN_FA_KEYS) {
    resin_sync();  // the previous tile is consumed (and, the first time, q is stored)
    resin_fa_load_tile(ks, vs, k_cache, v_cache, pages, t0, end, kvh, kv_heads, head_dim,
                       page_tokens, slab_elems, page_elems, k_offset, v_offset, vec);
    resin_sync();
    resin_fa_attend(ks, vs, qsm, warp * RESIN_FA_ROWS, 1, t0, lo, hi, head_dim, scale, m, l, acc);
  }
#pragma unroll
  for (int r = 0; r < RESIN_FA_ROWS; r++) {
    int i = warp * RESIN_FA_ROWS + r;
    if (i < rows)
      resin_fa_write_out(out + ((long long)(q0 + row0 + i) * heads + h) * head_dim, acc[r], l[r],
                         words);
  }
}

// resin_decode_attention_bf16: grid (kv_heads, B, parts), block RESIN_FA_THREADS. The block
// of (kv head g, sequence b, partition z) attends the sequence's last query (token
// query_start[b+1]-1, position seq_lens[b]-1) for every query head of g's group (at most
// 16: warp w owns heads w, w+4, w+8, w+12 of the group) over keys [lo + z*part_len,
// lo + (z+1)*part_len) of its range [lo, seq_len), reading each key and value once for
// the whole group. With parts == 1 it writes out; otherwise part_out [B, heads, parts,
// head_dim] float32 (normalised within the partition) and part_lse [B, heads, parts]
// (log-sum-exp of the partition's scores, -inf when it holds no key), which
// resin_decode_reduce_bf16 merges. Sequences with more than one query are skipped (the
// prefill kernel serves them).
RESIN_KERNEL void resin_decode_attention_bf16(
    resin_bf16* __restrict__ out, float* __restrict__ part_out, float* __restrict__ part_lse,
    const resin_bf16* __restrict__ q, const resin_bf16* __restrict__ k_cache,
    const resin_bf16* __restrict__ v_cache, const int* __restrict__ query_start,
    const int* __restrict__ seq_lens, const int* __restrict__ page_table_start,
    const unsigned* __restrict__ page_table, int heads, int kv_heads, int head_dim,
    int page_tokens, float scale, int window, int parts, int part_len, long long q_stride,
    long long slab_elems, long long page_elems, long long k_offset, long long v_offset) {
  __shared__ unsigned ks[RESIN_FA_KEYS * RESIN_FA_KW];
  __shared__ RESIN_FA_ALIGN16 unsigned vs[RESIN_FA_KEYS * RESIN_FA_VW];  // 16-byte stores
  __shared__ unsigned qsm[RESIN_FA_QROWS * RESIN_FA_VW];
  int g = RESIN_BID_X, b = RESIN_BID_Y, z = RESIN_BID_Z;
  int tok = query_start[b + 1] - 1;
  if (tok != query_start[b]) return;  // not a decode row
  int group = heads / kv_heads;
  int words = head_dim / 2;
  bool vec = resin_fa_vec(k_cache, v_cache, head_dim, slab_elems, page_elems, k_offset, v_offset);
  int len = seq_lens[b];
  int p = len - 1;
  int lo_all = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
  int start = lo_all + z * part_len;
  // The last partition runs to the end, so a sequence longer than the host planned for
  // (parts * part_len keys) is slower, never truncated.
  int end = z == parts - 1 || start + part_len > len ? len : start + part_len;
  const unsigned* pages = page_table + page_table_start[b];
  unsigned warp = RESIN_TID_X / RESIN_WARP;
  for (int i = warp; i < RESIN_FA_QROWS; i += RESIN_FA_THREADS / RESIN_WARP)
    resin_fa_store_q(qsm, i, i < group ? q + (long long)tok * q_stride + (long long)(g * group + i) * head_dim : 0,
                     words);
  int lo[RESIN_FA_ROWS], hi[RESIN_FA_ROWS];
  float m[RESIN_FA_ROWS], l[RESIN_FA_ROWS], acc[RESIN_FA_ROWS][8];
#pragma unroll
  for (int r = 0; r < RESIN_FA_ROWS; r++) {
    int i = warp + r * (RESIN_FA_THREADS / RESIN_WARP);
    lo[r] = start;
    hi[r] = i < group ? end - 1 : -1;
    m[r] = -RESIN_INF;
    l[r] = 0.0f;
#pragma unroll
    for (int d = 0; d < 8; d++) acc[r][d] = 0.0f;
  }
  for (int t0 = start; t0 < end; t0 += RESIN_FA_KEYS) {
    resin_sync();
    resin_fa_load_tile(ks, vs, k_cache, v_cache, pages, t0, end, g, kv_heads, head_dim,
                       page_tokens, slab_elems, page_elems, k_offset, v_offset, vec);
    resin_sync();
    resin_fa_attend(ks, vs, qsm, warp, RESIN_FA_THREADS / RESIN_WARP, t0, lo, hi, head_dim, scale,
                    m, l, acc);
  }
  int lane = RESIN_TID_X % RESIN_WARP;
#pragma unroll
  for (int r = 0; r < RESIN_FA_ROWS; r++) {
    int i = warp + r * (RESIN_FA_THREADS / RESIN_WARP);
    if (i >= group) continue;
    int h = g * group + i;
    if (parts == 1) {
      resin_fa_write_out(out + ((long long)tok * heads + h) * head_dim, acc[r], l[r], words);
      continue;
    }
    long long at = ((long long)b * heads + h) * parts + z;
    float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
    float* o = part_out + at * head_dim;
#pragma unroll
    for (int k = 0; k < 4; k++) {
      int w = lane + RESIN_WARP * k;
      if (w < words) {
        o[2 * w] = acc[r][2 * k] * inv;
        o[2 * w + 1] = acc[r][2 * k + 1] * inv;
      }
    }
    if (lane == 0) part_lse[at] = l[r] > 0.0f ? m[r] + resin_logf(l[r]) : -RESIN_INF;
  }
}

// resin_decode_reduce_bf16: grid (heads, B), block any multiple of 32 threads. out of
// (sequence b, head h) = sum_z exp(lse_z - M) * part_out_z / sum_z exp(lse_z - M), M the
// largest lse; zeros when no partition held a key.
RESIN_KERNEL void resin_decode_reduce_bf16(resin_bf16* __restrict__ out,
                                           const float* __restrict__ part_out,
                                           const float* __restrict__ part_lse,
                                           const int* __restrict__ query_start, int heads,
                                           int head_dim, int parts) {
  int h = RESIN_BID_X, b = RESIN_BID_Y;
  int tok = query_start[b + 1] - 1;
  if (tok != query_start[b]) return;
  long long at = ((long long)b * heads + h) * parts;
  const float* lse = part_lse + at;
  float mx = -RESIN_INF;
  for (int z = 0; z < parts; z++) mx = resin_fmaxf(mx, lse[z]);
  float sum = 0.0f;
  if (mx != -RESIN_INF)
    for (int z = 0; z < parts; z++) sum += resin_expf(lse[z] - mx);
  float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
  resin_bf16* o = out + ((long long)tok * heads + h) * head_dim;
  for (int d = RESIN_TID_X; d < head_dim; d += RESIN_NTID_X) {
    float a = 0.0f;
    if (sum > 0.0f)
      for (int z = 0; z < parts; z++) {
        float wz = resin_expf(lse[z] - mx);
        a += wz * part_out[(at + z) * head_dim + d];
      }
    o[d] = resin_f2bf(a * inv);
  }
}
