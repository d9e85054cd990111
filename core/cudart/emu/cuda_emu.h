// cuda_emu.h: Resin's emulated CUDA device for kernels compiled as host C++.
//
// A .cu source (core/kernels/cuda's Source(), prelude inlined, or a model's kernels)
// compiles unmodified with
//   g++ -std=c++17 -O1 -fPIC -shared -D__CUDACC_RTC__ -include cuda_emu.h
// (so prelude.cuh takes its NVRTC branch and sees CUDA's built-in names, defined here).
// Every CUDA thread of a block is a fiber with its own small stack; the blocks of a grid
// run one after another on the calling OS thread, and one launch at a time runs in a
// module, so block-scope `static` (the shim's __shared__) is block-shared memory.
//
// Checks a GPU would not give: every live thread of the block reaches a __syncthreads at
// one call site; a shuffle's mask names exactly the lanes that reach it, at one site;
// deadlock (every fiber blocked) and a thread that exits while others wait at a barrier
// are errors; a fiber's stack canary is checked after every block. Shared memory is
// poisoned (0xFF bytes: NaN floats, -1 integers) before every block. The schedule picks
// which runnable fiber goes next: lock-step forward, reverse, seeded random, or one warp
// running ahead to its barrier first (blocks run forward, reverse or shuffled alike).
//
// A module (core/cudart/emu.Build) appends a registration per kernel and exports
//   resin_emu_launch, resin_emu_has_kernel, resin_emu_stats, resin_emu_param_sizes
// (declared at the end of this file).
#ifndef RESIN_CUDA_EMU_H
#define RESIN_CUDA_EMU_H

#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <type_traits>
#include <utility>
#include <dlfcn.h>
#include <elf.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

// Fibers switch by a few instructions of assembly on x86-64 and arm64, elsewhere (or
// with -DRESIN_EMU_FORCE_UCONTEXT) by swapcontext.
#if (!defined(__x86_64__) && !defined(__aarch64__)) || defined(RESIN_EMU_FORCE_UCONTEXT)
#include <ucontext.h>
#define RESIN_EMU_UCONTEXT 1
#endif

#if defined(__SANITIZE_ADDRESS__)
extern "C" void __sanitizer_start_switch_fiber(void** fake_stack_save, const void* bottom, size_t size);
extern "C" void __sanitizer_finish_switch_fiber(void* fake_stack_save, const void** bottom_old,
                                                size_t* size_old);
#endif

// Everything of the shim and of the kernels is local to the module: two modules loaded
// into one process (RTLD_GLOBAL included) never bind to each other's copies.
#pragma GCC visibility push(hidden)

struct uint3 {
  unsigned x, y, z;
};
struct dim3 {
  unsigned x, y, z;
  dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};

namespace resin_emu {

constexpr unsigned kWarp = 32;
constexpr unsigned kMaxThreads = 1024;
#if defined(__SANITIZE_ADDRESS__)
constexpr size_t kStack = 1024 * 1024;  // ASan's frames, and its reports, need more
#else
constexpr size_t kStack = 64 * 1024;  // usable bytes per fiber
#endif
constexpr size_t kDynBytes = 228 * 1024;  // an H100's shared memory per block
constexpr size_t kColors = 4096;     // room for color(): every fiber keeps kStack usable
constexpr size_t kCanary = 2048;      // bytes at the stack's low end that must stay intact
constexpr unsigned char kCanaryByte = 0xA5;

enum State : unsigned char { kRun, kBarrier, kShuffle, kDone };
enum ShflKind : int { kIdx, kXor, kUp, kDown, kBallot, kAny, kAll, kSyncWarp };

struct Fiber {
  void* sp;              // saved stack pointer while switched out
  unsigned char* stack;  // the stack [stack, stack + kStack + kColors), canary at its low end
  uint3 tid;
  unsigned lin;  // linear index in the block
  State state;
#if defined(RESIN_EMU_UCONTEXT)
  ucontext_t uc;
#endif
  unsigned long long sval, sres;  // shuffle operand and result
  int sarg;
};

struct Warp {
  unsigned arrived, mask, width;
  int kind;
  const void* site;
  const char* file;
  int line;
};

struct Stats {
  unsigned long long launches, blocks, threads, barriers, shuffles, atomics;
};

struct Launch {
  void (*invoke)(void**);
  void** params;
  uint3 grid, block, bidx;
  unsigned n;       // threads per block
  Fiber* fibers;    // [n]
  Fiber* cur;       // the fiber running now, null in the scheduler
  Warp warps[kMaxThreads / kWarp];
  unsigned nwarps;
  unsigned at_barrier, done;
  const void* bar_site;
  const char* bar_file;
  int bar_line;
  int schedule;
  unsigned ahead;  // schedule 3: the warp that runs first
  unsigned long long rng;
  unsigned cursor;
  bool failed;
  char msg[512];
  void* sched_sp;
#if defined(RESIN_EMU_UCONTEXT)
  ucontext_t sched_uc;
#endif
#if defined(__SANITIZE_ADDRESS__)
  const void* sched_bottom;
  size_t sched_size;
  bool from_sched;  // the last switch left the scheduler
#endif
};

// The module's state. Launches are serialised by mu, so L and the block-scope statics
// the kernels use as shared memory belong to one block at a time.
struct Module {
  pthread_mutex_t mu;
  Launch* L;
  Stats stats;
  unsigned char* stacks;  // kMaxThreads fibers' stacks, each below a guard page
  size_t stride;
  unsigned ready;  // fibers with a guard page and a canary
  Fiber* fibers;
  struct Kernel {
    const char* name;
    void (*invoke)(void**);
    int (*sizes)(unsigned*, int);
  } kernels[256];
  int nkernels;
  bool too_many;  // a registration did not fit in kernels[]
  struct Region {
    unsigned char* p;
    size_t n;
  } shared[512];  // the shared-memory variables found in the module's symbol table
  int nshared;
  struct Dyn {
    unsigned char* p;
    size_t n;
  } dyn[64];  // extern __shared__ arrays
  int ndyn;
  int shared_found;  // 0 not looked, 1 found, -1 failed
  char shared_err[256];
};
__attribute__((used)) Module mod = {PTHREAD_MUTEX_INITIALIZER};

// ---- context switching ----
#if defined(__x86_64__)
extern "C" void resin_emu_swap(void** save, void* next);
__asm__(
    ".text\n.p2align 4\n.type resin_emu_swap,@function\n.hidden resin_emu_swap\n"
    "resin_emu_swap:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  movq %rsp, (%rdi)\n  movq %rsi, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n  ret\n"
    ".size resin_emu_swap, .-resin_emu_swap\n");
#elif defined(__aarch64__)
extern "C" void resin_emu_swap(void** save, void* next);
__asm__(
    ".text\n.p2align 4\n.type resin_emu_swap,%function\n.hidden resin_emu_swap\n"
    "resin_emu_swap:\n"
    "  sub sp, sp, #176\n"
    "  stp x19, x20, [sp, #0]\n  stp x21, x22, [sp, #16]\n  stp x23, x24, [sp, #32]\n"
    "  stp x25, x26, [sp, #48]\n  stp x27, x28, [sp, #64]\n  stp x29, x30, [sp, #80]\n"
    "  stp d8, d9, [sp, #96]\n  stp d10, d11, [sp, #112]\n  stp d12, d13, [sp, #128]\n"
    "  stp d14, d15, [sp, #144]\n"
    "  mov x2, sp\n  str x2, [x0]\n  mov sp, x1\n"
    "  ldp x19, x20, [sp, #0]\n  ldp x21, x22, [sp, #16]\n  ldp x23, x24, [sp, #32]\n"
    "  ldp x25, x26, [sp, #48]\n  ldp x27, x28, [sp, #64]\n  ldp x29, x30, [sp, #80]\n"
    "  ldp d8, d9, [sp, #96]\n  ldp d10, d11, [sp, #112]\n  ldp d12, d13, [sp, #128]\n"
    "  ldp d14, d15, [sp, #144]\n"
    "  add sp, sp, #176\n  ret\n"
    ".size resin_emu_swap, .-resin_emu_swap\n");
#endif

void fiber_main();

#if defined(__x86_64__)
extern "C" void resin_emu_entry();
__asm__(
    ".text\n.p2align 4\n.type resin_emu_entry,@function\n.hidden resin_emu_entry\n"
    "resin_emu_entry:\n  call _ZN9resin_emu10fiber_mainEv\n  ud2\n"
    ".size resin_emu_entry, .-resin_emu_entry\n");
#endif

// color staggers the fibers' stack tops over a page: stacks a page-multiple apart would
// put every fiber's live frames in the same cache sets, and a switch would miss.
inline size_t color(const Fiber* f) { return (size_t)(f->lin * 17 % 64) * 64; }

// init_stack prepares f to start in fiber_main on its next switch.
inline void init_stack(Fiber* f) {
#if defined(RESIN_EMU_UCONTEXT)
  getcontext(&f->uc);
  f->uc.uc_stack.ss_sp = f->stack;
  f->uc.uc_stack.ss_size = kStack + kColors;
  f->uc.uc_link = nullptr;
  makecontext(&f->uc, (void (*)())fiber_main, 0);
#elif defined(__x86_64__)
  uintptr_t top = ((uintptr_t)(f->stack + kStack + kColors - color(f))) & ~(uintptr_t)15;
  uint64_t* sp = (uint64_t*)top;
  // swap's ret enters resin_emu_entry with rsp == top (16-byte aligned), so its call
  // enters fiber_main with rsp % 16 == 8, as the ABI wants.
  *--sp = (uint64_t)resin_emu_entry;
  for (int i = 0; i < 6; i++) *--sp = 0;  // rbp rbx r12-r15
  f->sp = sp;
#elif defined(__aarch64__)
  uintptr_t top = ((uintptr_t)(f->stack + kStack + kColors - color(f))) & ~(uintptr_t)15;
  uint64_t* sp = (uint64_t*)(top - 176);
  memset(sp, 0, 176);
  sp[11] = (uint64_t)fiber_main;  // x30: swap's ret goes there
  f->sp = sp;
#endif
}

// ctx_switch saves the running context (fiber from, or the scheduler when from is null)
// and resumes to (a fiber, or the scheduler when to is null). exiting: from never runs
// again.
inline void ctx_switch(Fiber* from, Fiber* to, bool exiting) {
  Launch* L = mod.L;
#if defined(__SANITIZE_ADDRESS__)
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(exiting ? nullptr : &fake, to ? (const void*)to->stack : L->sched_bottom,
                                 to ? kStack + kColors : L->sched_size);
  L->from_sched = from == nullptr;
#endif
#if defined(RESIN_EMU_UCONTEXT)
  swapcontext(from ? &from->uc : &L->sched_uc, to ? &to->uc : &L->sched_uc);
#else
  resin_emu_swap(from ? &from->sp : &L->sched_sp, to ? to->sp : L->sched_sp);
#endif
#if defined(__SANITIZE_ADDRESS__)
  const void* bottom;
  size_t size;
  __sanitizer_finish_switch_fiber(fake, &bottom, &size);
  if (from && L->from_sched) {  // resumed in a fiber by the scheduler: its stack
    L->sched_bottom = bottom;
    L->sched_size = size;
  }
#endif
  (void)L;
  (void)exiting;
}

inline int pick(Launch* L);

// yield leaves the running fiber (blocked, done or failed) for the next runnable one
// under the schedule, switching to it directly; to the scheduler when none can run (a
// barrier to release, the block's end, a deadlock) or the launch failed.
inline void yield(bool exiting = false) {
  Launch* L = mod.L;
  Fiber* f = L->cur;
  if (!L->failed) {
    int i = pick(L);
    if (i >= 0 && L->fibers + i != f) {
      Fiber* g = L->fibers + i;
      L->cur = g;
      ctx_switch(f, g, exiting);
      return;
    }
  }
  ctx_switch(f, nullptr, exiting);
}

__attribute__((format(printf, 1, 2))) inline void fail(const char* fmt, ...) {
  Launch* L = mod.L;
  if (!L->failed) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(L->msg, sizeof L->msg, fmt, ap);
    va_end(ap);
    L->failed = true;
  }
}

// fail_fiber leaves the running fiber after fail recorded its error; it never resumes.
__attribute__((noreturn)) inline void fail_fiber() {
  for (;;) yield(true);
}

__attribute__((used, noinline)) inline void fiber_main() {
  Launch* L = mod.L;
#if defined(__SANITIZE_ADDRESS__)
  const void* bottom;
  size_t size;
  __sanitizer_finish_switch_fiber(nullptr, &bottom, &size);
  if (L->from_sched) {  // started by the scheduler: the stack left is its
    L->sched_bottom = bottom;
    L->sched_size = size;
  }
#endif
  L->invoke(L->params);
  L = mod.L;
  Fiber* f = L->cur;
  f->state = kDone;
  L->done++;
  for (;;) yield(true);
}

inline const char* base(const char* file) {
  const char* s = strrchr(file, '/');
  return s ? s + 1 : file;
}

// ---- barriers and warp operations ----
__attribute__((noinline)) inline void sync_threads(const char* file, int line) {
  const void* site = __builtin_return_address(0);
  Launch* L = mod.L;
  Fiber* f = L->cur;
  if (L->at_barrier == 0) {
    L->bar_site = site;
    L->bar_file = file;
    L->bar_line = line;
  } else if (L->bar_site != site) {
    fail("block (%u,%u,%u): thread %u reached __syncthreads at %s:%d while %u threads wait at "
         "%s:%d (a barrier must be reached by every thread at one call site)",
         L->bidx.x, L->bidx.y, L->bidx.z, f->lin, base(file), line, L->at_barrier,
         base(L->bar_file), L->bar_line);
    fail_fiber();
  }
  L->at_barrier++;
  f->state = kBarrier;
  yield();
}

inline unsigned lane_of(const Fiber* f) { return f->lin % kWarp; }

// The runtime keeps no block-scope statics: those are the kernels' shared memory.
constexpr const char* names[] = {"__shfl_sync",      "__shfl_xor_sync", "__shfl_up_sync",
                                 "__shfl_down_sync", "__ballot_sync",   "__any_sync",
                                 "__all_sync",       "__syncwarp"};

// warp_op is the rendezvous of a warp-level operation: the lanes in mask arrive with a
// value and an operand; when the last arrives every lane gets its result.
__attribute__((noinline)) inline unsigned long long warp_op(int kind, unsigned mask,
                                                            unsigned long long v, int arg,
                                                            int width, const char* file,
                                                            int line) {
  const void* site = __builtin_return_address(0);
  Launch* L = mod.L;
  Fiber* f = L->cur;
  unsigned w = f->lin / kWarp, lane = lane_of(f);
  unsigned first = w * kWarp;
  unsigned lanes = L->n - first < kWarp ? L->n - first : kWarp;
  unsigned live = lanes == kWarp ? 0xffffffffu : (1u << lanes) - 1u;
  Warp& W = L->warps[w];
  if (!(mask >> lane & 1u)) {
    fail("block (%u,%u,%u) thread %u: %s at %s:%d with mask %#x that leaves out its own lane %u",
         L->bidx.x, L->bidx.y, L->bidx.z, f->lin, names[kind], base(file), line, mask, lane);
    fail_fiber();
  }
  if (mask & ~live) {
    fail("block (%u,%u,%u) warp %u: %s at %s:%d with mask %#x, but the warp has only %u threads "
         "(block of %u)",
         L->bidx.x, L->bidx.y, L->bidx.z, w, names[kind], base(file), line, mask, lanes, L->n);
    fail_fiber();
  }
  if (width <= 0 || width > (int)kWarp || (width & (width - 1))) {
    fail("%s at %s:%d: width %d is not a power of two up to 32", names[kind], base(file), line, width);
    fail_fiber();
  }
  if (W.arrived == 0) {
    W.mask = mask;
    W.kind = kind;
    W.site = site;
    W.file = file;
    W.line = line;
    W.width = (unsigned)width;
  } else if (W.site != site || W.kind != kind || W.mask != mask || W.width != (unsigned)width) {
    fail("block (%u,%u,%u) warp %u: lane %u reached %s at %s:%d (mask %#x) while lanes wait at "
         "%s at %s:%d (mask %#x): every lane of the mask must reach one call site",
         L->bidx.x, L->bidx.y, L->bidx.z, w, lane, names[kind], base(file), line, mask,
         names[W.kind], base(W.file), W.line, W.mask);
    fail_fiber();
  }
  f->sval = v;
  f->sarg = arg;
  W.arrived |= 1u << lane;
  if (W.arrived != W.mask) {
    f->state = kShuffle;
    yield();
    return f->sres;
  }
  // The last lane: compute every lane's result.
  Fiber* base_f = L->fibers + first;
  unsigned long long ballot = 0;
  for (unsigned i = 0; i < kWarp; i++)
    if (mask >> i & 1u && base_f[i].sval) ballot |= 1ull << i;
  for (unsigned i = 0; i < kWarp; i++) {
    if (!(mask >> i & 1u)) continue;
    Fiber* g = base_f + i;
    unsigned seg = i & ~(W.width - 1), src = i;
    switch (kind) {
      case kIdx: src = seg + ((unsigned)g->sarg & (W.width - 1)); break;
      case kXor: src = i ^ (unsigned)g->sarg; if ((src & ~(W.width - 1)) != seg) src = i; break;
      case kUp: src = i - (unsigned)g->sarg; if ((int)(i - seg) - g->sarg < 0) src = i; break;
      case kDown: src = i + (unsigned)g->sarg; if ((i - seg) + (unsigned)g->sarg >= W.width) src = i; break;
      default: break;
    }
    if (kind <= kDown) {
      if (src >= kWarp || !(mask >> src & 1u)) {
        fail("block (%u,%u,%u) warp %u: lane %u of %s at %s:%d reads lane %u, outside mask %#x",
             L->bidx.x, L->bidx.y, L->bidx.z, w, i, names[kind], base(file), line, src, mask);
        fail_fiber();
      }
      g->sres = base_f[src].sval;
    } else if (kind == kBallot) {
      g->sres = ballot;
    } else if (kind == kAny) {
      g->sres = ballot != 0;
    } else if (kind == kAll) {
      g->sres = ballot == (unsigned long long)mask;
    } else {
      g->sres = 0;
    }
    if (g != f) g->state = kRun;
  }
  W.arrived = 0;
  mod.stats.shuffles++;
  return f->sres;
}

template <class T>
inline unsigned long long to_bits(T v) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "shuffle of a type over 8 bytes");
  unsigned long long u = 0;
  memcpy(&u, &v, sizeof(T));
  return u;
}
template <class T>
inline T from_bits(unsigned long long u) {
  T v;
  memcpy(&v, &u, sizeof(T));
  return v;
}
template <class T>
inline T shfl(int kind, unsigned mask, T v, int arg, int width, const char* file, int line) {
  return from_bits<T>(warp_op(kind, mask, to_bits(v), arg, width, file, line));
}

// ---- atomics: fibers switch only at barriers and warp operations, so a plain
// read-modify-write is atomic ----
template <class T, class U>
inline T atomic_add(T* p, U v) {
  mod.stats.atomics++;
  T old = *p;
  *p = (T)(old + (T)v);
  return old;
}
template <class T, class U>
inline T atomic_max(T* p, U v) {
  mod.stats.atomics++;
  T old = *p;
  if ((T)v > old) *p = (T)v;
  return old;
}
template <class T, class U>
inline T atomic_min(T* p, U v) {
  mod.stats.atomics++;
  T old = *p;
  if ((T)v < old) *p = (T)v;
  return old;
}
template <class T, class U>
inline T atomic_exch(T* p, U v) {
  mod.stats.atomics++;
  T old = *p;
  *p = (T)v;
  return old;
}
template <class T, class U, class V>
inline T atomic_cas(T* p, U cmp, V v) {
  mod.stats.atomics++;
  T old = *p;
  if (old == (T)cmp) *p = (T)v;
  return old;
}

// ---- math ----
inline unsigned f2u(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
inline float u2f(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
inline int f2i(float f) { int u; memcpy(&u, &f, 4); return u; }
inline float i2f(int u) { float f; memcpy(&f, &u, 4); return f; }
inline long long d2ll(double d) { long long u; memcpy(&u, &d, 8); return u; }
inline double ll2d(long long u) { double d; memcpy(&d, &u, 8); return d; }
inline float rsqrt(float x) { return 1.0f / sqrtf(x); }

// ---- registration, shared memory and the launch ----
inline void register_kernel(const char* name, void (*invoke)(void**), int (*sizes)(unsigned*, int)) {
  if (mod.nkernels < (int)(sizeof mod.kernels / sizeof mod.kernels[0]))
    mod.kernels[mod.nkernels++] = {name, invoke, sizes};
  else
    mod.too_many = true;
}
inline void register_dyn_shared(void* p, size_t n) {
  if (mod.ndyn < (int)(sizeof mod.dyn / sizeof mod.dyn[0])) mod.dyn[mod.ndyn++] = {(unsigned char*)p, n};
}

template <class... A, size_t... I>
inline void call(void (*f)(A...), void** p, std::index_sequence<I...>) {
  f(*static_cast<std::remove_cv_t<A>*>(p[I])...);
}
template <class... A>
inline void tramp(void (*f)(A...), void** p) {
  call(f, p, std::index_sequence_for<A...>{});
}

// param_sizes writes the byte size of each of f's parameters (at most max) and returns
// how many it has: what a launch's params[i] point at, for a copy (a graph's kernel node).
template <class... A>
inline int param_sizes(void (*)(A...), unsigned* out, int max) {
  const unsigned s[] = {0u, (unsigned)sizeof(A)...};
  int n = (int)sizeof...(A);
  for (int i = 0; i < n && i < max; i++) out[i] = s[i + 1];
  return n;
}

// find_shared lists the module's block-scope statics (the kernels' __shared__ variables):
// the writable local objects of its symbol table whose names are C++'s for a block-scope
// static (_ZZ...), read from the module's own file.
inline void find_shared() {
  if (mod.shared_found) return;
  mod.shared_found = -1;
  Dl_info info;
  if (!dladdr((void*)&mod, &info) || !info.dli_fname) {
    snprintf(mod.shared_err, sizeof mod.shared_err, "dladdr found no file for the module");
    return;
  }
  FILE* fp = fopen(info.dli_fname, "rb");
  if (!fp) {
    snprintf(mod.shared_err, sizeof mod.shared_err, "cannot open %s", info.dli_fname);
    return;
  }
  fseek(fp, 0, SEEK_END);
  long size = ftell(fp);
  fseek(fp, 0, SEEK_SET);
  unsigned char* img = (unsigned char*)malloc((size_t)size);
  bool ok = img && fread(img, 1, (size_t)size, fp) == (size_t)size;
  fclose(fp);
  if (!ok || size < (long)sizeof(Elf64_Ehdr) || memcmp(img, ELFMAG, SELFMAG) != 0 ||
      img[EI_CLASS] != ELFCLASS64) {
    snprintf(mod.shared_err, sizeof mod.shared_err, "%s is not a 64-bit ELF file", info.dli_fname);
    free(img);
    return;
  }
  const Elf64_Ehdr* eh = (const Elf64_Ehdr*)img;
  const Elf64_Shdr* sh = (const Elf64_Shdr*)(img + eh->e_shoff);
  // The load bias: the module's lowest PT_LOAD vaddr sits at dli_fbase.
  const Elf64_Phdr* ph = (const Elf64_Phdr*)(img + eh->e_phoff);
  uintptr_t lowest = ~(uintptr_t)0;
  for (int i = 0; i < eh->e_phnum; i++)
    if (ph[i].p_type == PT_LOAD && ph[i].p_vaddr < lowest) lowest = ph[i].p_vaddr;
  uintptr_t bias = (uintptr_t)info.dli_fbase - (lowest & ~(uintptr_t)0xfff);
  for (int i = 0; i < eh->e_shnum; i++) {
    if (sh[i].sh_type != SHT_SYMTAB) continue;
    const Elf64_Sym* sym = (const Elf64_Sym*)(img + sh[i].sh_offset);
    const char* str = (const char*)(img + sh[sh[i].sh_link].sh_offset);
    size_t n = sh[i].sh_size / sizeof(Elf64_Sym);
    for (size_t j = 0; j < n; j++) {
      const Elf64_Sym& s = sym[j];
      if (ELF64_ST_TYPE(s.st_info) != STT_OBJECT || s.st_size == 0 || s.st_shndx == SHN_UNDEF ||
          s.st_shndx >= eh->e_shnum)
        continue;
      const char* name = str + s.st_name;
      // Uninitialised block-scope statics: .bss (NOBITS), never an initialised table.
      if (strncmp(name, "_ZZ", 3) != 0 || sh[s.st_shndx].sh_type != SHT_NOBITS ||
          !(sh[s.st_shndx].sh_flags & SHF_WRITE))
        continue;
      if (mod.nshared == (int)(sizeof mod.shared / sizeof mod.shared[0])) {
        snprintf(mod.shared_err, sizeof mod.shared_err, "more than %d shared variables",
                 mod.nshared);
        free(img);
        return;
      }
      mod.shared[mod.nshared++] = {(unsigned char*)(bias + s.st_value), (size_t)s.st_size};
    }
    mod.shared_found = 1;
  }
  if (mod.shared_found != 1)
    snprintf(mod.shared_err, sizeof mod.shared_err, "%s has no symbol table (stripped?)",
             info.dli_fname);
  free(img);
}

// alloc_stacks reserves kMaxThreads fibers' stacks (address space only) and readies the
// first n: each below a guard page, with its canary. Only the fibers a launch uses get a
// guard, so a module costs two mappings per thread of its largest block, not per
// kMaxThreads (a process may hold dozens of modules, and mappings are limited).
inline bool alloc_stacks(unsigned n) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  if (!mod.stacks) {
    mod.stride = kStack + kColors + page;
    void* p = mmap(nullptr, mod.stride * kMaxThreads, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return false;
    mod.fibers = (Fiber*)calloc(kMaxThreads, sizeof(Fiber));
    if (!mod.fibers) {
      munmap(p, mod.stride * kMaxThreads);
      return false;
    }
    mod.stacks = (unsigned char*)p;
  }
  for (; mod.ready < n; mod.ready++) {
    unsigned char* lo = mod.stacks + mod.ready * mod.stride;
    if (mprotect(lo, page, PROT_NONE) != 0) return false;
    mod.fibers[mod.ready].stack = lo + page;
    memset(lo + page, kCanaryByte, kCanary);
  }
  return true;
}

inline unsigned long long next_rand(unsigned long long* s) {
  unsigned long long x = (*s += 0x9E3779B97F4A7C15ull);
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// scan returns the first runnable fiber from start on, stepping by +1 or -1 and wrapping
// around, or -1.
inline int scan(const Launch* L, unsigned start, int step) {
  unsigned n = L->n, i = start;
  for (unsigned k = 0; k < n; k++) {
    if (L->fibers[i].state == kRun) return (int)i;
    if (step > 0)
      i = i + 1 == n ? 0 : i + 1;
    else
      i = i == 0 ? n - 1 : i - 1;
  }
  return -1;
}

// pick returns the next runnable fiber under the launch's schedule, or -1.
inline int pick(Launch* L) {
  unsigned n = L->n;
  int i;
  switch (L->schedule) {
    case 1:  // reverse: n-1 down to 0, round and round
      i = scan(L, L->cursor, -1);
      if (i >= 0) L->cursor = i == 0 ? n - 1 : (unsigned)i - 1;
      return i;
    case 2:  // seeded random: scan from a random start
      return scan(L, (unsigned)(((next_rand(&L->rng) >> 32) * n) >> 32), 1);
    case 3: {  // one warp first: its lanes whenever one can run, then forward
      unsigned first = L->ahead * kWarp, last = first + kWarp < n ? first + kWarp : n;
      for (unsigned j = first; j < last; j++)
        if (L->fibers[j].state == kRun) return (int)j;
    }
      [[fallthrough]];
    default:  // forward: 0 up to n-1, round and round
      i = scan(L, L->cursor, 1);
      if (i >= 0) L->cursor = (unsigned)i + 1 == n ? 0 : (unsigned)i + 1;
      return i;
  }
}

inline void describe_stuck(Launch* L) {
  unsigned bar = 0, shfl = 0, done = 0;
  int shfl_line = 0;
  const char* shfl_file = "";
  unsigned shfl_warp = 0, shfl_have = 0, shfl_want = 0;
  for (unsigned i = 0; i < L->n; i++) {
    State s = L->fibers[i].state;
    if (s == kBarrier) bar++;
    if (s == kDone) done++;
    if (s == kShuffle && shfl++ == 0) {
      shfl_warp = i / kWarp;
      const Warp& W = L->warps[shfl_warp];
      shfl_line = W.line;
      shfl_file = W.file;
      shfl_have = (unsigned)__builtin_popcount(W.arrived);
      shfl_want = (unsigned)__builtin_popcount(W.mask);
    }
  }
  if (shfl) {
    fail("block (%u,%u,%u): deadlock: warp %u waits at a warp operation at %s:%d with %u of its "
         "%u lanes (%u threads at a barrier, %u exited)",
         L->bidx.x, L->bidx.y, L->bidx.z, shfl_warp, base(shfl_file), shfl_line, shfl_have,
         shfl_want, bar, done);
  } else {
    fail("block (%u,%u,%u): %u threads exited while %u wait at __syncthreads at %s:%d "
         "(a barrier must be reached by every thread of the block)",
         L->bidx.x, L->bidx.y, L->bidx.z, done, bar, base(L->bar_file), L->bar_line);
  }
}

// run_block runs every thread of block L->bidx to its end.
inline void run_block(Launch* L) {
  for (int i = 0; i < mod.nshared; i++) memset(mod.shared[i].p, 0xFF, mod.shared[i].n);
  for (int i = 0; i < mod.ndyn; i++) memset(mod.dyn[i].p, 0xFF, mod.dyn[i].n);
  for (unsigned i = 0; i < L->n; i++) {
    Fiber* f = L->fibers + i;
    f->lin = i;
    f->tid = {i % L->block.x, (i / L->block.x) % L->block.y, i / (L->block.x * L->block.y)};
    f->state = kRun;
    init_stack(f);
  }
  for (unsigned w = 0; w < L->nwarps; w++) L->warps[w].arrived = 0;
  L->at_barrier = L->done = 0;
  L->cursor = L->schedule == 1 ? L->n - 1 : 0;
  L->ahead = L->nwarps ? (unsigned)(next_rand(&L->rng) % L->nwarps) : 0;
  for (;;) {
    int i = pick(L);
    if (i < 0) {
      if (L->done == L->n) break;
      unsigned shfl = 0;
      for (unsigned j = 0; j < L->n; j++) shfl += L->fibers[j].state == kShuffle;
      if (L->at_barrier && !shfl && L->at_barrier == L->n) {
        for (unsigned j = 0; j < L->n; j++) L->fibers[j].state = kRun;
        L->at_barrier = 0;
        L->cursor = L->schedule == 1 ? L->n - 1 : 0;
        mod.stats.barriers++;
        continue;
      }
      describe_stuck(L);
      return;
    }
    Fiber* f = L->fibers + i;
    L->cur = f;
    ctx_switch(nullptr, f, false);
    L->cur = nullptr;
    if (L->failed) return;
  }
  int over = -1;
  for (unsigned i = 0; i < L->n; i++) {
    unsigned char* c = L->fibers[i].stack;
    for (size_t k = 0; k < kCanary; k++)
      if (c[k] != kCanaryByte) {
        memset(c, kCanaryByte, kCanary);  // for the next launch
        if (over < 0) over = (int)i;
        break;
      }
  }
  if (over >= 0) {
    fail("block (%u,%u,%u) thread %d came within %zu bytes of the end of its %zu-byte stack",
         L->bidx.x, L->bidx.y, L->bidx.z, over, kCanary, kStack);
    return;
  }
  mod.stats.threads += L->n;
  mod.stats.blocks++;
}

inline int launch(const char* kernel, uint3 grid, uint3 block, unsigned dyn, void** params,
                  int schedule, unsigned long long seed, char* err, int errlen) {
  auto report = [&](const char* msg) {
    if (err && errlen > 0) snprintf(err, (size_t)errlen, "%s: %s", kernel ? kernel : "(null)", msg);
    return 1;
  };
  if (!kernel) return report("no kernel name");
  void (*invoke)(void**) = nullptr;
  for (int i = 0; i < mod.nkernels; i++)
    if (strcmp(mod.kernels[i].name, kernel) == 0) invoke = mod.kernels[i].invoke;
  if (!invoke)
    return report(mod.too_many ? "no such kernel among the module's first 256 (it has more)"
                               : "no such kernel in the module");
  unsigned long long n = (unsigned long long)block.x * block.y * block.z;
  if (!grid.x || !grid.y || !grid.z || !block.x || !block.y || !block.z)
    return report("a grid or block dimension is 0");
  if (n > kMaxThreads) return report("more than 1024 threads per block");
  if (block.z > 64) return report("block z above 64");
  if (grid.y > 65535 || grid.z > 65535) return report("grid y or z above 65535");
  if (schedule < 0 || schedule > 3) return report("unknown schedule (0 forward, 1 reverse, 2 random, 3 warp ahead)");
  // Every extern __shared__ array holds kDynBytes; a kernel without one may still be
  // given dynamic shared memory (unused), as on a GPU, up to the same limit.
  if (dyn > kDynBytes) {
    char m[160];
    snprintf(m, sizeof m, "%u bytes of dynamic shared memory exceed a block's %zu", dyn, kDynBytes);
    return report(m);
  }
  pthread_mutex_lock(&mod.mu);
  find_shared();
  if (mod.shared_found < 0) {
    pthread_mutex_unlock(&mod.mu);
    return report(mod.shared_err);
  }
  if (!alloc_stacks((unsigned)n)) {
    pthread_mutex_unlock(&mod.mu);
    return report("cannot map the fibers' stacks");
  }
  Launch* L = (Launch*)calloc(1, sizeof(Launch));
  if (!L) {
    pthread_mutex_unlock(&mod.mu);
    return report("out of memory");
  }
  L->invoke = invoke;
  L->params = params;
  L->grid = grid;
  L->block = block;
  L->n = (unsigned)n;
  L->nwarps = (L->n + kWarp - 1) / kWarp;
  L->fibers = mod.fibers;
  L->schedule = schedule;
  L->rng = seed ^ 0x5DEECE66Dull;
  mod.L = L;
  mod.stats.launches++;
  unsigned long long blocks = (unsigned long long)grid.x * grid.y * grid.z;
  // Block order: forward for schedules 0 and 3, reverse for 1, a seeded stride for 2.
  unsigned long long stride = 1, start = 0;
  if (schedule == 2 && blocks > 1) {
    do stride = next_rand(&L->rng) % blocks;
    while (stride == 0 || std::gcd(stride, blocks) != 1);
    start = next_rand(&L->rng) % blocks;
  }
  for (unsigned long long k = 0; k < blocks && !L->failed; k++) {
    unsigned long long b = schedule == 1 ? blocks - 1 - k : (start + k * stride) % blocks;
    L->bidx = {(unsigned)(b % grid.x), (unsigned)(b / grid.x % grid.y),
               (unsigned)(b / ((unsigned long long)grid.x * grid.y))};
    run_block(L);
  }
  int rc = 0;
  if (L->failed) rc = report(L->msg);
  mod.L = nullptr;
  free(L);
  pthread_mutex_unlock(&mod.mu);
  return rc;
}

}  // namespace resin_emu

// ---- CUDA's built-in names ----
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __shared__ static
#define __constant__ static
#define threadIdx (::resin_emu::mod.L->cur->tid)
#define blockIdx (::resin_emu::mod.L->bidx)
#define blockDim (::resin_emu::mod.L->block)
#define gridDim (::resin_emu::mod.L->grid)
#define warpSize 32
#define __syncthreads() ::resin_emu::sync_threads(__FILE__, __LINE__)
#define __shfl_sync(m, v, ...) ::resin_emu::shfl_call(::resin_emu::kIdx, (m), (v), __FILE__, __LINE__, __VA_ARGS__)
#define __shfl_xor_sync(m, v, ...) ::resin_emu::shfl_call(::resin_emu::kXor, (m), (v), __FILE__, __LINE__, __VA_ARGS__)
#define __shfl_up_sync(m, v, ...) ::resin_emu::shfl_call(::resin_emu::kUp, (m), (v), __FILE__, __LINE__, __VA_ARGS__)
#define __shfl_down_sync(m, v, ...) ::resin_emu::shfl_call(::resin_emu::kDown, (m), (v), __FILE__, __LINE__, __VA_ARGS__)
#define __ballot_sync(m, p) \
  ((unsigned)::resin_emu::warp_op(::resin_emu::kBallot, (m), (p) ? 1ull : 0ull, 0, 32, __FILE__, __LINE__))
#define __any_sync(m, p) \
  ((int)::resin_emu::warp_op(::resin_emu::kAny, (m), (p) ? 1ull : 0ull, 0, 32, __FILE__, __LINE__))
#define __all_sync(m, p) \
  ((int)::resin_emu::warp_op(::resin_emu::kAll, (m), (p) ? 1ull : 0ull, 0, 32, __FILE__, __LINE__))
#define __syncwarp(...) \
  ((void)::resin_emu::warp_op(::resin_emu::kSyncWarp, ::resin_emu::warp_mask(__VA_ARGS__), 0, 0, 32, __FILE__, __LINE__))
#define atomicAdd(p, v) ::resin_emu::atomic_add((p), (v))
#define atomicMax(p, v) ::resin_emu::atomic_max((p), (v))
#define atomicMin(p, v) ::resin_emu::atomic_min((p), (v))
#define atomicExch(p, v) ::resin_emu::atomic_exch((p), (v))
#define atomicCAS(p, c, v) ::resin_emu::atomic_cas((p), (c), (v))
#define __float_as_uint(f) ::resin_emu::f2u(f)
#define __uint_as_float(u) ::resin_emu::u2f(u)
#define __float_as_int(f) ::resin_emu::f2i(f)
#define __int_as_float(u) ::resin_emu::i2f(u)
#define __double_as_longlong(d) ::resin_emu::d2ll(d)
#define __longlong_as_double(u) ::resin_emu::ll2d(u)
#define rsqrtf(x) ::resin_emu::rsqrt(x)
#define __expf(x) expf(x)
#define __logf(x) logf(x)
#define __fdividef(a, b) ((a) / (b))
#define __ldg(p) (*(p))
#define __trap() (::resin_emu::fail("__trap() in block (%u,%u,%u) thread %u", blockIdx.x, blockIdx.y, blockIdx.z, ::resin_emu::mod.L->cur->lin), ::resin_emu::fail_fiber())
#define RESIN_EMU_DYN_SHARED __attribute__((aligned(16)))
#define RESIN_EMU_DYN_BYTES (::resin_emu::kDynBytes)

namespace resin_emu {
template <class T, class... W>
inline T shfl_call(int kind, unsigned mask, T v, const char* file, int line, int arg, W... width) {
  int w = 32;
  if constexpr (sizeof...(W) > 0) w = (int)(width + ...);
  return shfl(kind, mask, v, arg, w, file, line);
}
inline unsigned warp_mask() { return 0xffffffffu; }
inline unsigned warp_mask(unsigned m) { return m; }
}  // namespace resin_emu

#pragma GCC visibility pop

// The C ABI every module exports (its definitions follow the kernels, in the registration
// core/cudart/emu.Build appends).
extern "C" __attribute__((visibility("default"))) int resin_emu_launch(
    const char* kernel, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
    unsigned bz, unsigned dyn_shmem_bytes, void** params, int schedule, unsigned long long seed,
    char* err, int errlen);
extern "C" __attribute__((visibility("default"))) int resin_emu_has_kernel(const char* kernel);
extern "C" __attribute__((visibility("default"))) void resin_emu_stats(unsigned long long out[8]);
// resin_emu_param_sizes writes the byte sizes of kernel's parameters (at most max) to out
// and returns how many it takes, or -1 for a kernel the module does not define.
extern "C" __attribute__((visibility("default"))) int resin_emu_param_sizes(const char* kernel,
                                                                             unsigned* out, int max);

#define RESIN_EMU_EXPORTS                                                                       \
  extern "C" int resin_emu_launch(const char* kernel, unsigned gx, unsigned gy, unsigned gz,    \
                                  unsigned bx, unsigned by, unsigned bz, unsigned dyn,          \
                                  void** params, int schedule, unsigned long long seed,         \
                                  char* err, int errlen) {                                      \
    return ::resin_emu::launch(kernel, uint3{gx, gy, gz}, uint3{bx, by, bz}, dyn, params,       \
                               schedule, seed, err, errlen);                                    \
  }                                                                                             \
  extern "C" int resin_emu_has_kernel(const char* kernel) {                                     \
    if (!kernel) return 0;                                                                      \
    for (int i = 0; i < ::resin_emu::mod.nkernels; i++)                                         \
      if (strcmp(::resin_emu::mod.kernels[i].name, kernel) == 0) return 1;                      \
    return 0;                                                                                   \
  }                                                                                             \
  extern "C" int resin_emu_param_sizes(const char* kernel, unsigned* out, int max) {           \
    if (!kernel) return -1;                                                                     \
    for (int i = 0; i < ::resin_emu::mod.nkernels; i++)                                         \
      if (strcmp(::resin_emu::mod.kernels[i].name, kernel) == 0)                                \
        return ::resin_emu::mod.kernels[i].sizes(out, max);                                     \
    return -1;                                                                                  \
  }                                                                                             \
  extern "C" void resin_emu_stats(unsigned long long out[8]) {                                  \
    pthread_mutex_lock(&::resin_emu::mod.mu);                                                   \
    const ::resin_emu::Stats& s = ::resin_emu::mod.stats;                                       \
    unsigned long long v[8] = {s.launches, s.blocks, s.threads, s.barriers, s.shuffles,         \
                               s.atomics, 0, 0};                                                \
    memcpy(out, v, sizeof v);                                                                   \
    pthread_mutex_unlock(&::resin_emu::mod.mu);                                                 \
  }

#endif  // RESIN_CUDA_EMU_H
