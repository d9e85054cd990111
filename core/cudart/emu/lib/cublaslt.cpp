// cublaslt.cpp: the emulated cuBLASLt, the calls core/cudart binds (blas.go, gemm.go,
// gemm_fp8.go): D = alpha·op(A)·op(B) + beta·C on column-major layouts, with A and B in
// f32, bf16 or f16, float32 compute and scalars (CUBLAS_COMPUTE_32F), C and D in f32 or
// A's type. Each output element is one float32 sum over k in order, then alpha and beta
// are applied and the result rounded to D's type (to nearest even).
//
// FP8 (CUDA_R_8F_E4M3 A and B, op(A) = Aᵀ and op(B) = B as cuBLASLt's FP8 GEMMs require,
// C = D in bf16 or f32) takes each slot's scale mode and pointer (cuBLAS 12.9):
//   SCALAR_32F (0): one float32, 1 when the pointer is null;
//   VEC128_32F (4): one float32 per 128 consecutive k of each row i of op(A) (column j of
//     op(B)), at scale[(p/128)·m + i] (n + j for B): the outer dimension fastest;
//   BLK128x128_32F (5): one float32 per 128×128 block, at scale[(i/128)·ld + p/128] (j for
//     B), ld = ceil(k/128) rounded up to 4 (rows of 16 bytes): the k blocks fastest,
//     DeepSeek's weight_scale_inv [rows/128, k/128] as stored when k/128 is a multiple of 4.
// BLK128x128 on both slots is refused, as on sm_90. The product is, per output,
//   Σ_g (Σ_{p in g} a·b) · (scaleB(g) · scaleA(g)) over the 128-wide groups g of k in order,
// each group's sum in float32 over p in order; then alpha, beta and D's rounding as above.
// The layouts are those PyTorch's _scaled_mm checks before handing them to cuBLASLt
// (ScaledBlas.cpp: 1x128 "outer-dim-major", 128x128 "near-inner-dim-major with 16-byte
// aligned strides"); they have not been run against a GPU here.
#include <string.h>

#include <cmath>
#include <memory>

#include "emu_lib.h"

using resin_emu::Cfg;
using resin_emu::Config;
using resin_emu::DeviceRange;
using resin_emu::Mu;
using resin_emu::Op;
using resin_emu::Result;
using resin_emu::SetLaunchError;
using resin_emu::StreamCapturing;
using resin_emu::Submit;

namespace {

enum : int {
  kOK = 0,
  kNotInitialized = 1,
  kInvalidValue = 7,
  kExecutionFailed = 13,
  kNotSupported = 15,
};

enum : int { kF32 = 0, kF16 = 2, kBF16 = 14, kE4M3 = 28 };
enum : int { kScaleScalar = 0, kScaleVec128 = 4, kScaleBlk128 = 5 };

const int kCompute32F = 68;
const int kScale32F = 0;

struct Handle {
  int magic = 0x4c54;
};

struct Desc {
  int compute = 0, scale = 0;
  int transA = 0, transB = 0;
  int modeA = kScaleScalar, modeB = kScaleScalar;
  const float* scaleA = nullptr;
  const float* scaleB = nullptr;
};

struct Layout {
  int type = 0;
  uint64_t rows = 0, cols = 0;
  int64_t ld = 0;
  int order = 0;  // CUBLASLT_ORDER_COL
  int batch = 1;
};

struct Pref {
  uint64_t workspace = 0;
};

int elemSize(int t) {
  switch (t) {
    case kF32: return 4;
    case kF16: case kBF16: return 2;
    case kE4M3: return 1;
  }
  return 0;
}

float bf16ToF32(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

uint16_t f32ToBF16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1);
  return (uint16_t)(u >> 16);
}

float f16ToF32(uint16_t h) {
  uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        e++;
        man <<= 1;
      } while (!(man & 0x400));
      u = sign | (uint32_t)(127 - 15 - e) << 23 | (man & 0x3ff) << 13;
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | man << 13;
  } else {
    u = sign | (exp + 127 - 15) << 23 | man << 13;
  }
  float f;
  memcpy(&f, &u, 4);
  return f;
}

uint16_t f32ToF16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000;
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00);
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00);  // rounds to infinity
  if (a < 0x38800000u) {                                    // subnormal or zero in half
    // a half subnormal is m·2^-24: round a/2^-24 to nearest even.
    float v;
    memcpy(&v, &a, 4);
    float m = std::nearbyint(v * 16777216.0f);  // default rounding: to nearest even
    return (uint16_t)(sign | (uint32_t)m);
  }
  uint32_t e = ((a >> 23) - 127 + 15), man = a & 0x7fffff;
  uint32_t h = e << 10 | man >> 13;
  uint32_t rest = man & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++;
  return (uint16_t)(sign | h);
}

// e4m3ToF32 widens an OCP float8 e4m3fn byte (0x7f and 0xff are NaN).
float e4m3ToF32(uint8_t v) {
  float sign = v & 0x80 ? -1.0f : 1.0f;
  int e = (v >> 3) & 0xf, m = v & 7;
  if (e == 0xf && m == 7) return NAN;
  if (e == 0) return sign * std::ldexp((float)m, -9);
  return sign * std::ldexp(1.0f + (float)m / 8.0f, e - 7);
}

float load(const void* p, int t, size_t i) {
  switch (t) {
    case kE4M3: return e4m3ToF32(((const uint8_t*)p)[i]);
    case kF32: return ((const float*)p)[i];
    case kBF16: return bf16ToF32(((const uint16_t*)p)[i]);
    case kF16: return f16ToF32(((const uint16_t*)p)[i]);
  }
  return NAN;
}

void store(void* p, int t, size_t i, float v) {
  switch (t) {
    case kF32: ((float*)p)[i] = v; break;
    case kBF16: ((uint16_t*)p)[i] = f32ToBF16(v); break;
    case kF16: ((uint16_t*)p)[i] = f32ToF16(v); break;
  }
}

// shape checks the descriptors of one matmul and returns its m, n, k.
int shape(const Desc& d, const Layout& a, const Layout& b, const Layout& c, const Layout& dl, uint64_t* m, uint64_t* n,
          uint64_t* k) {
  if (d.compute != kCompute32F || d.scale != kScale32F) return kNotSupported;
  for (const Layout* l : {&a, &b, &c, &dl}) {
    if (elemSize(l->type) == 0 || l->order != 0 || l->batch != 1) return kNotSupported;
    if (l->rows == 0 || l->cols == 0 || l->ld < (int64_t)l->rows) return kInvalidValue;
  }
  if (a.type != b.type) return kNotSupported;
  if (a.type == kE4M3) {
    if (!d.transA || d.transB) return kNotSupported;  // FP8 is TN only
    if (dl.type != c.type || (dl.type != kF32 && dl.type != kBF16)) return kNotSupported;
    for (int mode : {d.modeA, d.modeB})
      if (mode != kScaleScalar && mode != kScaleVec128 && mode != kScaleBlk128) return kNotSupported;
    if (d.modeA == kScaleBlk128 && d.modeB == kScaleBlk128) return kNotSupported;
  } else {
    if (d.modeA != kScaleScalar || d.modeB != kScaleScalar) return kNotSupported;
    if (dl.type != c.type || (dl.type != kF32 && dl.type != a.type)) return kNotSupported;
  }
  *m = d.transA ? a.cols : a.rows;
  *k = d.transA ? a.rows : a.cols;
  uint64_t kb = d.transB ? b.cols : b.rows;
  *n = d.transB ? b.rows : b.cols;
  if (kb != *k || dl.rows != *m || dl.cols != *n || c.rows != *m || c.cols != *n) return kInvalidValue;
  return kOK;
}

}  // namespace

extern "C" int cublasLtCreate(void** h) {
  if (!h) return kInvalidValue;
  *h = new Handle();
  return kOK;
}

extern "C" int cublasLtDestroy(void* h) {
  if (!h) return kNotInitialized;
  delete (Handle*)h;
  return kOK;
}

extern "C" size_t cublasLtGetVersion() { return 120904; }

extern "C" int cublasLtMatmulDescCreate(void** d, int compute, int scale) {
  if (!d) return kInvalidValue;
  Desc* x = new Desc();
  x->compute = compute;
  x->scale = scale;
  *d = x;
  return kOK;
}

extern "C" int cublasLtMatmulDescDestroy(void* d) {
  delete (Desc*)d;
  return kOK;
}

extern "C" int cublasLtMatmulDescSetAttribute(void* d, int attr, const void* buf, size_t size) {
  if (!d || !buf) return kInvalidValue;
  Desc* x = (Desc*)d;
  if (attr == 17 || attr == 18) {  // CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, B_SCALE_POINTER
    if (size != sizeof(void*)) return kInvalidValue;
    memcpy(attr == 17 ? (void*)&x->scaleA : (void*)&x->scaleB, buf, sizeof(void*));
    return kOK;
  }
  int v = 0;
  if (size != 4) return kInvalidValue;
  memcpy(&v, buf, 4);
  switch (attr) {
    case 3: x->transA = v; break;  // CUBLASLT_MATMUL_DESC_TRANSA
    case 4: x->transB = v; break;  // TRANSB
    case 31: x->modeA = v; return kOK;  // CUBLASLT_MATMUL_DESC_A_SCALE_MODE (checked at use)
    case 32: x->modeB = v; return kOK;  // B_SCALE_MODE
    default: return kNotSupported;  // epilogues, amax, ...: not emulated
  }
  if (v != 0 && v != 1) return kNotSupported;  // CUBLAS_OP_C on real types is op T; keep to N and T
  return kOK;
}

extern "C" int cublasLtMatrixLayoutCreate(void** l, int type, uint64_t rows, uint64_t cols, int64_t ld) {
  if (!l) return kInvalidValue;
  Layout* x = new Layout();
  x->type = type;
  x->rows = rows;
  x->cols = cols;
  x->ld = ld;
  *l = x;
  return kOK;
}

extern "C" int cublasLtMatrixLayoutDestroy(void* l) {
  delete (Layout*)l;
  return kOK;
}

extern "C" int cublasLtMatmulPreferenceCreate(void** p) {
  if (!p) return kInvalidValue;
  *p = new Pref();
  return kOK;
}

extern "C" int cublasLtMatmulPreferenceDestroy(void* p) {
  delete (Pref*)p;
  return kOK;
}

extern "C" int cublasLtMatmulPreferenceSetAttribute(void* p, int attr, const void* buf, size_t size) {
  if (!p || !buf) return kInvalidValue;
  if (attr == 1 && size == 8) memcpy(&((Pref*)p)->workspace, buf, 8);  // MAX_WORKSPACE_BYTES
  return kOK;  // alignment preferences: every alignment is served
}

// The heuristic result: a 64-byte algo, then workspaceSize, state and wavesCount.
struct HeuristicResult {
  unsigned char algo[64];
  size_t workspace;
  int state;
  float waves;
  int reserved[4];
};
static_assert(sizeof(HeuristicResult) == 96, "cublasLtMatmulHeuristicResult_t is 96 bytes");

extern "C" int cublasLtMatmulAlgoGetHeuristic(void* h, void* op, void* a, void* b, void* c, void* d, void* pref,
                                              int requested, HeuristicResult* results, int* count) {
  if (!h || !op || !a || !b || !c || !d || !pref || !results || !count || requested < 1) return kInvalidValue;
  uint64_t m, n, k;
  int r = shape(*(Desc*)op, *(Layout*)a, *(Layout*)b, *(Layout*)c, *(Layout*)d, &m, &n, &k);
  if (r != kOK) {
    *count = 0;
    return r;
  }
  memset(&results[0], 0, sizeof results[0]);
  memcpy(results[0].algo, "resin-emu-gemm", 14);
  results[0].waves = 1;
  *count = 1;
  return kOK;
}

namespace {

// gemm computes the product with the descriptors' values (copied at enqueue).
// slotScale is the scale of row i (of op(A), or column of op(B)) in group g of k, for a
// slot of the given mode over outer rows and groups of 128 k.
float slotScale(int mode, const float* s, uint64_t outer, uint64_t groups, uint64_t i, uint64_t g) {
  switch (mode) {
    case kScaleVec128: return s[g * outer + i];
    case kScaleBlk128: return s[(i / 128) * ((groups + 3) / 4 * 4) + g];
  }
  return s ? s[0] : 1.0f;
}

// scaleBytes is the size of a slot's scale tensor (0 when it has none to read).
size_t scaleBytes(int mode, const float* s, uint64_t outer, uint64_t k) {
  uint64_t groups = (k + 127) / 128;
  switch (mode) {
    case kScaleVec128: return groups * outer * 4;
    case kScaleBlk128: return ((outer + 127) / 128 - 1) * ((groups + 3) / 4 * 4) * 4 + groups * 4;
  }
  return s ? 4 : 0;
}

int gemm(const Desc& d, const Layout& la, const Layout& lb, const Layout& lc, const Layout& ld, float alpha, float beta,
         const void* A, const void* B, const void* C, void* D) {
  uint64_t m, n, k;
  if (int r = shape(d, la, lb, lc, ld, &m, &n, &k)) return r;
  // op(A) as m rows of k and op(B) as n rows of k, in float32, so each dot product reads
  // two contiguous rows.
  std::unique_ptr<float[]> a(new float[m * k]), b(new float[n * k]);
  for (uint64_t i = 0; i < m; i++)
    for (uint64_t p = 0; p < k; p++)
      a[i * k + p] = load(A, la.type, d.transA ? p + i * la.ld : i + p * la.ld);
  for (uint64_t j = 0; j < n; j++)
    for (uint64_t p = 0; p < k; p++)
      b[j * k + p] = load(B, lb.type, d.transB ? j + p * lb.ld : p + j * lb.ld);
  uint64_t groups = (k + 127) / 128;
  bool fp8 = la.type == kE4M3;
  for (uint64_t j = 0; j < n; j++) {
    for (uint64_t i = 0; i < m; i++) {
      const float* x = &a[i * k];
      const float* y = &b[j * k];
      float acc = 0;
      if (fp8) {
        for (uint64_t g = 0; g < groups; g++) {
          float part = 0;
          for (uint64_t p = g * 128; p < k && p < (g + 1) * 128; p++) part += x[p] * y[p];
          acc += part * (slotScale(d.modeB, d.scaleB, n, groups, j, g) * slotScale(d.modeA, d.scaleA, m, groups, i, g));
        }
      } else {
        for (uint64_t p = 0; p < k; p++) acc += x[p] * y[p];
      }
      float v = alpha * acc;
      if (beta != 0) v += beta * load(C, lc.type, i + j * lc.ld);
      store(D, ld.type, i + j * ld.ld, v);
    }
  }
  return kOK;
}

}  // namespace

extern "C" int cublasLtMatmul(void* h, void* op, const float* alpha, const void* A, void* adesc, const void* B,
                              void* bdesc, const float* beta, const void* C, void* cdesc, void* D, void* ddesc,
                              const void* algo, void* workspace, size_t wsSize, void* stream) {
  (void)algo;
  (void)workspace;
  (void)wsSize;
  if (!h) return kNotInitialized;
  if (!op || !alpha || !beta || !adesc || !bdesc || !cdesc || !ddesc || !A || !B || !D) return kInvalidValue;
  Desc d = *(Desc*)op;
  Layout la = *(Layout*)adesc, lb = *(Layout*)bdesc, lc = *(Layout*)cdesc, ld = *(Layout*)ddesc;
  float al = *alpha, be = *beta;  // host pointer mode: the values at the call
  uint64_t m, n, k;
  if (int r = shape(d, la, lb, lc, ld, &m, &n, &k)) return r;
  if (be != 0 && !C) return kInvalidValue;
  if (la.type == kE4M3 && ((d.modeA != kScaleScalar && !d.scaleA) || (d.modeB != kScaleScalar && !d.scaleB)))
    return kInvalidValue;  // a block-scaled slot without its scales
  size_t sa = la.type == kE4M3 ? scaleBytes(d.modeA, d.scaleA, m, k) : 0;
  size_t sb = la.type == kE4M3 ? scaleBytes(d.modeB, d.scaleB, n, k) : 0;
  Result r = Submit(stream, Op{"cublasLtMatmul", [=]() -> Result {
                                 auto span = [](const Layout& l) {
                                   return (size_t)((l.cols - 1) * l.ld + l.rows) * elemSize(l.type);
                                 };
                                 if (!DeviceRange((uintptr_t)A, span(la)) || !DeviceRange((uintptr_t)B, span(lb)) ||
                                     !DeviceRange((uintptr_t)D, span(ld)) ||
                                     (be != 0 && !DeviceRange((uintptr_t)C, span(lc))) ||
                                     (sa && !DeviceRange((uintptr_t)d.scaleA, sa)) ||
                                     (sb && !DeviceRange((uintptr_t)d.scaleB, sb))) {
                                   SetLaunchError("cublasLtMatmul: a matrix lies outside device memory");
                                   return 1;  // CUDA_ERROR_INVALID_VALUE
                                 }
                                 return gemm(d, la, lb, lc, ld, al, be, A, B, C, D) ? 1 : 0;
                               }});
  if (r == 0) return kOK;
  if (r == 900 || r == 901) return kNotSupported;
  return kExecutionFailed;
}
