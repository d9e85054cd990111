// kda.cu: Kimi Delta Attention's recurrence on the device, in its two forms. Per head h,
// with q, k already l2-normalised (q scaled) and g a per-key-channel log-decay:
//
//   q, k, g: [tokens, heads, dk]   v, out: [tokens, heads, dv]   beta: [tokens, heads]
//   state:   [heads, dk, dv] fp32, updated in place (carried across chunks and calls)
//
//   S ← diag(exp(g_t))·S;  S ← S + k_t ⊗ β_t·(v_t − Sᵀk_t);  out_t = Sᵀq_t
//
// Both forms are column-parallel: the recurrence never mixes two value columns j of S,
// so a thread owns one column (a block a tile of columns of one head; grid (heads,
// ceil(dv / blockDim.x))) and only the per-token (or per-chunk) key-side terms are shared.
//
// glm5flash_kda_step is the recurrent form (decode, and verification of drafts): tokens
// one after another, for seqs sequences at once (grid z; a batched decode is one launch).
// Sequence b's tokens are rows b·tokens.. of q, k, v, g, beta and out, and its state is
// state[slots[b]] (state[b] when slots is null) in a pool of [heads, dk, dv] states, or
// with offsets non-null the state at state + offsets[b] floats (states anywhere, kvslab
// pages say: a graph reads the table, uploaded before each replay); with
// snapshots non-null the state after its token t is also written to
// snapshots[b·tokens + t] so a runner can restore the state after the last accepted
// draft. Dynamic shared memory: 3·dk floats. Reference: ref.KDAStep.
//
// glm5flash_kda_chunked is the chunked form (prefill), chunk tokens at a time from the
// chunk's start state S₀, with G_t the cumulative log-decay inside the chunk (fp64, as the
// reference) and Γ_t = exp(G_t):
//
//   u_s   = β_s·(v_s − S₀ᵀ(Γ_s⊙k_s) − Σ_{r<s} A_sr·u_r),   A_sr = Σ_c k_s[c]·e^{G_s[c]−G_r[c]}·k_r[c]
//   out_t = S₀ᵀ(Γ_t⊙q_t) + Σ_{s≤t} W_ts·u_s,                W_ts = Σ_c q_t[c]·e^{G_t[c]−G_s[c]}·k_s[c]
//   S     ← diag(Γ_C)·S₀ + Σ_s (e^{G_C−G_s}⊙k_s) ⊗ u_s
//
// Every block computes its head's G, Γ, the decays to the chunk end and the pair terms
// A, W (each block of a head the same, by the same threads' loops), then its columns' u,
// outputs and next state. Dynamic shared memory (KDAChunkShared in the Go launcher):
// chunk·dk doubles, then 2·chunk·dk + 2·chunk² + chunk·blockDim.x floats. Several
// sequences of different lengths run in one launch (grid z; a ragged prefill): with
// seq_start non-null sequence b is rows seq_start[b] to seq_start[b+1] (tokens is then
// their total) and its state is state[slots[b]] (state[b] when slots is null).
// Reference: ref.KDAChunked.
#include "prelude.cuh"

RESIN_KERNEL void glm5flash_kda_step(float* __restrict__ out, float* __restrict__ state,
                                     const int* __restrict__ slots,
                                     const long long* __restrict__ offsets, float* __restrict__ snapshots,
                                     const float* __restrict__ q, const float* __restrict__ k,
                                     const float* __restrict__ v, const float* __restrict__ g,
                                     const float* __restrict__ beta, int tokens, int heads, int dk,
                                     int dv) {
  extern __shared__ float kda_step_smem[];
  float* sq = kda_step_smem;
  float* sk = sq + dk;
  float* sd = sk + dk;
  int h = RESIN_BID_X;
  int j = RESIN_BID_Y * RESIN_NTID_X + RESIN_TID_X;
  int b = RESIN_BID_Z;
  long long slot = slots ? slots[b] : b;
  long long hs = (long long)h * dk * dv, per = (long long)heads * dk * dv;
  float* S = (offsets ? state + offsets[b] : state + slot * per) + hs;
  for (int t = 0; t < tokens; t++) {
    long long row = (long long)b * tokens + t;
    long long o = row * heads + h;
    resin_sync();  // the previous token's reads of sq, sk, sd are done
    for (int i = RESIN_TID_X; i < dk; i += RESIN_NTID_X) {
      sq[i] = q[o * dk + i];
      sk[i] = k[o * dk + i];
      sd[i] = resin_expf(g[o * dk + i]);
    }
    resin_sync();
    if (j >= dv) continue;
    float mem = 0.0f;
    for (int i = 0; i < dk; i++) {
      float s = S[(long long)i * dv + j] * sd[i];
      S[(long long)i * dv + j] = s;
      mem += s * sk[i];
    }
    float delta = beta[o] * (v[o * dv + j] - mem);
    float acc = 0.0f;
    float* snap = snapshots ? snapshots + row * per + hs : 0;
    for (int i = 0; i < dk; i++) {
      float s = S[(long long)i * dv + j] + sk[i] * delta;
      S[(long long)i * dv + j] = s;
      acc += s * sq[i];
      if (snap) snap[(long long)i * dv + j] = s;
    }
    out[o * dv + j] = acc;
  }
}

RESIN_KERNEL void glm5flash_kda_chunked(float* __restrict__ out, float* __restrict__ state,
                                        const float* __restrict__ q, const float* __restrict__ k,
                                        const float* __restrict__ v, const float* __restrict__ g,
                                        const float* __restrict__ beta, const int* __restrict__ seq_start,
                                        const int* __restrict__ slots, int tokens, int chunk,
                                        int heads, int dk, int dv) {
  extern __shared__ double kda_chunk_smem[];
  double* G = kda_chunk_smem;                 // [chunk, dk] cumulative log-decays
  float* gam = (float*)(G + (long long)chunk * dk);  // [chunk, dk] exp(G_t)
  float* dec = gam + chunk * dk;              // [chunk, dk] exp(G_C − G_t)
  float* A = dec + chunk * dk;                // [chunk, chunk] s < t
  float* W = A + chunk * chunk;               // [chunk, chunk] s ≤ t
  float* u = W + chunk * chunk;               // [chunk, blockDim.x] this thread's column
  int h = RESIN_BID_X, tid = RESIN_TID_X, nt = RESIN_NTID_X;
  int j = RESIN_BID_Y * nt + tid;
  int b = RESIN_BID_Z;
  long long slot = slots ? slots[b] : b;
  int first = seq_start ? seq_start[b] : 0;
  int n = seq_start ? seq_start[b + 1] - first : tokens;
  float* S = state + (slot * heads + h) * (long long)dk * dv;
  // Rows of this sequence: t0 and t below are its own indices, first + t the batch's.
  q += (long long)first * heads * dk;
  k += (long long)first * heads * dk;
  g += (long long)first * heads * dk;
  v += (long long)first * heads * dv;
  out += (long long)first * heads * dv;
  beta += (long long)first * heads;
  for (int t0 = 0; t0 < n; t0 += chunk) {
    int C = n - t0 < chunk ? n - t0 : chunk;
    resin_sync();  // the previous chunk's reads of the shared terms are done
    for (int c = tid; c < dk; c += nt) {
      double acc = 0.0;
      for (int t = 0; t < C; t++) {
        acc += (double)g[((long long)(t0 + t) * heads + h) * dk + c];
        G[t * dk + c] = acc;
      }
    }
    resin_sync();
    int last = (C - 1) * dk;
    for (int i = tid; i < C * dk; i += nt) {
      gam[i] = resin_expf((float)G[i]);
      dec[i] = resin_expf((float)(G[last + i % dk] - G[i]));
    }
    for (int p = tid; p < C * C; p += nt) {
      int t = p / C, s = p % C;
      if (s > t) continue;
      const float* qt = q + ((long long)(t0 + t) * heads + h) * dk;
      const float* kt = k + ((long long)(t0 + t) * heads + h) * dk;
      const float* ks = k + ((long long)(t0 + s) * heads + h) * dk;
      if (s == t) {
        float w = 0.0f;
        for (int c = 0; c < dk; c++) w += qt[c] * kt[c];
        W[t * chunk + t] = w;
        continue;
      }
      float a = 0.0f, w = 0.0f;
      for (int c = 0; c < dk; c++) {
        float e = resin_expf((float)(G[t * dk + c] - G[s * dk + c]));
        a += (kt[c] * e) * ks[c];
        w += (qt[c] * e) * ks[c];
      }
      A[t * chunk + s] = a;
      W[t * chunk + s] = w;
    }
    resin_sync();
    if (j >= dv) continue;
    // u: forward substitution, this column.
    for (int s = 0; s < C; s++) {
      long long o = (long long)(t0 + s) * heads + h;
      const float* ks = k + o * dk;
      float us = v[o * dv + j];
      for (int c = 0; c < dk; c++) us += -(gam[s * dk + c] * ks[c]) * S[(long long)c * dv + j];
      for (int r = 0; r < s; r++) us += -A[s * chunk + r] * u[r * nt + tid];
      u[s * nt + tid] = us * beta[o];
    }
    // Outputs.
    for (int t = 0; t < C; t++) {
      long long o = (long long)(t0 + t) * heads + h;
      const float* qt = q + o * dk;
      float acc = 0.0f;
      for (int c = 0; c < dk; c++) acc += (gam[t * dk + c] * qt[c]) * S[(long long)c * dv + j];
      for (int s = 0; s <= t; s++) acc += W[t * chunk + s] * u[s * nt + tid];
      out[o * dv + j] = acc;
    }
    // State at the chunk's end.
    for (int c = 0; c < dk; c++) {
      float n = gam[last + c] * S[(long long)c * dv + j];
      for (int s = 0; s < C; s++) {
        float ksc = k[((long long)(t0 + s) * heads + h) * dk + c];
        n += (dec[s * dk + c] * ksc) * u[s * nt + tid];
      }
      S[(long long)c * dv + j] = n;
    }
  }
}
