// quant_linear.cu: linears over weights kept as the checkpoint ships them (DeepSeek-V4-Flash,
// GLM-5.3-Flash): FP8 e4m3 with one float32 scale per 128×128 block, and MXFP4 (two e2m1
// codes per byte, one ue8m0 scale per 32 inputs). Each value's meaning is core/weights'
// DequantFP8 and DequantFP4.
//
// resin_fp8_quant_{f32,bf16}: one block of 128 threads per (row, group of 128 columns).
//   x: [rows, cols]   q: [rows, cols] e4m3 bytes   scale: [ceil(cols/128), scale_ld] float32
//   amax = max |x| over the group (the last group may be partial); s = amax/448 (1 when
//   amax is 0), rounded up to a power of two when pow2 is set (ue8m0 scales, as DeepSeek's
//   act_quant with scale_fmt "ue8m0"); q = e4m3(x / s) rounded to nearest even and
//   saturated to ±448 (NaN → 0x7f); scale[g·scale_ld + row] = s. The scales are
//   outer-dimension-major (row fastest), the layout of cuBLASLt's VEC128_32F operand.
//
// resin_fp8_block_gemm_{f32,bf16}: the fallback of cuBLASLt's block-scaled FP8 GEMM, for
// GPUs and libraries without it, and the grouped FP8 experts over the masked layout. A
// block of 256 threads computes 16 rows × 64 columns of expert blockIdx.z (one plain
// linear: gridDim.z 1, counts null).
//   xq: [experts·m, k] e4m3   xs: [ceil(k/128), xs_ld] float32 (resin_fp8_quant's over
//   the experts·m rows)   wq: [experts, n, k] e4m3   ws: [experts, ceil(n/128),
//   ceil(k/128)] float32 (the checkpoint's weight_scale_inv, row-major)
//   counts: [experts] int32 or null   out: [experts·m, n] float32 or bf16
//   out[e·m + i, j] = Σ_g (Σ_{k in g} e4m3(xq[e·m+i,k])·e4m3(wq[e,j,k])) · xs[g, e·m+i] ·
//   ws[e, j/128, g] for i < counts[e] (every i without counts), 0 past it; each group's
//   sum in float32 over k in order, the groups added in order.
//
// resin_mxfp4_gemm_{f32,bf16}: W4A16 over the masked expert layout (moe_masked.cu), or one
// plain linear (experts 1, counts null). A block of 256 threads computes 16 rows × 64
// columns of one expert; blocks past the expert's count only write zeros.
//   x: [experts, max_rows, k] float32 or bf16; float32 inputs are rounded to bf16 first
//   w: [experts, n, k/2] bytes, element 2c of a row in the low nibble of byte c
//   scale: [experts, n, ceil(k/32)] ue8m0 bytes   counts: [experts] int32 or null
//   out: [experts, max_rows, n] float32
//   out[e, i, j] = Σ_k bf16(x[e,i,k]) · e2m1(w[e,j,k]) · 2^(scale[e,j,k/32]−127) for
//   i < counts[e] (float32, k in order), 0 for the rows past it. k must be even.
#include "prelude.cuh"

#define RESIN_QL_GROUP 128
#define RESIN_QL_TM 16
#define RESIN_QL_TN 64
#define RESIN_QL_THREADS 256
#define RESIN_QL_FP4_TK 64

RESIN_DEVICE float resin_ql_abs(float x) { return resin_u2f(resin_f2u(x) & 0x7fffffffu); }

// resin_e4m3_to_f32 widens an OCP float8 e4m3fn byte (0x7f and 0xff are NaN).
RESIN_DEVICE float resin_e4m3_to_f32(unsigned char v) {
  unsigned sign = (unsigned)(v & 0x80) << 24;
  unsigned e = (v >> 3) & 0xf, m = v & 7;
  if (e == 0xf && m == 7) return resin_u2f(0x7fc00000u);
  if (e == 0) return resin_u2f(sign | resin_f2u((float)m * 0.001953125f));  // m · 2^-9
  return resin_u2f(sign | (e + 120) << 23 | m << 20);
}

// resin_f32_to_e4m3 rounds to the nearest e4m3fn (ties to even), saturating at ±448.
RESIN_DEVICE unsigned char resin_f32_to_e4m3(float x) {
  unsigned u = resin_f2u(x);
  unsigned sign = (u >> 24) & 0x80;
  unsigned a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7f;
  if (a >= 0x43e00000u) return (unsigned char)(sign | 0x7e);  // |x| >= 448
  if (a < 0x3c800000u) {                                       // below 2^-6: subnormal
    float q = resin_u2f(a) * 512.0f;                           // exact: a power of two
    unsigned m = (unsigned)q;
    float frac = q - (float)m;
    if (frac > 0.5f || (frac == 0.5f && (m & 1))) m++;
    return (unsigned char)(sign | m);  // m = 8 is the smallest normal, 0x08
  }
  unsigned e = (a >> 23) - 120;  // rebias 127 → 7
  unsigned man = a & 0x7fffffu;
  unsigned r = e << 3 | man >> 20;
  unsigned rem = man & 0xfffffu;
  if (rem > 0x80000u || (rem == 0x80000u && (r & 1))) r++;
  return (unsigned char)(sign | r);
}

template <typename T>
RESIN_DEVICE void resin_fp8_quant(unsigned char* __restrict__ q, float* __restrict__ scale,
                                  const T* __restrict__ x, int rows, int cols, int scale_ld,
                                  int pow2) {
  __shared__ float red[RESIN_WARP];
  int row = RESIN_BID_X, g = RESIN_BID_Y;
  if (row >= rows) return;
  int c = g * RESIN_QL_GROUP + (int)RESIN_TID_X;
  long long i = (long long)row * cols + c;
  float v = c < cols ? resin_load(x, i) : 0.0f;
  float amax = resin_block_max(c < cols ? resin_ql_abs(v) : 0.0f, red);
  float s = amax > 0.0f ? amax / 448.0f : 1.0f;
  if (pow2 && amax > 0.0f) {
    unsigned b = resin_f2u(s);
    if (b & 0x7fffffu) b = (b + 0x800000u) & 0x7f800000u;
    s = resin_u2f(b);
  }
  if (c < cols) q[i] = resin_f32_to_e4m3(v / s);
  if (RESIN_TID_X == 0) scale[(long long)g * scale_ld + row] = s;
}

RESIN_KERNEL void resin_fp8_quant_f32(unsigned char* __restrict__ q, float* __restrict__ scale,
                                      const float* __restrict__ x, int rows, int cols,
                                      int scale_ld, int pow2) {
  resin_fp8_quant(q, scale, x, rows, cols, scale_ld, pow2);
}

RESIN_KERNEL void resin_fp8_quant_bf16(unsigned char* __restrict__ q, float* __restrict__ scale,
                                       const resin_bf16* __restrict__ x, int rows, int cols,
                                       int scale_ld, int pow2) {
  resin_fp8_quant(q, scale, x, rows, cols, scale_ld, pow2);
}

template <typename T>
RESIN_DEVICE void resin_fp8_block_gemm(T* __restrict__ out, const unsigned char* __restrict__ xq,
                                       const float* __restrict__ xs,
                                       const unsigned char* __restrict__ wq,
                                       const float* __restrict__ ws,
                                       const int* __restrict__ counts, int max_rows, int n,
                                       int k, int xs_ld) {
  __shared__ float xt[RESIN_QL_TM][RESIN_QL_GROUP + 1];
  __shared__ float wt[RESIN_QL_TN][RESIN_QL_GROUP + 1];
  int tid = RESIN_TID_X;
  int e = RESIN_BID_Z;
  int r0 = RESIN_BID_Y * RESIN_QL_TM, c0 = RESIN_BID_X * RESIN_QL_TN;
  int tr = tid / RESIN_QL_TM, tc = tid % RESIN_QL_TM;  // row tr, columns tc + 16·j
  int groups = (k + RESIN_QL_GROUP - 1) / RESIN_QL_GROUP;
  int m = counts ? counts[e] : max_rows;
  m = m < 0 ? 0 : (m > max_rows ? max_rows : m);
  long long row0 = (long long)e * max_rows;  // the expert's first row of xq, xs and out
  out += row0 * n;
  xq += row0 * k;
  xs += row0;
  wq += (long long)e * n * k;
  ws += (long long)e * ((n + RESIN_QL_GROUP - 1) / RESIN_QL_GROUP) * groups;
  if (r0 >= m) {  // an empty tile of the masked layout: zeros, no weights read
    for (int j = 0; j < 4; j++) {
      int gr = r0 + tr, gc = c0 + tc + RESIN_QL_TM * j;
      if (gr < max_rows && gc < n) resin_store(out, (long long)gr * n + gc, 0.0f);
    }
    return;
  }
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int g = 0; g < groups; g++) {
    int k0 = g * RESIN_QL_GROUP;
    for (int e = tid; e < RESIN_QL_TM * RESIN_QL_GROUP; e += RESIN_QL_THREADS) {
      int r = e / RESIN_QL_GROUP, kk = e % RESIN_QL_GROUP;
      int gr = r0 + r, gk = k0 + kk;
      xt[r][kk] = gr < m && gk < k ? resin_e4m3_to_f32(xq[(long long)gr * k + gk]) : 0.0f;
    }
    for (int e = tid; e < RESIN_QL_TN * RESIN_QL_GROUP; e += RESIN_QL_THREADS) {
      int c = e / RESIN_QL_GROUP, kk = e % RESIN_QL_GROUP;
      int gc = c0 + c, gk = k0 + kk;
      wt[c][kk] = gc < n && gk < k ? resin_e4m3_to_f32(wq[(long long)gc * k + gk]) : 0.0f;
    }
    resin_sync();
    int gr = r0 + tr;
    float sx = gr < m ? xs[(long long)g * xs_ld + gr] : 0.0f;
    for (int j = 0; j < 4; j++) {
      int c = tc + RESIN_QL_TM * j, gc = c0 + c;
      if (gr >= m || gc >= n) continue;
      float p = 0.0f;
      for (int kk = 0; kk < RESIN_QL_GROUP; kk++) p += xt[tr][kk] * wt[c][kk];
      acc[j] += p * (sx * ws[(long long)(gc / RESIN_QL_GROUP) * groups + g]);
    }
    resin_sync();
  }
  int gr = r0 + tr;
  for (int j = 0; j < 4; j++) {
    int gc = c0 + tc + RESIN_QL_TM * j;
    if (gr < max_rows && gc < n) resin_store(out, (long long)gr * n + gc, gr < m ? acc[j] : 0.0f);
  }
}

RESIN_KERNEL void resin_fp8_block_gemm_f32(float* __restrict__ out, const unsigned char* __restrict__ xq,
                                           const float* __restrict__ xs,
                                           const unsigned char* __restrict__ wq,
                                           const float* __restrict__ ws,
                                           const int* __restrict__ counts, int max_rows, int n,
                                           int k, int xs_ld) {
  resin_fp8_block_gemm(out, xq, xs, wq, ws, counts, max_rows, n, k, xs_ld);
}

RESIN_KERNEL void resin_fp8_block_gemm_bf16(resin_bf16* __restrict__ out,
                                            const unsigned char* __restrict__ xq,
                                            const float* __restrict__ xs,
                                            const unsigned char* __restrict__ wq,
                                            const float* __restrict__ ws,
                                            const int* __restrict__ counts, int max_rows, int n,
                                            int k, int xs_ld) {
  resin_fp8_block_gemm(out, xq, xs, wq, ws, counts, max_rows, n, k, xs_ld);
}

// resin_e2m1_to_f32 widens the FP4 code in the low four bits of v.
RESIN_DEVICE float resin_e2m1_to_f32(unsigned v) {
  unsigned e = (v >> 1) & 3, m = v & 1;
  float a = e == 0 ? 0.5f * (float)m : (1.0f + 0.5f * (float)m) * (float)(1u << (e - 1));
  return v & 8 ? -a : a;
}

// resin_e8m0_to_f32 widens a ue8m0 scale: 2^(v−127), 0xff NaN, 0x00 the subnormal 2^-127.
RESIN_DEVICE float resin_e8m0_to_f32(unsigned char v) {
  if (v == 0xff) return resin_u2f(0x7fc00000u);
  if (v == 0) return resin_u2f(1u << 22);
  return resin_u2f((unsigned)v << 23);
}

template <typename T>
RESIN_DEVICE void resin_mxfp4_gemm(float* __restrict__ out, const T* __restrict__ x,
                                   const unsigned char* __restrict__ w,
                                   const unsigned char* __restrict__ scale,
                                   const int* __restrict__ counts, int max_rows, int n, int k) {
  __shared__ float xt[RESIN_QL_TM][RESIN_QL_FP4_TK + 1];
  __shared__ float wt[RESIN_QL_TN][RESIN_QL_FP4_TK + 1];
  int tid = RESIN_TID_X;
  int e = RESIN_BID_Z;
  int r0 = RESIN_BID_Y * RESIN_QL_TM, c0 = RESIN_BID_X * RESIN_QL_TN;
  int tr = tid / RESIN_QL_TM, tc = tid % RESIN_QL_TM;
  int rows = counts ? counts[e] : max_rows;
  rows = rows < 0 ? 0 : (rows > max_rows ? max_rows : rows);
  float* o = out + (long long)e * max_rows * n;
  int gr = r0 + tr;
  if (r0 >= rows) {  // an empty tile of the masked layout: zeros, no weights read
    for (int j = 0; j < 4; j++) {
      int gc = c0 + tc + RESIN_QL_TM * j;
      if (gr < max_rows && gc < n) o[(long long)gr * n + gc] = 0.0f;
    }
    return;
  }
  const T* xe = x + (long long)e * max_rows * k;
  long long half = k / 2, sk = (k + 31) / 32;
  const unsigned char* we = w + (long long)e * n * half;
  const unsigned char* se = scale + (long long)e * n * sk;
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int k0 = 0; k0 < k; k0 += RESIN_QL_FP4_TK) {
    for (int i = tid; i < RESIN_QL_TM * RESIN_QL_FP4_TK; i += RESIN_QL_THREADS) {
      int r = i / RESIN_QL_FP4_TK, kk = i % RESIN_QL_FP4_TK;
      int rr = r0 + r, gk = k0 + kk;
      xt[r][kk] = rr < rows && gk < k ? resin_bf2f(resin_f2bf(resin_load(xe, (long long)rr * k + gk))) : 0.0f;
    }
    for (int i = tid; i < RESIN_QL_TN * RESIN_QL_FP4_TK / 2; i += RESIN_QL_THREADS) {
      int c = i / (RESIN_QL_FP4_TK / 2), b = i % (RESIN_QL_FP4_TK / 2);
      int gc = c0 + c, gk = k0 + 2 * b;
      float lo = 0.0f, hi = 0.0f;
      if (gc < n && gk < k) {
        unsigned char byte = we[(long long)gc * half + gk / 2];
        float s = resin_e8m0_to_f32(se[(long long)gc * sk + gk / 32]);
        lo = resin_e2m1_to_f32(byte & 0xf) * s;
        hi = resin_e2m1_to_f32(byte >> 4) * s;
      }
      wt[c][2 * b] = lo;
      wt[c][2 * b + 1] = hi;
    }
    resin_sync();
    for (int j = 0; j < 4; j++) {
      int c = tc + RESIN_QL_TM * j;
      float a = acc[j];
      for (int kk = 0; kk < RESIN_QL_FP4_TK; kk++) a += xt[tr][kk] * wt[c][kk];
      acc[j] = a;
    }
    resin_sync();
  }
  for (int j = 0; j < 4; j++) {
    int gc = c0 + tc + RESIN_QL_TM * j;
    if (gr < max_rows && gc < n) o[(long long)gr * n + gc] = gr < rows ? acc[j] : 0.0f;
  }
}

RESIN_KERNEL void resin_mxfp4_gemm_f32(float* __restrict__ out, const float* __restrict__ x,
                                       const unsigned char* __restrict__ w,
                                       const unsigned char* __restrict__ scale,
                                       const int* __restrict__ counts, int max_rows, int n, int k) {
  resin_mxfp4_gemm(out, x, w, scale, counts, max_rows, n, k);
}

RESIN_KERNEL void resin_mxfp4_gemm_bf16(float* __restrict__ out, const resin_bf16* __restrict__ x,
                                        const unsigned char* __restrict__ w,
                                        const unsigned char* __restrict__ scale,
                                        const int* __restrict__ counts, int max_rows, int n, int k) {
  resin_mxfp4_gemm(out, x, w, scale, counts, max_rows, n, k);
}

// resin_cast_bf16: out[i] = bf16(x[i]) rounded to nearest even, for the bf16 linears'
// float32 inputs. x: [n] float32   out: [n] bf16
RESIN_KERNEL void resin_cast_bf16(resin_bf16* __restrict__ out, const float* __restrict__ x, long long n) {
  for (long long i = resin_global_tid(); i < n; i += (long long)RESIN_NTID_X * RESIN_NCTAID_X) out[i] = resin_f2bf(x[i]);
}
