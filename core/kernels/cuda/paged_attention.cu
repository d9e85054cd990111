// paged_attention.cu: attention of the newest tokens of each sequence over a paged KV
// cache with grouped-query heads, as ref.PagedAttention (one call per sequence there,
// one batch here). nq = 1 is decode; nq = k+1 verifies k speculative tokens.
//   q, out:   [batch, nq, heads, head_dim]
//   page_table: [batch, max_pages] kvslab page ids, slab << RESIN_SLOT_BITS | slot
//   ctx_lens: [batch] (tokens in the cache, new ones included)
//   k_cache, v_cache: float32 caches, only read (may be one pointer). Page id p starts at
//   element base(p) = (p >> RESIN_SLOT_BITS) * slab_elems + (p & RESIN_SLOT_MASK) * page_elems
//   (kvslab's PageOffset / 4), and this layer's keys of the page, [page_tokens, kv_heads,
//   head_dim], at k_cache + base(p) + k_offset; its values at v_cache + base(p) + v_offset.
//   Pages packed back to back (page p at p*page_elems) are slab_elems = page_elems << 16.
//   query i of sequence b sits at position ctx_lens[b]-nq+i and sees keys
//   [max(0, p-window+1), p] (window 0: all); query head h reads kv head h/(heads/kv_heads).
// Grid: (heads, batch, nq); block: RESIN_ATTN_THREADS threads; head_dim <= 256.
// Each warp scores one key at a time (lanes split head_dim); scores of a chunk of keys sit
// in shared memory, and an online softmax carries the maximum and sum across chunks.
#include "prelude.cuh"

#define RESIN_ATTN_THREADS 128
#define RESIN_ATTN_CHUNK 512
#define RESIN_ATTN_MAX_DIM 256
// The low bits of a page id that hold its slot in the slab: core/kvslab.SlotBits.
#define RESIN_SLOT_BITS 16
#define RESIN_SLOT_MASK ((1u << RESIN_SLOT_BITS) - 1u)

// resin_page_base is the element offset of page id's first element.
RESIN_DEVICE long long resin_page_base(unsigned id, long long slab_elems, long long page_elems) {
  return (long long)(id >> RESIN_SLOT_BITS) * slab_elems +
         (long long)(id & RESIN_SLOT_MASK) * page_elems;
}

RESIN_KERNEL void resin_paged_attention(float* __restrict__ out, const float* __restrict__ q,
                                        const float* __restrict__ k_cache,
                                        const float* __restrict__ v_cache,
                                        const unsigned* __restrict__ page_table,
                                        const int* __restrict__ ctx_lens, int nq, int heads,
                                        int kv_heads, int head_dim, int page_tokens,
                                        int max_pages, float scale, int window,
                                        long long slab_elems, long long page_elems,
                                        long long k_offset, long long v_offset) {
  __shared__ float qs[RESIN_ATTN_MAX_DIM];
  __shared__ float scores[RESIN_ATTN_CHUNK];
  __shared__ float scratch[32];
  int h = RESIN_BID_X, b = RESIN_BID_Y, qi = RESIN_BID_Z;
  int ctx = ctx_lens[b];
  int p = ctx - nq + qi;  // this query's position
  long long row = (((long long)b * nq + qi) * heads + h) * head_dim;
  float* o = out + row;
  if (p < 0) {  // fewer tokens than queries: nothing to attend to
    for (int d = RESIN_TID_X; d < head_dim; d += RESIN_NTID_X) o[d] = 0.0f;
    return;
  }
  int lo = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
  int kvh = h / (heads / kv_heads);
  int tok_elems = kv_heads * head_dim;  // one token's keys (or values) in a page
  const float* kb = k_cache + k_offset + (long long)kvh * head_dim;
  const float* vb = v_cache + v_offset + (long long)kvh * head_dim;
  const unsigned* pages = page_table + (long long)b * max_pages;
  for (int d = RESIN_TID_X; d < head_dim; d += RESIN_NTID_X) qs[d] = q[row + d];
  resin_sync();

  unsigned lane = RESIN_TID_X % RESIN_WARP, warp = RESIN_TID_X / RESIN_WARP;
  unsigned warps = RESIN_NTID_X / RESIN_WARP;
  // Each thread owns output dimensions d0 = tid and d1 = tid + blockDim.
  int d0 = RESIN_TID_X, d1 = RESIN_TID_X + RESIN_NTID_X;
  float acc0 = 0.0f, acc1 = 0.0f;
  float m = -RESIN_INF, l = 0.0f;

  for (int start = lo; start <= p; start += RESIN_ATTN_CHUNK) {
    int n = p + 1 - start < RESIN_ATTN_CHUNK ? p + 1 - start : RESIN_ATTN_CHUNK;
    // scores[j] = scale * q . k_{start+j}
    for (int j = warp; j < n; j += warps) {
      int t = start + j;
      const float* k = kb + resin_page_base(pages[t / page_tokens], slab_elems, page_elems) +
                       (long long)(t % page_tokens) * tok_elems;
      float s = 0.0f;
      for (int d = lane; d < head_dim; d += RESIN_WARP) s += qs[d] * k[d];
      s = resin_warp_sum(s);
      if (lane == 0) scores[j] = s * scale;
    }
    resin_sync();
    float cm = -RESIN_INF;
    for (int j = RESIN_TID_X; j < n; j += RESIN_NTID_X) cm = resin_fmaxf(cm, scores[j]);
    cm = resin_block_max(cm, scratch);
    float nm = resin_fmaxf(m, cm);
    float cs = 0.0f;
    for (int j = RESIN_TID_X; j < n; j += RESIN_NTID_X) {
      float e = resin_expf(scores[j] - nm);
      scores[j] = e;
      cs += e;
    }
    cs = resin_block_sum(cs, scratch);  // its barrier also publishes scores[]
    float carry = resin_expf(m - nm);   // 0 on the first chunk (m = -inf)
    acc0 *= carry;
    acc1 *= carry;
    for (int j = 0; j < n; j++) {
      int t = start + j;
      const float* v = vb + resin_page_base(pages[t / page_tokens], slab_elems, page_elems) +
                       (long long)(t % page_tokens) * tok_elems;
      float w = scores[j];
      if (d0 < head_dim) acc0 += w * v[d0];
      if (d1 < head_dim) acc1 += w * v[d1];
    }
    l = l * carry + cs;
    m = nm;
    resin_sync();  // scores[] is rewritten by the next chunk
  }
  float inv = 1.0f / l;
  if (d0 < head_dim) o[d0] = acc0 * inv;
  if (d1 < head_dim) o[d1] = acc1 * inv;
}
