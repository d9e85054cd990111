// sampling.cu: token sampling on the device, one block per logits row, so that only the
// chosen token ids and their log probabilities go back to the host. It follows
// core/engine's CPU Sampler (Sampler.choose and Sampler.Sample) step for step:
//   lse      = log-sum-exp of the raw logits; logprob(tok) = logit(tok) - lse
//   greedy   (temperature == 0 or top_k == 1): the first maximal logit (NaN skipped; a
//            row of NaN only gives token 0, the CPU's argmax, in every mode)
//   otherwise, over the candidates:
//     order    when top_k > 0 or 0 < top_p < 1: logits descending, ties (-0 and +0
//              among them) by lower id (the CPU's sort); else vocabulary order (the CPU
//              does not sort then)
//     top-k    the first top_k candidates in that order (top_k >= vocab: all)
//     weights  w = exp((logit - max) / temperature) (the best candidate has w = 1, a +inf
//              logit too; NaN logits have none); 1/temperature is computed in double and
//              capped at FLT_MAX, so a temperature below ~3e-39 is the limit of tiny ones
//              (the CPU's float64 1/T), not a NaN weight
//     min-p    w < min_p drops a candidate (min_p times the best weight, 1)
//     top-p    keep the shortest prefix whose weight reaches top_p times the kept sum
//     draw     u = uniform(seed, pos) in [0, 1) (engine's uniform: the splitmix64 finalizer
//              of seed ^ mix(pos), a counter-based generator keyed by (seed, position), so
//              a seed reproduces a token whatever the batch); the token is the first
//              candidate in order whose running weight exceeds u times the kept sum.
//   top-n    the n most likely tokens by raw logprob, ties by lower id (the CPU's order).
// Weights are summed in fixed point (units of 2^-40, 64-bit integers), so every sum is
// exact and independent of thread order: a row gives the same token on every run. The
// CPU sums float64 in index order, so a draw landing within rounding of a boundary between
// two candidates may pick the neighbour; greedy choices and logprob top-n are the same.
// Token masks (structured outputs): a row with mask_start[r] >= 0 reads its grammar's
// bitmask at token_mask + mask_start[r] (mask_words words; bit t%32 of word t/32 set when
// token t may be sampled): the tokens it does not allow are -inf for the choice (greedy,
// the candidates, their weights), as engine.Sampler's applyMask; lse, the logprobs and
// the top-n stay those of the raw logits. mask_start[r] < 0, or no mask_start at all:
// the row is not masked. When every token a mask allows has a -inf or NaN logit, the
// allowed tokens weigh alike (each is 0 for the choice: greedy takes the first allowed,
// a draw picks among them), as applyMask does: the draw stays within the grammar.
// Logit bias, penalties and the min-tokens mask are not applied here: a runner adjusts
// the logits before, or samples such rows on the CPU.
//   logits: [rows, logits_stride] float32 (vocab used)  params: [rows] resin_sample_params
//   token_mask: [mask_words per masked row] uint32  mask_start: [rows] int32 or null
//   tokens: [rows] int32  logprobs: [rows] float32
//   top_ids, top_logprobs: [rows, max_top]; entries past a row's count are -1 and 0
// Grid: rows blocks; block: RESIN_SAMPLE_THREADS threads.
#include "prelude.cuh"

#define RESIN_SAMPLE_THREADS 512
#define RESIN_SAMPLE_MAX_TOP 32  // most top-n alternatives per row
#define RESIN_SAMPLE_ONE 1099511627776.0f  // 2^40: the fixed-point unit of a weight

// resin_sample_params is core/kernels/cuda.SampleParams, 32 bytes.
struct resin_sample_params {
  float temperature;        // 0: greedy
  float top_p;              // in (0, 1) to apply
  float min_p;              // > 0 to apply
  int top_k;                // > 0 to apply
  unsigned long long seed;  // the request's seed
  int pos;                  // position of the sampled token
  int logprobs;             // top-n alternatives wanted (<= 0: none)
};

RESIN_DEVICE unsigned long long resin_mix64(unsigned long long x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// resin_uniform is engine's uniform(seed, pos): a double in [0, 1).
RESIN_DEVICE double resin_uniform(unsigned long long seed, int pos) {
  unsigned long long x = resin_mix64(seed ^ resin_mix64((unsigned long long)(long long)pos));
  return (double)(x >> 11) / 9007199254740992.0;
}

// resin_desc_bits maps a logit to 32 bits that sort ascending as the logits sort descending;
// -0 and +0 map alike (they are equal logits: the lower id goes first); NaN sorts last.
RESIN_DEVICE unsigned resin_desc_bits(float v) {
  if (v != v) return 0xffffffffu;
  unsigned u = v == 0.0f ? 0u : resin_f2u(v);
  unsigned asc = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return ~asc;
}

// What a selection counts per candidate.
#define RESIN_COUNT 0
#define RESIN_MASS 1

struct resin_sampler {
  const float* row;
  const unsigned* mask;   // the row's token mask, or null
  int mask_words;         // its words
  int flat;               // the allowed tokens are 0 (none has a usable logit)
  int vocab;
  int sorted;             // keys are (desc_bits << 32 | id), else id
  float max_logit;        // the row's largest logit
  float inv_t;            // 1 / temperature
  float min_p;            // weights below it are 0
  unsigned long long* hist;  // [256] per-bin count or mass
  unsigned* count;        // [256] candidates per bin
  int* last;              // [256] some id of the bin
  unsigned long long* group;  // [32] sums of 8 bins
  unsigned long long* result;  // [4] the selection's outcome
};

// resin_masked is logit i of row for the choice: -inf where mask (words long, when not
// null) does not allow token i; ids past the mask are not allowed (engine.Sampler's rule);
// 0 for an allowed token when flat (no allowed token has a usable logit).
RESIN_DEVICE float resin_masked(const float* row, const unsigned* mask, int words, int flat, int i) {
  if (mask && ((i >> 5) >= words || !((mask[i >> 5] >> (i & 31)) & 1u))) return -RESIN_INF;
  return flat ? 0.0f : row[i];
}

RESIN_DEVICE unsigned long long resin_key(const resin_sampler& s, int i, float v) {
  return s.sorted ? ((unsigned long long)resin_desc_bits(v) << 32) | (unsigned)i
                  : (unsigned long long)(unsigned)i;
}

// resin_weight is a candidate's fixed-point weight (0 under min-p, for -inf and NaN).
RESIN_DEVICE unsigned long long resin_weight(const resin_sampler& s, float v) {
  if (v != v) return 0;
  // The maximum itself has weight 1, also when it is +inf (inf - inf would be NaN).
  float w = v == s.max_logit ? 1.0f : resin_expf((v - s.max_logit) * s.inv_t);
  if (!(w >= s.min_p)) return 0;
  return (unsigned long long)(w * RESIN_SAMPLE_ONE);
}

// resin_select returns the smallest key K among candidates with key <= bound such that
// their summed count (or weight) over keys <= K reaches target (>= 1), and in *through
// that sum; ~0 and the total when the candidates do not reach it. It is a radix select
// over the key bytes, most significant first: each pass histograms the candidates that
// share the prefix found so far and keeps the bin where the running sum crosses the target.
// Every thread of the block must call it.
RESIN_DEVICE unsigned long long resin_select(const resin_sampler& s, int mode,
                                             unsigned long long bound, unsigned long long target,
                                             unsigned long long* through) {
  unsigned long long prefix = 0, mask = 0, below = 0;
  int top = s.sorted ? 56 : 24;
  for (int shift = top; shift >= 0; shift -= 8) {
    for (int j = RESIN_TID_X; j < 256; j += RESIN_NTID_X) {
      s.hist[j] = 0;
      s.count[j] = 0;
      s.last[j] = -1;
    }
    resin_sync();
    for (int i = RESIN_TID_X; i < s.vocab; i += RESIN_NTID_X) {
      float v = resin_masked(s.row, s.mask, s.mask_words, s.flat, i);
      unsigned long long k = resin_key(s, i, v);
      if (k > bound || (k & mask) != prefix) continue;
      unsigned long long val = mode == RESIN_MASS ? resin_weight(s, v) : 1ull;
      int bin = (int)((k >> shift) & 255u);
      if (val) resin_atomic_add_u64(&s.hist[bin], val);
      resin_atomic_add_u32(&s.count[bin], 1u);
      resin_atomic_max_i32(&s.last[bin], i);
    }
    resin_sync();
    if (RESIN_TID_X < 32) {
      unsigned long long g = 0;
      for (int j = 0; j < 8; j++) g += s.hist[RESIN_TID_X * 8 + j];
      s.group[RESIN_TID_X] = g;
    }
    resin_sync();
    if (RESIN_TID_X == 0) {
      unsigned long long need = target - below, acc = 0;
      int bin = -1;
      for (int gi = 0; gi < 32 && bin < 0; gi++) {
        if (acc + s.group[gi] < need) {
          acc += s.group[gi];
          continue;
        }
        for (int j = gi * 8; j < gi * 8 + 8; j++) {
          if (acc + s.hist[j] >= need) {
            bin = j;
            break;
          }
          acc += s.hist[j];
        }
      }
      s.result[0] = (unsigned long long)(long long)bin;
      s.result[1] = acc;
      s.result[2] = bin >= 0 ? s.hist[bin] : 0;
      s.result[3] = bin >= 0 && s.count[bin] == 1 ? (unsigned long long)(unsigned)s.last[bin] : ~0ull;
    }
    resin_sync();
    long long bin = (long long)s.result[0];
    unsigned long long acc = s.result[1], mass = s.result[2], only = s.result[3];
    resin_sync();  // result[] is rewritten by the next pass or selection
    if (bin < 0) {
      *through = below + acc;
      return ~0ull;
    }
    below += acc;
    prefix |= (unsigned long long)bin << shift;
    mask |= 255ull << shift;
    if (only != ~0ull || shift == 0) {
      *through = below + mass;
      return only != ~0ull ? resin_key(s, (int)only, resin_masked(s.row, s.mask, s.mask_words, s.flat, (int)only)) : prefix;
    }
  }
  *through = below;  // not reached: the last pass returns
  return prefix;
}

// resin_block_argmax returns the first maximal logit's id (NaN skipped; -1 for a row of
// NaN) and its value (-inf for a row of NaN) in every thread; with a mask (not null), of
// the row as resin_masked gives it (flat too).
RESIN_DEVICE int resin_block_argmax(const float* row, const unsigned* mask, int words, int flat, int vocab,
                                    float* sv, int* si, float* best) {
  float bv = -RESIN_INF;
  int bi = 0x7fffffff;
  for (int i = RESIN_TID_X; i < vocab; i += RESIN_NTID_X) {
    float v = resin_masked(row, mask, words, flat, i);
    if (resin_better(v, i, bv, bi)) {
      bv = v;
      bi = i;
    }
  }
  resin_warp_argmax(&bv, &bi);
  unsigned lane = RESIN_TID_X % RESIN_WARP, warp = RESIN_TID_X / RESIN_WARP;
  resin_sync();
  if (lane == 0) {
    sv[warp] = bv;
    si[warp] = bi;
  }
  resin_sync();
  unsigned warps = RESIN_NTID_X / RESIN_WARP;
  bv = lane < warps ? sv[lane] : -RESIN_INF;
  bi = lane < warps ? si[lane] : 0x7fffffff;
  resin_warp_argmax(&bv, &bi);
  *best = bv;
  return bi == 0x7fffffff ? -1 : bi;
}

RESIN_KERNEL void resin_sample(int* __restrict__ tokens, float* __restrict__ logprobs,
                               int* __restrict__ top_ids, float* __restrict__ top_logprobs,
                               const float* __restrict__ logits,
                               const resin_sample_params* __restrict__ params, int vocab,
                               long long logits_stride, int max_top,
                               const unsigned* __restrict__ token_mask,
                               const int* __restrict__ mask_start, int mask_words) {
  __shared__ unsigned long long hist[256];
  __shared__ unsigned count[256];
  __shared__ int last[256];
  __shared__ unsigned long long group[32];
  __shared__ unsigned long long result[4];
  __shared__ float sv[32];
  __shared__ int si[32];
  __shared__ unsigned long long top_keys[RESIN_SAMPLE_MAX_TOP];
  __shared__ unsigned top_n;
  int r = RESIN_BID_X;
  const float* row = logits + (long long)r * logits_stride;
  resin_sample_params prm = params[r];

  const unsigned* mask = nullptr;
  if (mask_start && mask_start[r] >= 0) mask = token_mask + mask_start[r];

  float mx;
  int best = resin_block_argmax(row, nullptr, 0, 0, vocab, sv, si, &mx);
  float sum = 0.0f;
  if (best >= 0)
    for (int i = RESIN_TID_X; i < vocab; i += RESIN_NTID_X)
      if (row[i] == row[i]) sum += resin_expf(row[i] - mx);
  sum = resin_block_sum(sum, sv);
  float lse = mx + resin_logf(sum);

  // The choice's maximum: the raw one, or the masked row's (its own argmax) with a mask.
  // A mask whose allowed tokens are all -inf or NaN (cmx -inf): they weigh alike (flat).
  float cmx = mx;
  int cbest = best;
  int flat = 0;
  if (mask) {
    cbest = resin_block_argmax(row, mask, mask_words, 0, vocab, sv, si, &cmx);
    float fmx = 0.0f;
    int fbest = cmx == -RESIN_INF ? resin_block_argmax(row, mask, mask_words, 1, vocab, sv, si, &fmx) : -1;
    if (fbest >= 0 && fmx == 0.0f) {  // (a mask allowing no token stays all -inf, as on the CPU)
      flat = 1;
      cbest = fbest;
      cmx = 0.0f;
    }
  }

  resin_sampler s;
  s.row = row;
  s.mask = mask;
  s.mask_words = mask_words;
  s.flat = flat;
  s.vocab = vocab;
  s.max_logit = cmx;
  // 1/T in double, capped: in float32 it overflows to +inf below T ~ 3e-39.
  double inv_t = prm.temperature > 0.0f ? 1.0 / (double)prm.temperature : 0.0;
  s.inv_t = inv_t < 3.4028234663852886e38 ? (float)inv_t : 3.4028234663852886e38f;
  s.min_p = prm.min_p > 0.0f ? prm.min_p : 0.0f;
  s.hist = hist;
  s.count = count;
  s.last = last;
  s.group = group;
  s.result = result;

  int tok = cbest >= 0 ? cbest : 0;  // a row of NaN: token 0, as the CPU's argmax
  bool top_p = prm.top_p > 0.0f && prm.top_p < 1.0f;
  if (cbest >= 0 && prm.temperature != 0.0f && prm.top_k != 1) {
    s.sorted = prm.top_k > 0 || top_p;
    unsigned long long bound = ~0ull, kept;
    if (prm.top_k > 0 && prm.top_k < vocab)
      bound = resin_select(s, RESIN_COUNT, ~0ull, (unsigned long long)prm.top_k, &kept);
    // The kept weight: a selection whose target no candidate set reaches returns the total.
    resin_select(s, RESIN_MASS, bound, ~0ull, &kept);
    if (top_p && kept > 0) {
      double x = (double)prm.top_p * (double)kept;  // the CPU's acc >= top_p*sum, in units
      unsigned long long need = (unsigned long long)x;
      if ((double)need < x) need++;
      bound = resin_select(s, RESIN_MASS, bound, need > 0 ? need : 1ull, &kept);
    }
    if (kept > 0) {
      unsigned long long u = (unsigned long long)(resin_uniform(prm.seed, prm.pos) * (double)kept);
      if (u >= kept) u = kept - 1;
      unsigned long long dummy;
      unsigned long long k = resin_select(s, RESIN_MASS, bound, u + 1, &dummy);
      tok = (int)(unsigned)(k & 0xffffffffull);
    }
  }
  if (RESIN_TID_X == 0) {
    tokens[r] = tok;
    logprobs[r] = row[tok] - lse;  // NaN for a row of NaN
  }

  // Top-n alternatives by raw logprob.
  int n = prm.logprobs < max_top ? prm.logprobs : max_top;
  if (n > vocab) n = vocab;
  int* ids = top_ids + (long long)r * max_top;
  float* lps = top_logprobs + (long long)r * max_top;
  for (int j = RESIN_TID_X; j < max_top; j += RESIN_NTID_X) {
    ids[j] = -1;
    lps[j] = 0.0f;
  }
  if (n <= 0) return;
  if (best < 0) {  // a row of NaN: ids 0.. in order with NaN logprobs, as the CPU lists them
    resin_sync();    // after the -1s above (best is the block's: every thread is here)
    if (RESIN_TID_X == 0)
      for (int a = 0; a < n; a++) {
        ids[a] = a;
        lps[a] = row[a] - lse;
      }
    return;
  }
  s.sorted = 1;
  s.mask = nullptr;  // the alternatives are the model's, unmasked
  s.flat = 0;
  unsigned long long dummy;
  unsigned long long bound = resin_select(s, RESIN_COUNT, ~0ull, (unsigned long long)n, &dummy);
  if (RESIN_TID_X == 0) top_n = 0;
  resin_sync();
  for (int i = RESIN_TID_X; i < vocab; i += RESIN_NTID_X) {
    unsigned long long k = resin_key(s, i, row[i]);
    if (k <= bound) {
      unsigned at = resin_atomic_add_u32(&top_n, 1u);
      if (at < RESIN_SAMPLE_MAX_TOP) top_keys[at] = k;
    }
  }
  resin_sync();
  if (RESIN_TID_X == 0) {
    int m = top_n < (unsigned)n ? (int)top_n : n;
    for (int a = 1; a < m; a++)  // insertion sort: at most RESIN_SAMPLE_MAX_TOP keys
      for (int b = a; b > 0 && top_keys[b] < top_keys[b - 1]; b--) {
        unsigned long long t = top_keys[b];
        top_keys[b] = top_keys[b - 1];
        top_keys[b - 1] = t;
      }
    for (int a = 0; a < m; a++) {
      int id = (int)(unsigned)(top_keys[a] & 0xffffffffull);
      ids[a] = id;
      lps[a] = row[id] - lse;
    }
  }
}
