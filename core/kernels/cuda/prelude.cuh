// prelude.cuh: Resin's CUDA prelude. It lets one kernel source compile under NVRTC (the
// production path, which knows CUDA's built-ins) and under clang-16 with -nocudainc
// -nocudalib (the second opinion, which sees only clang's NVPTX builtins). Kernels use the
// RESIN_* names below and nothing from the CUDA headers.
#ifndef RESIN_PRELUDE
#define RESIN_PRELUDE

#if defined(__CUDACC_RTC__) || defined(__NVCC__)
// ---- NVRTC / nvcc: CUDA's own built-ins ----
#define RESIN_TID_X threadIdx.x
#define RESIN_BID_X blockIdx.x
#define RESIN_BID_Y blockIdx.y
#define RESIN_BID_Z blockIdx.z
#define RESIN_NTID_X blockDim.x
#define RESIN_NCTAID_X gridDim.x
#define resin_sync() __syncthreads()
#define resin_shfl_xor_f32(v, o) __shfl_xor_sync(0xffffffffu, (v), (o))
#define resin_shfl_xor_i32(v, o) __shfl_xor_sync(0xffffffffu, (v), (o))
#define resin_shfl_f32(v, src) __shfl_sync(0xffffffffu, (v), (src))
#define resin_expf(x) expf(x)
#define resin_rsqrtf(x) rsqrtf(x)
#define resin_fmaxf(a, b) fmaxf((a), (b))
#define resin_logf(x) logf(x)
#define resin_f2u(f) __float_as_uint(f)
#define resin_u2f(u) __uint_as_float(u)
#define resin_atomic_add_u32(p, v) atomicAdd((unsigned*)(p), (unsigned)(v))
#define resin_atomic_add_u64(p, v) atomicAdd((unsigned long long*)(p), (unsigned long long)(v))
#define resin_atomic_max_i32(p, v) atomicMax((int*)(p), (int)(v))
#define RESIN_INF __int_as_float(0x7f800000)
#else
// ---- clang -x cuda -nocudainc -nocudalib: NVPTX builtins only ----
#ifndef __global__
#define __global__ __attribute__((global))
#endif
#ifndef __device__
#define __device__ __attribute__((device))
#endif
#ifndef __shared__
#define __shared__ __attribute__((shared))
#endif
#ifndef __forceinline__
#define __forceinline__ __inline__ __attribute__((always_inline))
#endif
#ifndef __restrict__
#define __restrict__ __restrict
#endif
#define RESIN_TID_X __nvvm_read_ptx_sreg_tid_x()
#define RESIN_BID_X __nvvm_read_ptx_sreg_ctaid_x()
#define RESIN_BID_Y __nvvm_read_ptx_sreg_ctaid_y()
#define RESIN_BID_Z __nvvm_read_ptx_sreg_ctaid_z()
#define RESIN_NTID_X __nvvm_read_ptx_sreg_ntid_x()
#define RESIN_NCTAID_X __nvvm_read_ptx_sreg_nctaid_x()
#define resin_sync() __syncthreads()
#define resin_shfl_xor_f32(v, o) __nvvm_shfl_sync_bfly_f32(0xffffffffu, (v), (o), 0x1f)
#define resin_shfl_xor_i32(v, o) __nvvm_shfl_sync_bfly_i32(0xffffffffu, (v), (o), 0x1f)
#define resin_shfl_f32(v, src) __nvvm_shfl_sync_idx_f32(0xffffffffu, (v), (src), 0x1f)
#define resin_expf(x) __nvvm_ex2_approx_f((x) * 1.4426950408889634f)
#define resin_rsqrtf(x) __nvvm_rsqrt_approx_f(x)
#define resin_fmaxf(a, b) __nvvm_fmax_f((a), (b))
#define resin_logf(x) (__nvvm_lg2_approx_f(x) * 0.6931471805599453f)
#define resin_f2u(f) __builtin_bit_cast(unsigned, (float)(f))
#define resin_u2f(u) __builtin_bit_cast(float, (unsigned)(u))
#define resin_atomic_add_u32(p, v) ((unsigned)__nvvm_atom_add_gen_i((int*)(p), (int)(v)))
#define resin_atomic_add_u64(p, v) \
  ((unsigned long long)__nvvm_atom_add_gen_ll((long long*)(p), (long long)(v)))
#define resin_atomic_max_i32(p, v) __nvvm_atom_max_gen_i((int*)(p), (int)(v))
#define RESIN_INF __builtin_huge_valf()
#endif

#define RESIN_DEVICE static __device__ __forceinline__
#define RESIN_KERNEL extern "C" __global__
#define RESIN_WARP 32

// resin_global_tid is the thread's index over the whole grid (x dimension).
RESIN_DEVICE long long resin_global_tid() {
  return (long long)RESIN_BID_X * RESIN_NTID_X + RESIN_TID_X;
}

// resin_warp_sum returns the sum of v over the warp, in every lane.
RESIN_DEVICE float resin_warp_sum(float v) {
  for (int o = RESIN_WARP / 2; o > 0; o >>= 1) v += resin_shfl_xor_f32(v, o);
  return v;
}

// resin_warp_max returns the maximum of v over the warp, in every lane.
RESIN_DEVICE float resin_warp_max(float v) {
  for (int o = RESIN_WARP / 2; o > 0; o >>= 1) v = resin_fmaxf(v, resin_shfl_xor_f32(v, o));
  return v;
}

// resin_block_sum returns the sum of v over the block, in every thread. scratch holds 32
// floats of shared memory; blockDim.x must be a multiple of 32.
RESIN_DEVICE float resin_block_sum(float v, float* scratch) {
  unsigned lane = RESIN_TID_X % RESIN_WARP, warp = RESIN_TID_X / RESIN_WARP;
  unsigned warps = RESIN_NTID_X / RESIN_WARP;
  v = resin_warp_sum(v);
  resin_sync();  // scratch may still be read by a previous reduction
  if (lane == 0) scratch[warp] = v;
  resin_sync();
  v = lane < warps ? scratch[lane] : 0.0f;
  return resin_warp_sum(v);
}

// resin_block_max is resin_block_sum with max.
RESIN_DEVICE float resin_block_max(float v, float* scratch) {
  unsigned lane = RESIN_TID_X % RESIN_WARP, warp = RESIN_TID_X / RESIN_WARP;
  unsigned warps = RESIN_NTID_X / RESIN_WARP;
  v = resin_warp_max(v);
  resin_sync();
  if (lane == 0) scratch[warp] = v;
  resin_sync();
  v = lane < warps ? scratch[lane] : -RESIN_INF;
  return resin_warp_max(v);
}

// resin_better reports whether candidate (v, i) beats (bv, bi) for an argmax that skips
// NaN and prefers the lower index on a tie.
RESIN_DEVICE bool resin_better(float v, int i, float bv, int bi) {
  if (v != v) return false;
  if (bv != bv) return true;
  return v > bv || (v == bv && i < bi);
}

// resin_warp_argmax reduces (v, i) pairs over the warp; every lane gets the winner.
RESIN_DEVICE void resin_warp_argmax(float* v, int* i) {
  for (int o = RESIN_WARP / 2; o > 0; o >>= 1) {
    float ov = resin_shfl_xor_f32(*v, o);
    int oi = resin_shfl_xor_i32(*i, o);
    if (resin_better(ov, oi, *v, *i)) {
      *v = ov;
      *i = oi;
    }
  }
}

// ---- bfloat16 ----
// resin_bf16 is a bfloat16 held as its 16 bits, so that no CUDA header is needed: the top
// half of a float32. Kernels load bf16, compute in float32 and store bf16 rounded to
// nearest even (NaN stays a quiet NaN).
typedef unsigned short resin_bf16;

RESIN_DEVICE float resin_bf2f(resin_bf16 h) { return resin_u2f((unsigned)h << 16); }

RESIN_DEVICE resin_bf16 resin_f2bf(float f) {
  unsigned u = resin_f2u(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (resin_bf16)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (resin_bf16)(u >> 16);
}

// resin_load and resin_store read and write an element of either type as float32, so that
// one template body serves the float32 and bf16 variants of a kernel.
RESIN_DEVICE float resin_load(const float* p, long long i) { return p[i]; }
RESIN_DEVICE float resin_load(const resin_bf16* p, long long i) { return resin_bf2f(p[i]); }
RESIN_DEVICE void resin_store(float* p, long long i, float v) { p[i] = v; }
RESIN_DEVICE void resin_store(resin_bf16* p, long long i, float v) { p[i] = resin_f2bf(v); }

// RESIN_PAGE_SLOT_BITS is kvslab.SlotBits: the low bits of a page id that hold its slot.
#define RESIN_PAGE_SLOT_BITS 16

// resin_page_slot_base is the element offset of kvslab page id's first element in an
// arena of slabs (core/kernels/cuda.KVSlabLayout.PageBase): the id's top bits name the slab,
// its low RESIN_PAGE_SLOT_BITS bits the page in the slab.
RESIN_DEVICE long long resin_page_slot_base(unsigned id, long long slab_elems,
                                            long long page_elems) {
  return (long long)(id >> RESIN_PAGE_SLOT_BITS) * slab_elems +
         (long long)(id & ((1u << RESIN_PAGE_SLOT_BITS) - 1u)) * page_elems;
}

#endif  // RESIN_PRELUDE
