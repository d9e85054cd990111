// moe_masked.cu: a mixture of experts whose layout never leaves the device (graph-safe):
// routing, a masked per-expert layout with a fixed maximum of rows per expert (as
// DeepGEMM's masked grouped GEMM takes it), the gather of each expert's rows, the clamped
// SwiGLU and the weighted combine. The grouped GEMMs between them are cuBLASLt's
// (strided batched over the experts: rows past an expert's count are zeros and ignored).
//
// resin_moe_route_f32: one warp per token (DeepSeek-V4, GLM-5).
//   logits: [tokens, experts]   bias: [experts] or null   tid2eid: [vocab, k] or null
//   token_ids: [tokens]   ids, weights: [tokens, k]
//   score = sqrt(softplus(x)) (scoring 0; softplus(x) = x above 20) or sigmoid(x) (1).
//   tid2eid set: hash routing, ids = tid2eid[token_id] (checked on the host at load);
//   else the k best score + bias, the lower expert first on a tie, best first.
//   weight_j = score[id_j] / (Σ_j score[id_j] + 1e-20) · scale.
//
// resin_moe_masked_layout: one block per expert.
//   ids: [pairs] (pair p = token·k + slot)   counts: [experts]   pair_of: [experts, max_rows]
//   slot_of: [pairs]. Expert e's rows are its pairs in ascending order: pair_of[e, i] = p,
//   slot_of[p] = i, counts[e] = their number (at most max_rows; a pair past it is dropped,
//   slot_of = -1, and so is a pair whose id is outside [0, experts)); pair_of is -1 past
//   the count.
//
// resin_moe_gather_f32: xe[e, i, :] = x[pair_of[e, i] / k, :], zeros where pair_of is -1.
//   x: [tokens, dim]   xe: [experts, max_rows, dim]
//
// resin_swiglu_clamped_f32: as ref.SiLUMulClamped on rows of gate ‖ up.
//   gate_up: [rows, 2·dim]   out: [rows, dim]
//   out = silu(min(g, limit)) · min(max(u, −limit), limit) (NaN stays NaN)
//
// resin_moe_combine_f32: one block per token.
//   ye: [experts, max_rows, dim]   shared: [tokens, dim] or null   out: [tokens, dim]
//   out[t] = Σ_j weights[t, j] · ye[ids[t, j], slot_of[t·k + j]] in ascending expert order
//   (as the reference adds experts one by one), then + shared[t].
#include "prelude.cuh"

#define RESIN_MOE_ROUTE_MAX_EXPERTS 1024
#define RESIN_MOE_MAX_K 32
#define RESIN_MOE_LAYOUT_THREADS 256

#if defined(__CUDACC_RTC__) || defined(__NVCC__)
#define resin_moe_sqrtf(x) sqrtf(x)
#else
#define resin_moe_sqrtf(x) __nvvm_sqrt_rn_f(x)
#endif

RESIN_DEVICE float resin_moe_score(float x, int scoring) {
  if (scoring == 1) return 1.0f / (1.0f + resin_expf(-x));
  float sp;
  if (x > 20.0f) {
    sp = x;
  } else if (x < -15.0f) {
    float u = resin_expf(x);  // log1p(u) = u − u²/2 + …, 1 + u rounds u away here
    sp = u - 0.5f * u * u;
  } else {
    sp = resin_logf(1.0f + resin_expf(x));
  }
  return resin_moe_sqrtf(sp);
}

RESIN_KERNEL void resin_moe_route_f32(float* __restrict__ weights, int* __restrict__ ids,
                                      const float* __restrict__ logits,
                                      const float* __restrict__ bias,
                                      const int* __restrict__ tid2eid,
                                      const int* __restrict__ token_ids, int tokens, int experts,
                                      int k, int scoring, float scale) {
  __shared__ float score[RESIN_MOE_ROUTE_MAX_EXPERTS];
  __shared__ float choice[RESIN_MOE_ROUTE_MAX_EXPERTS];
  __shared__ int picked[RESIN_MOE_MAX_K];
  int t = RESIN_BID_X;
  if (t >= tokens) return;
  unsigned lane = RESIN_TID_X;
  const float* row = logits + (long long)t * experts;
  for (int e = lane; e < experts; e += RESIN_WARP) {
    float s = resin_moe_score(row[e], scoring);
    score[e] = s;
    float v = s + (bias ? bias[e] : 0.0f);
    choice[e] = v != v ? -RESIN_INF : v;  // a NaN score is the worst choice, still pickable
  }
  resin_sync();
  if (tid2eid) {  // every lane takes the same branch
    for (int j = lane; j < k; j += RESIN_WARP) picked[j] = tid2eid[(long long)token_ids[t] * k + j];
    resin_sync();
  } else {
    for (int j = 0; j < k; j++) {
      float bv = -RESIN_INF;
      int bi = 0x7fffffff;
      for (int e = lane; e < experts; e += RESIN_WARP) {
        if (resin_better(choice[e], e, bv, bi)) {
          bv = choice[e];
          bi = e;
        }
      }
      resin_warp_argmax(&bv, &bi);
      if (bi == 0x7fffffff) bi = 0;  // unreachable with k <= experts
      if (lane == 0) {
        picked[j] = bi;
        choice[bi] = resin_u2f(0x7fc00000u);  // taken: NaN is never picked (moe_topk.cu)
      }
      resin_sync();
    }
  }
  if (lane == 0) {
    float sum = 0.0f;
    for (int j = 0; j < k; j++) {
      int id = picked[j];
      sum += id >= 0 && id < experts ? score[id] : 0.0f;
    }
    for (int j = 0; j < k; j++) {
      int id = picked[j];
      float s = id >= 0 && id < experts ? score[id] : 0.0f;
      ids[(long long)t * k + j] = id;
      weights[(long long)t * k + j] = s / (sum + 1e-20f) * scale;
    }
  }
}

RESIN_KERNEL void resin_moe_masked_layout(int* __restrict__ counts, int* __restrict__ pair_of,
                                          int* __restrict__ slot_of, const int* __restrict__ ids,
                                          int pairs, int experts, int max_rows) {
  __shared__ int scan[RESIN_MOE_LAYOUT_THREADS];
  int e = RESIN_BID_X;
  if (e >= experts) return;
  int tid = RESIN_TID_X;
  int base = 0;
  for (int p0 = 0; p0 < pairs; p0 += RESIN_MOE_LAYOUT_THREADS) {
    int p = p0 + tid;
    int id = p < pairs ? ids[p] : -1;
    int mine = id == e ? 1 : 0;
    if (e == 0 && p < pairs && (id < 0 || id >= experts)) slot_of[p] = -1;
    scan[tid] = mine;
    resin_sync();
    for (int o = 1; o < RESIN_MOE_LAYOUT_THREADS; o <<= 1) {  // inclusive prefix sum
      int v = tid >= o ? scan[tid - o] : 0;
      resin_sync();
      scan[tid] += v;
      resin_sync();
    }
    if (mine) {
      int i = base + scan[tid] - 1;
      if (i < max_rows) {
        pair_of[(long long)e * max_rows + i] = p;
        slot_of[p] = i;
      } else {
        slot_of[p] = -1;
      }
    }
    base += scan[RESIN_MOE_LAYOUT_THREADS - 1];
    resin_sync();
  }
  int n = base < max_rows ? base : max_rows;
  for (int i = n + tid; i < max_rows; i += RESIN_MOE_LAYOUT_THREADS)
    pair_of[(long long)e * max_rows + i] = -1;
  if (tid == 0) counts[e] = n;
}

RESIN_KERNEL void resin_moe_gather_f32(float* __restrict__ xe, const float* __restrict__ x,
                                       const int* __restrict__ pair_of, int k, int experts,
                                       int max_rows, int dim) {
  long long total = (long long)experts * max_rows * dim;
  for (long long i = resin_global_tid(); i < total; i += (long long)RESIN_NTID_X * RESIN_NCTAID_X) {
    long long r = i / dim;
    int d = (int)(i % dim);
    int p = pair_of[r];
    xe[i] = p >= 0 ? x[(long long)(p / k) * dim + d] : 0.0f;
  }
}

// resin_moe_mask_rows routes rows [real[0], rows) of a step to no expert: their ids -1
// and weights 0, so that the masked layout drops them. A CUDA graph fixes a step's row
// count; its padding rows (the rows past this step's real ones, whose count is uploaded
// to real before each replay) then take no expert's room or compute.
// Grid: elementwise over rows·k.
RESIN_KERNEL void resin_moe_mask_rows(int* __restrict__ ids, float* __restrict__ weights,
                                      const int* __restrict__ real, int rows, int k) {
  long long total = (long long)rows * k;
  int n = real[0];
  for (long long t = resin_global_tid(); t < total; t += (long long)RESIN_NTID_X * RESIN_NCTAID_X) {
    if (t / k >= n) {
      ids[t] = -1;
      weights[t] = 0.0f;
    }
  }
}

RESIN_KERNEL void resin_swiglu_clamped_f32(float* __restrict__ out,
                                           const float* __restrict__ gate_up, int rows, int dim,
                                           float limit) {
  long long total = (long long)rows * dim;
  for (long long t = resin_global_tid(); t < total; t += (long long)RESIN_NTID_X * RESIN_NCTAID_X) {
    long long r = t / dim;
    int i = (int)(t % dim);
    const float* gu = gate_up + r * 2 * dim;
    float g = gu[i], u = gu[dim + i];
    g = g > limit ? limit : g;
    u = u < -limit ? -limit : (u > limit ? limit : u);
    out[t] = g / (1.0f + resin_expf(-g)) * u;
  }
}

RESIN_KERNEL void resin_moe_combine_f32(float* __restrict__ out, const float* __restrict__ ye,
                                        const int* __restrict__ ids,
                                        const int* __restrict__ slot_of,
                                        const float* __restrict__ weights,
                                        const float* __restrict__ shared, int tokens, int k,
                                        int experts, int max_rows, int dim) {
  __shared__ int order[RESIN_MOE_MAX_K];
  int t = RESIN_BID_X;
  if (t >= tokens) return;
  if (RESIN_TID_X == 0) {  // the token's slots by (expert, slot), an insertion sort
    for (int j = 0; j < k; j++) {
      int id = ids[(long long)t * k + j];
      int i = j;
      while (i > 0 && ids[(long long)t * k + order[i - 1]] > id) {
        order[i] = order[i - 1];
        i--;
      }
      order[i] = j;
    }
  }
  resin_sync();
  for (int d = RESIN_TID_X; d < dim; d += RESIN_NTID_X) {
    float acc = 0.0f;
    for (int o = 0; o < k; o++) {
      int j = order[o];
      int e = ids[(long long)t * k + j];
      int i = slot_of[(long long)t * k + j];
      if (e < 0 || e >= experts || i < 0) continue;
      acc += ye[((long long)e * max_rows + i) * dim + d] * weights[(long long)t * k + j];
    }
    if (shared) acc += shared[(long long)t * dim + d];
    out[(long long)t * dim + d] = acc;
  }
}
