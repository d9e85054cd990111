// rope_kv.cu: rotary embeddings on the new tokens' queries and keys, and the keys and
// values written into their kvslab pages, as ref.RopeTable.RoPENeoX (or RoPEInterleaved)
// on q and k followed by ref.PagedKV.StoreKV.
//   q: [tokens, q_stride] (heads*head_dim used)   k, v: [tokens, kv_stride] (kv_heads*head_dim)
//     q, k and v may be views of one fused QKV row (q_stride = kv_stride = the row width).
//   pos: [tokens] int32 positions   slots: [tokens] int64 (BatchPlan.SlotMapping)
//   cos_t, sin_t: float32 [max_pos, rot_dim/2] (ref.RopeTable)
//   cache: the kvslab arena in the element type. Slot s names page id s / page_tokens
//     (kvslab.PageID), token s % page_tokens; the token's keys of kv head h are at
//       resin_page_slot_base(id) + k_offset + ((s % page_tokens) * kv_heads + h) * head_dim
//     and its values at v_offset instead (core/kernels/cuda.KVSlabLayout).
// q and k are rotated in place (the first rot_dim dimensions of each head; NeoX pairs i with
// i + rot_dim/2, GPT-J, interleaved, 2i with 2i+1). A negative slot (engine.NoSlot: a
// padding token) stores nothing; a position outside [0, max_pos) is left unrotated.
// Grid: tokens blocks; block: any multiple of 32 threads.
#include "prelude.cuh"

template <typename T>
RESIN_DEVICE void resin_rope_kv(T* q, T* k, const T* v, T* cache, const int* __restrict__ pos,
                                const long long* __restrict__ slots,
                                const float* __restrict__ cos_t,
                                const float* __restrict__ sin_t, int heads, int kv_heads,
                                int head_dim, int rot_dim, int max_pos, int interleaved,
                                long long q_stride, long long kv_stride, int page_tokens,
                                long long slab_elems, long long page_elems, long long k_offset,
                                long long v_offset) {
  long long t = RESIN_BID_X;
  int p = pos[t];
  bool rotate = p >= 0 && p < max_pos;
  int half = rot_dim / 2;
  long long s = slots[t];
  long long kdst = -1, vdst = -1;
  if (s >= 0) {
    unsigned id = (unsigned)(s / page_tokens);
    long long base = resin_page_slot_base(id, slab_elems, page_elems) +
                     (s % page_tokens) * (long long)kv_heads * head_dim;
    kdst = base + k_offset;
    vdst = base + v_offset;
  }
  T* qr = q + t * q_stride;
  T* kr = k + t * kv_stride;
  const T* vr = v + t * kv_stride;
  // Rotated pairs of the query heads, then of the kv heads (which are also stored).
  int pairs = (heads + kv_heads) * half;
  for (int j = RESIN_TID_X; j < pairs && rotate; j += RESIN_NTID_X) {
    int h = j / half, i = j % half;
    bool is_k = h >= heads;
    T* x = is_k ? kr + (long long)(h - heads) * head_dim : qr + (long long)h * head_dim;
    int a = interleaved ? 2 * i : i;
    int b = interleaved ? 2 * i + 1 : i + half;
    float c = cos_t[(long long)p * half + i], sn = sin_t[(long long)p * half + i];
    float x0 = resin_load(x, a), x1 = resin_load(x, b);
    float y0 = x0 * c - x1 * sn, y1 = x1 * c + x0 * sn;
    resin_store(x, a, y0);
    resin_store(x, b, y1);
    if (is_k && kdst >= 0) {
      long long o = kdst + (long long)(h - heads) * head_dim;
      resin_store(cache, o + a, y0);
      resin_store(cache, o + b, y1);
    }
  }
  if (kdst < 0) return;
  // The keys' unrotated dimensions (all of them when the position is out of the table) and
  // the values. Each element is read from the same thread's input, so no barrier is needed:
  // the rotated dimensions above were written from registers.
  int lo = rotate ? rot_dim : 0;
  int kv = kv_heads * head_dim;
  for (int j = RESIN_TID_X; j < kv; j += RESIN_NTID_X) {
    int d = j % head_dim;
    if (d >= lo) cache[kdst + j] = kr[j];
    cache[vdst + j] = vr[j];
  }
}

RESIN_KERNEL void resin_rope_kv_f32(float* q, float* k, const float* v, float* cache,
                                    const int* pos, const long long* slots, const float* cos_t,
                                    const float* sin_t, int heads, int kv_heads, int head_dim,
                                    int rot_dim, int max_pos, int interleaved,
                                    long long q_stride, long long kv_stride, int page_tokens,
                                    long long slab_elems, long long page_elems,
                                    long long k_offset, long long v_offset) {
  resin_rope_kv(q, k, v, cache, pos, slots, cos_t, sin_t, heads, kv_heads, head_dim, rot_dim,
                max_pos, interleaved, q_stride, kv_stride, page_tokens, slab_elems, page_elems,
                k_offset, v_offset);
}

RESIN_KERNEL void resin_rope_kv_bf16(resin_bf16* q, resin_bf16* k, const resin_bf16* v,
                                     resin_bf16* cache, const int* pos, const long long* slots,
                                     const float* cos_t, const float* sin_t, int heads,
                                     int kv_heads, int head_dim, int rot_dim, int max_pos,
                                     int interleaved, long long q_stride, long long kv_stride,
                                     int page_tokens, long long slab_elems, long long page_elems,
                                     long long k_offset, long long v_offset) {
  resin_rope_kv(q, k, v, cache, pos, slots, cos_t, sin_t, heads, kv_heads, head_dim, rot_dim,
                max_pos, interleaved, q_stride, kv_stride, page_tokens, slab_elems, page_elems,
                k_offset, v_offset);
}
