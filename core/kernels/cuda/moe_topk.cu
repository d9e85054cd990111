// moe_topk.cu: MoE routing, as ref.MoETopK.
//   logits: [tokens, experts]  bias: [experts] or null  weights, ids: [tokens, k]
//   scoring 0: softmax over experts; 1: sigmoid per expert. Experts are chosen by
//   score + bias, the lower index first on a tie; the weight is the unbiased score,
//   divided by the chosen scores' sum when renorm is set, then multiplied by scale.
//   groups > 1: only the group_topk groups whose two best (biased) scores sum highest
//   are eligible (DeepSeek-V3's group-limited routing); groups <= 32.
// Grid: tokens blocks; block: 32 threads (one warp); experts <= RESIN_MOE_MAX_EXPERTS.
#include "prelude.cuh"
// A taken expert's choice: NaN, which resin_better never picks, so a row's k experts are
// distinct even when its scores are NaN (a padding row of garbage: -INF would tie with the
// NaN scores' -INF and be picked again, and duplicate ids overflow the masked layout's
// room of one pair per row, dropping another row's pair).
#define RESIN_NAN_TAKEN resin_u2f(0x7fc00000u)

#define RESIN_MOE_MAX_EXPERTS 1024

RESIN_KERNEL void resin_moe_topk(float* __restrict__ weights, int* __restrict__ ids,
                                 const float* __restrict__ logits, const float* __restrict__ bias,
                                 int tokens, int experts, int k, int scoring, int renorm,
                                 float scale, int groups, int group_topk) {
  __shared__ float score[RESIN_MOE_MAX_EXPERTS];
  __shared__ float choice[RESIN_MOE_MAX_EXPERTS];
  int t = RESIN_BID_X;
  if (t >= tokens) return;
  unsigned lane = RESIN_TID_X;
  const float* row = logits + (long long)t * experts;
  if (scoring == 0) {
    float m = -RESIN_INF;
    for (int e = lane; e < experts; e += RESIN_WARP) m = resin_fmaxf(m, row[e]);
    m = resin_warp_max(m);
    float s = 0.0f;
    for (int e = lane; e < experts; e += RESIN_WARP) {
      float x = resin_expf(row[e] - m);
      score[e] = x;
      s += x;
    }
    s = resin_warp_sum(s);
    for (int e = lane; e < experts; e += RESIN_WARP) score[e] /= s;
  } else {
    for (int e = lane; e < experts; e += RESIN_WARP) score[e] = 1.0f / (1.0f + resin_expf(-row[e]));
  }
  for (int e = lane; e < experts; e += RESIN_WARP) {
    float v = score[e] + (bias ? bias[e] : 0.0f);
    choice[e] = v != v ? -RESIN_INF : v;  // a NaN score is the worst choice, still pickable
  }
  resin_sync();
  if (groups > 1) {
    // Lane g scores group g by the sum of its two best choices.
    int size = experts / groups;
    float gs = -RESIN_INF;
    if ((int)lane < groups) {
      float a = -RESIN_INF, b2 = -RESIN_INF;
      for (int e = lane * size; e < (int)(lane + 1) * size; e++) {
        float v = choice[e];
        if (v > a) {
          b2 = a;
          a = v;
        } else if (v > b2) {
          b2 = v;
        }
      }
      gs = a + (size == 1 ? 0.0f : b2);
    }
    // Keep the group_topk best groups (lower index first on a tie).
    bool keep = false;
    for (int j = 0; j < group_topk; j++) {
      float bv = (int)lane < groups && !keep ? gs : -RESIN_INF;
      int bi = (int)lane < groups && !keep ? (int)lane : 0x7fffffff;
      resin_warp_argmax(&bv, &bi);
      if ((int)lane == bi) keep = true;
    }
    resin_sync();
    if ((int)lane < groups && !keep)
      for (int e = lane * size; e < (int)(lane + 1) * size; e++) choice[e] = -RESIN_INF;
    resin_sync();
  }
  float sum = 0.0f;
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
    float w = score[bi];
    sum += w;
    if (lane == 0) {
      ids[(long long)t * k + j] = bi;
      weights[(long long)t * k + j] = w;
      choice[bi] = RESIN_NAN_TAKEN;
    }
    resin_sync();
  }
  if (lane == 0) {
    for (int j = 0; j < k; j++) {
      float w = weights[(long long)t * k + j];
      if (renorm && sum > 0.0f) w /= sum;
      weights[(long long)t * k + j] = w * scale;
    }
  }
}
