// driver.cpp: the emulated CUDA driver API, the subset core/cudart binds (driver.go,
// memory.go, stream.go, graph.go, module.go), with the same C signatures.
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <utime.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <set>
#include <thread>

#include "emu_lib.h"

using namespace resin_emu;

typedef unsigned long long CUdeviceptr;

namespace resin_emu {

Config& Cfg() {
  static Config c;
  return c;
}

std::mutex& Mu() {
  static std::mutex m;
  return m;
}

namespace {

// The module ABI of core/cudart/emu.
typedef int (*LaunchFn)(const char* kernel, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                        unsigned bz, unsigned dyn_shmem_bytes, void** params, int schedule,
                        unsigned long long seed, char* err, int errlen);
typedef int (*HasFn)(const char* kernel);
typedef void (*StatsFn)(unsigned long long out[8]);
typedef int (*ParamSizesFn)(const char* kernel, unsigned* sizes, int max);

struct Module {
  void* dl = nullptr;
  std::string path;
  LaunchFn launch = nullptr;
  HasFn has = nullptr;
  StatsFn stats = nullptr;
  ParamSizesFn params = nullptr;
};

struct Function {
  Module* mod;
  std::string name;
  std::vector<unsigned> param_sizes;
  bool sizes_known = false;  // the module told param_sizes (a kernel may take none)
  int max_dyn_shared = 48 << 10;
};

struct Event {
  unsigned flags = 0;
  bool recorded = false;
  double ms = 0;
  Stream* stream = nullptr;  // where it was last recorded (nullptr: the legacy stream)
};

struct GraphExec {
  std::vector<Op> ops;
};

const int kMaxSharedOptin = 227 << 10;  // an H100's opt-in shared memory per block

bool g_inited = false;
// The emulated devices (Config.devices of them) share the host's memory; each has a
// primary context and its own allocation count against Config.memory.
const int kMaxDevices = 16;
int g_ctx[kMaxDevices];
size_t g_used[kMaxDevices];
std::map<uintptr_t, int> g_owner;  // device allocation -> the device it counts against
thread_local int tl_device = 0;    // the device of the context current on this thread
std::map<uintptr_t, size_t> g_device;   // device allocations: start -> size
std::map<uintptr_t, size_t> g_pinned;   // pinned or registered host memory
std::set<uintptr_t> g_registered;       // the g_pinned entries cuMemHostRegister made
std::map<uintptr_t, bool> g_mapped;     // device allocations made with mmap
std::set<Module*> g_modules;
std::set<Stream*> g_streams;
thread_local std::vector<Stream*> tl_captures;  // streams this thread is capturing
thread_local std::string tl_launch_error;

double nowMs() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

bool inRange(const std::map<uintptr_t, size_t>& m, uintptr_t p, size_t n) {
  auto it = m.upper_bound(p);
  if (it == m.begin()) return false;
  --it;
  return p >= it->first && p + n <= it->first + it->second && p + n >= p;
}

// legacyUnsafe is the check for work on the legacy stream (0), which a capture forbids on
// the capturing thread.
Result legacyUnsafe(void* stream) {
  if (stream == nullptr) return CaptureCheckUnsafe();
  return kSuccess;
}

}  // namespace

bool DeviceRange(uintptr_t p, size_t n) {
  std::lock_guard<std::mutex> l(Mu());
  return inRange(g_device, p, n);
}

bool HostPinned(const void* p, size_t n) {
  std::lock_guard<std::mutex> l(Mu());
  return inRange(g_pinned, (uintptr_t)p, n);
}

bool StreamCapturing(void* stream) {
  if (stream == nullptr) return false;
  return ((Stream*)stream)->capturing;
}

Result CaptureCheckUnsafe() {
  bool any = false;
  for (Stream* s : tl_captures) {
    if (s->mode == 2) continue;  // relaxed
    s->invalidated = true;
    any = true;
  }
  if (!any) return kSuccess;
  SetLaunchError("emulated device: a call that synchronises, allocates or uses the legacy stream ran on a thread capturing a stream");
  return kCaptureUnsupported;
}

Result Submit(void* stream, Op op) {
  if (stream != nullptr) {
    Stream* s = (Stream*)stream;
    if (s->capturing) {
      if (s->invalidated) return kCaptureInvalidated;
      s->graph->ops.push_back(std::move(op));
      return kSuccess;
    }
    if (Cfg().defer) {
      std::lock_guard<std::mutex> l(s->mu);
      s->pending.push_back(std::move(op));
      return kSuccess;
    }
  } else if (Result r = legacyUnsafe(stream)) {
    return r;
  }
  return op.run();
}

bool Deferring(void* stream) { return stream != nullptr && Cfg().defer && !((Stream*)stream)->capturing; }

Result Flush(Stream* s) {
  if (s == nullptr) return kSuccess;
  std::lock_guard<std::mutex> l(s->mu);
  Result r = kSuccess;
  for (Op& op : s->pending) {
    if ((r = op.run()) != kSuccess) break;
  }
  s->pending.clear();
  return r;
}

void SetLaunchError(const std::string& msg) { tl_launch_error = msg; }

}  // namespace resin_emu

// ---- configuration (called by core/cudart right after loading) ----

extern "C" int resin_emu_configure(const char* key, const char* value) {
  std::lock_guard<std::mutex> l(Mu());
  Config& c = Cfg();
  std::string k = key ? key : "", v = value ? value : "";
  if (k == "build") {
    c.build = v;
  } else if (k == "module_dir") {
    c.module_dir = v;
  } else if (k == "schedule") {
    c.schedule = atoi(v.c_str());
  } else if (k == "seed") {
    c.seed = strtoull(v.c_str(), nullptr, 10);
  } else if (k == "memory") {
    c.memory = strtoull(v.c_str(), nullptr, 10);
  } else if (k == "sms") {
    c.sms = atoi(v.c_str());
  } else if (k == "devices") {
    int n = atoi(v.c_str());
    if (n < 1 || n > 16) return kInvalidValue;
    c.devices = n;
  } else if (k == "defer") {
    c.defer = v == "1";
  } else if (k == "poison") {
    c.poison = v == "1";
  } else {
    return kInvalidValue;
  }
  return kSuccess;
}

// resin_emu_device_stats sums the statistics of every loaded module (launches, blocks,
// barriers, ... as the module ABI defines them).
extern "C" void resin_emu_device_stats(unsigned long long out[8]) {
  std::lock_guard<std::mutex> l(Mu());
  for (int i = 0; i < 8; i++) out[i] = 0;
  for (Module* m : g_modules) {
    if (!m->stats) continue;
    unsigned long long s[8] = {0};
    m->stats(s);
    for (int i = 0; i < 8; i++) out[i] += s[i];
  }
}

// ---- initialisation, device, context ----

extern "C" int cuInit(unsigned flags) {
  if (flags != 0) return kInvalidValue;
  g_inited = true;
  return kSuccess;
}

#define NEED_INIT() \
  if (!g_inited) return kNotInitialized

extern "C" int cuDriverGetVersion(int* v) {
  if (!v) return kInvalidValue;
  *v = 12090;
  return kSuccess;
}

extern "C" int cuDeviceGetCount(int* n) {
  NEED_INIT();
  if (!n) return kInvalidValue;
  *n = Cfg().devices;
  return kSuccess;
}

extern "C" int cuDeviceGet(int* dev, int ordinal) {
  NEED_INIT();
  if (!dev) return kInvalidValue;
  if (ordinal < 0 || ordinal >= Cfg().devices) return 101;  // CUDA_ERROR_INVALID_DEVICE
  *dev = ordinal;
  return kSuccess;
}

#define NEED_DEV(d) \
  if ((d) < 0 || (d) >= Cfg().devices) return 101

extern "C" int cuDeviceGetName(char* name, int len, int dev) {
  NEED_INIT();
  NEED_DEV(dev);
  if (!name || len <= 0) return kInvalidValue;
  snprintf(name, len, "Resin emulated CUDA device (CPU)");
  return kSuccess;
}

extern "C" int cuDeviceGetAttribute(int* v, int attr, int dev) {
  NEED_INIT();
  NEED_DEV(dev);
  if (!v) return kInvalidValue;
  switch (attr) {
    case 1: *v = 1024; break;                   // max threads per block
    case 2: *v = 1024; break;                   // max block x
    case 3: *v = 1024; break;                   // max block y
    case 4: *v = 64; break;                     // max block z
    case 5: *v = 0x7fffffff; break;             // max grid x
    case 6: case 7: *v = 65535; break;          // max grid y, z
    case 8: *v = 48 << 10; break;               // shared memory per block
    case 10: *v = 32; break;                    // warp size
    case 13: *v = 1000000; break;               // clock rate, kHz
    case 16: *v = Cfg().sms; break;             // multiprocessors
    case 36: *v = 1000000; break;               // memory clock, kHz
    case 37: *v = 256; break;                   // bus width, bits
    case 38: *v = 4 << 20; break;               // L2 bytes
    case 75: *v = 8; break;                     // compute capability major
    case 76: *v = 0; break;                     // minor
    case 97: *v = kMaxSharedOptin; break;       // opt-in shared memory per block
    default: *v = 0;
  }
  return kSuccess;
}

extern "C" int cuDeviceTotalMem_v2(size_t* bytes, int dev) {
  NEED_INIT();
  NEED_DEV(dev);
  if (!bytes) return kInvalidValue;
  *bytes = Cfg().memory;
  return kSuccess;
}

extern "C" int cuDeviceGetPCIBusId(char* buf, int len, int dev) {
  NEED_INIT();
  NEED_DEV(dev);
  if (!buf || len <= 0) return kInvalidValue;
  // A bus id no sysfs device has: NUMA planning finds no node for it.
  snprintf(buf, len, "0000:%02x:1f.7", 0xff - dev);
  return kSuccess;
}

extern "C" int cuDevicePrimaryCtxRetain(void** ctx, int dev) {
  NEED_INIT();
  NEED_DEV(dev);
  if (!ctx) return kInvalidValue;
  *ctx = &g_ctx[dev];
  return kSuccess;
}

extern "C" int cuDevicePrimaryCtxRelease_v2(int dev) {
  NEED_INIT();
  NEED_DEV(dev);
  return kSuccess;
}

extern "C" int cuCtxSetCurrent(void* ctx) {
  NEED_INIT();
  if (ctx == nullptr) return kSuccess;
  int* c = (int*)ctx;
  if (c < g_ctx || c >= g_ctx + Cfg().devices) return kInvalidContext;
  tl_device = (int)(c - g_ctx);
  return kSuccess;
}

namespace {
// flushStreams runs the queued work of every stream (of the current device only, with
// thisDevice), in stream creation order is not promised: streams do not order against
// each other.
Result flushStreams(bool thisDevice) {
  std::vector<Stream*> all;
  {
    std::lock_guard<std::mutex> l(Mu());
    for (Stream* s : g_streams)
      if (!thisDevice || s->device == tl_device) all.push_back(s);
  }
  Result first = kSuccess;
  for (Stream* s : all) {
    Result r = Flush(s);
    if (first == kSuccess) first = r;
  }
  return first;
}
}  // namespace

extern "C" int cuCtxSynchronize() {
  NEED_INIT();
  if (Result r = CaptureCheckUnsafe()) return r;
  return flushStreams(true);
}

// ---- memory ----

extern "C" int cuMemGetInfo_v2(size_t* free_, size_t* total) {
  NEED_INIT();
  std::lock_guard<std::mutex> l(Mu());
  if (free_) *free_ = Cfg().memory - g_used[tl_device];
  if (total) *total = Cfg().memory;
  return kSuccess;
}

extern "C" int cuMemAlloc_v2(CUdeviceptr* p, size_t n) {
  NEED_INIT();
  if (!p || n == 0) return kInvalidValue;
  if (Result r = CaptureCheckUnsafe()) return r;
  size_t rounded = (n + 255) & ~size_t(255);
  std::lock_guard<std::mutex> l(Mu());
  if (g_used[tl_device] + rounded > Cfg().memory) return kOutOfMemory;
  void* m;
  bool mapped = rounded >= (64 << 10);
  if (mapped) {
    // Large allocations are lazily zeroed pages, as fresh GPU memory usually reads.
    m = mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return kOutOfMemory;
  } else {
    m = aligned_alloc(256, rounded);
    if (!m) return kOutOfMemory;
    memset(m, 0, rounded);
  }
  if (Cfg().poison) memset(m, 0xff, rounded);
  g_device[(uintptr_t)m] = rounded;
  g_mapped[(uintptr_t)m] = mapped;
  g_used[tl_device] += rounded;
  g_owner[(uintptr_t)m] = tl_device;
  *p = (CUdeviceptr)(uintptr_t)m;
  return kSuccess;
}

extern "C" int cuMemFree_v2(CUdeviceptr p) {
  NEED_INIT();
  if (p == 0) return kSuccess;
  flushStreams(false);  // cuMemFree waits for the work that may still use the memory
  std::lock_guard<std::mutex> l(Mu());
  auto it = g_device.find((uintptr_t)p);
  if (it == g_device.end()) return kInvalidValue;
  if (g_mapped[it->first]) {
    munmap((void*)it->first, it->second);
  } else {
    free((void*)it->first);
  }
  g_used[g_owner[it->first]] -= it->second;
  g_owner.erase(it->first);
  g_mapped.erase(it->first);
  g_device.erase(it);
  return kSuccess;
}

extern "C" int cuMemAllocHost_v2(void** p, size_t n) {
  NEED_INIT();
  if (!p || n == 0) return kInvalidValue;
  if (Result r = CaptureCheckUnsafe()) return r;
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  void* m = aligned_alloc(page, (n + page - 1) / page * page);
  if (!m) return kOutOfMemory;
  std::lock_guard<std::mutex> l(Mu());
  g_pinned[(uintptr_t)m] = n;
  *p = m;
  return kSuccess;
}

extern "C" int cuMemFreeHost(void* p) {
  NEED_INIT();
  std::lock_guard<std::mutex> l(Mu());
  auto it = g_pinned.find((uintptr_t)p);
  // Registered memory is the caller's (mmap'ed, Go's): the driver refuses to free it.
  if (it == g_pinned.end() || g_registered.count(it->first)) return kInvalidValue;
  g_pinned.erase(it);
  free(p);
  return kSuccess;
}

extern "C" int cuMemHostRegister_v2(void* p, size_t n, unsigned flags) {
  NEED_INIT();
  (void)flags;
  if (!p || n == 0) return kInvalidValue;
  std::lock_guard<std::mutex> l(Mu());
  if (inRange(g_pinned, (uintptr_t)p, 1)) return 712;  // CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED
  g_pinned[(uintptr_t)p] = n;
  g_registered.insert((uintptr_t)p);
  return kSuccess;
}

extern "C" int cuMemHostUnregister(void* p) {
  NEED_INIT();
  std::lock_guard<std::mutex> l(Mu());
  auto it = g_pinned.find((uintptr_t)p);
  // cuMemAllocHost'd memory was never registered: cuMemFreeHost is its release.
  if (it == g_pinned.end() || !g_registered.count(it->first)) return 713;  // CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED
  g_registered.erase(it->first);
  g_pinned.erase(it);
  return kSuccess;
}

namespace {

// The copies and memsets check their device ranges against the live allocations: an
// address outside them is the illegal address a GPU would fault on.
// zeroPages clears [p, p+n) of a mapped allocation by handing its whole pages back to
// the kernel (they read as zero again, and cost nothing until touched) and memsetting the
// ends: clearing a large KV arena touches no memory.
bool zeroPages(uintptr_t p, size_t n) {
  {
    std::lock_guard<std::mutex> l(Mu());
    auto it = g_device.upper_bound(p);
    if (it == g_device.begin()) return false;
    --it;
    if (!g_mapped[it->first]) return false;
  }
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  uintptr_t a = (p + page - 1) / page * page, b = (p + n) / page * page;
  if (b <= a) return false;
  if (madvise((void*)a, b - a, MADV_DONTNEED) != 0) return false;
  memset((void*)p, 0, a - p);
  memset((void*)b, 0, p + n - b);
  return true;
}

Op memsetOp(CUdeviceptr p, unsigned char v, size_t n) {
  return Op{"memset", [=]() -> Result {
              if (!DeviceRange(p, n)) return kInvalidValue;
              if (v == 0 && n >= (1 << 20) && zeroPages(p, n)) return kSuccess;
              memset((void*)(uintptr_t)p, v, n);
              return kSuccess;
            }};
}

Op copyOp(const char* what, void* dst, const void* src, size_t n, bool dstDev, bool srcDev) {
  return Op{what, [=]() -> Result {
              if (dstDev && !DeviceRange((uintptr_t)dst, n)) return kInvalidValue;
              if (srcDev && !DeviceRange((uintptr_t)src, n)) return kInvalidValue;
              memmove(dst, src, n);
              return kSuccess;
            }};
}

// asyncHost checks the host side of an async copy queued on s: a capture records only
// copies from or to pinned memory (a pageable copy cannot be replayed).
Result asyncHost(void* s, const void* h, size_t n) {
  if (StreamCapturing(s) && !HostPinned(h, n)) {
    ((Stream*)s)->invalidated = true;
    return kCaptureUnsupported;
  }
  return kSuccess;
}

}  // namespace

extern "C" int cuMemsetD8_v2(CUdeviceptr p, unsigned char v, size_t n) {
  NEED_INIT();
  return Submit(nullptr, memsetOp(p, v, n));
}

extern "C" int cuMemsetD8Async(CUdeviceptr p, unsigned char v, size_t n, void* s) {
  NEED_INIT();
  return Submit(s, memsetOp(p, v, n));
}

extern "C" int cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t n) {
  NEED_INIT();
  if (Result r = CaptureCheckUnsafe()) return r;
  return copyOp("memcpy HtoD", (void*)(uintptr_t)dst, src, n, true, false).run();
}

extern "C" int cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t n) {
  NEED_INIT();
  if (Result r = CaptureCheckUnsafe()) return r;
  return copyOp("memcpy DtoH", dst, (const void*)(uintptr_t)src, n, false, true).run();
}

extern "C" int cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  NEED_INIT();
  return Submit(nullptr, copyOp("memcpy DtoD", (void*)(uintptr_t)dst, (const void*)(uintptr_t)src, n, true, true));
}

extern "C" int cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t n, void* s) {
  NEED_INIT();
  if (Result r = asyncHost(s, src, n)) return r;
  if (Deferring(s) && !HostPinned(src, n)) {
    // From pageable memory the driver stages the bytes before the call returns: the
    // copy reads them now, whatever the caller writes there afterwards.
    auto staged = std::make_shared<std::vector<char>>((const char*)src, (const char*)src + n);
    void* d = (void*)(uintptr_t)dst;
    return Submit(s, Op{"memcpy HtoD", [=]() -> Result {
                          if (!DeviceRange((uintptr_t)d, n)) return kInvalidValue;
                          memcpy(d, staged->data(), n);
                          return kSuccess;
                        }});
  }
  return Submit(s, copyOp("memcpy HtoD", (void*)(uintptr_t)dst, src, n, true, false));
}

extern "C" int cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t n, void* s) {
  NEED_INIT();
  if (Result r = asyncHost(s, dst, n)) return r;
  Op op = copyOp("memcpy DtoH", dst, (const void*)(uintptr_t)src, n, false, true);
  if (Deferring(s) && !HostPinned(dst, n)) {
    // Into pageable memory the call waits for the copy, so for the stream's work first.
    if (Result r = Flush((Stream*)s)) return r;
    return op.run();
  }
  return Submit(s, std::move(op));
}

extern "C" int cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, void* s) {
  NEED_INIT();
  return Submit(s, copyOp("memcpy DtoD", (void*)(uintptr_t)dst, (const void*)(uintptr_t)src, n, true, true));
}

// CUDA_MEMCPY2D as cuda.h lays it out; the emulation copies between device memory only
// (memory type 2), as core/cudart's CopyDtoD2DAsync asks.
struct Memcpy2D {
  size_t srcXInBytes, srcY;
  int srcMemoryType;
  const void* srcHost;
  CUdeviceptr srcDevice;
  void* srcArray;
  size_t srcPitch;
  size_t dstXInBytes, dstY;
  int dstMemoryType;
  void* dstHost;
  CUdeviceptr dstDevice;
  void* dstArray;
  size_t dstPitch;
  size_t WidthInBytes, Height;
};

// cuMemcpy2DAsync_v2: Height rows of WidthInBytes, each row's bytes checked to lie in one
// device allocation. The parameters are copied at the call, so a captured memcpy node
// replays the addresses of the capture, as a GPU's does.
extern "C" int cuMemcpy2DAsync_v2(const Memcpy2D* p, void* s) {
  NEED_INIT();
  if (!p) return kInvalidValue;
  const int kDevice = 2;
  if (p->srcMemoryType != kDevice || p->dstMemoryType != kDevice) {
    SetLaunchError("emulated device: cuMemcpy2DAsync copies between device memory only");
    return kNotSupported;
  }
  if (p->srcPitch < p->WidthInBytes + p->srcXInBytes || p->dstPitch < p->WidthInBytes + p->dstXInBytes) return kInvalidValue;
  char* dst = (char*)(uintptr_t)p->dstDevice + p->dstY * p->dstPitch + p->dstXInBytes;
  const char* src = (const char*)(uintptr_t)p->srcDevice + p->srcY * p->srcPitch + p->srcXInBytes;
  size_t w = p->WidthInBytes, h = p->Height, dp = p->dstPitch, sp = p->srcPitch;
  return Submit(s, Op{"memcpy 2D DtoD", [=]() -> Result {
                        for (size_t i = 0; i < h; i++) {
                          if (!DeviceRange((uintptr_t)(dst + i * dp), w) || !DeviceRange((uintptr_t)(src + i * sp), w))
                            return kInvalidValue;
                        }
                        for (size_t i = 0; i < h; i++) memmove(dst + i * dp, src + i * sp, w);
                        return kSuccess;
                      }});
}

// ---- streams and events ----

namespace {
bool liveStream(void* s) {
  std::lock_guard<std::mutex> l(Mu());
  return g_streams.count((Stream*)s) > 0;
}
}  // namespace

#define NEED_STREAM(s) \
  if ((s) != nullptr && !liveStream(s)) return kInvalidHandle

extern "C" int cuStreamCreate(void** s, unsigned flags) {
  NEED_INIT();
  (void)flags;
  if (!s) return kInvalidValue;
  Stream* st = new Stream();
  st->device = tl_device;
  std::lock_guard<std::mutex> l(Mu());
  g_streams.insert(st);
  *s = st;
  return kSuccess;
}

extern "C" int cuStreamDestroy_v2(void* s) {
  NEED_INIT();
  if (!s) return kInvalidHandle;
  if (liveStream(s)) Flush((Stream*)s);  // the stream's work still runs, as on a GPU
  std::lock_guard<std::mutex> l(Mu());
  auto it = g_streams.find((Stream*)s);
  if (it == g_streams.end()) return kInvalidHandle;
  Stream* st = *it;
  if (st->capturing) {
    delete st->graph;
  }
  g_streams.erase(it);
  delete st;
  return kSuccess;
}

extern "C" int cuStreamSynchronize(void* s) {
  NEED_INIT();
  NEED_STREAM(s);
  if (StreamCapturing(s)) {
    ((Stream*)s)->invalidated = true;
    return kCaptureUnsupported;
  }
  if (Result r = CaptureCheckUnsafe()) return r;
  return Flush((Stream*)s);
}

extern "C" int cuStreamWaitEvent(void* s, void* e, unsigned flags) {
  NEED_INIT();
  NEED_STREAM(s);
  (void)flags;
  if (!e) return kInvalidHandle;
  // Later work on s follows the event's point: run what its stream queued before it.
  Stream* from = ((Event*)e)->stream;
  if (from != nullptr && from != (Stream*)s && !StreamCapturing(s)) return Flush(from);
  return kSuccess;
}

extern "C" int cuEventCreate(void** e, unsigned flags) {
  NEED_INIT();
  if (!e) return kInvalidValue;
  Event* ev = new Event();
  ev->flags = flags;
  *e = ev;
  return kSuccess;
}

extern "C" int cuEventRecord(void* e, void* s) {
  NEED_INIT();
  NEED_STREAM(s);
  if (!e) return kInvalidHandle;
  Event* ev = (Event*)e;
  if (!StreamCapturing(s)) ev->stream = (Stream*)s;
  return Submit(s, Op{"event record", [ev]() -> Result {
                        ev->recorded = true;
                        ev->ms = nowMs();
                        return kSuccess;
                      }});
}

// cuEventQuery and cuEventSynchronize run the work queued before the event: the
// emulated device finishes work only when the host looks.
extern "C" int cuEventQuery(void* e) {
  NEED_INIT();
  if (!e) return kInvalidHandle;
  return Flush(((Event*)e)->stream);
}

extern "C" int cuEventSynchronize(void* e) {
  NEED_INIT();
  if (!e) return kInvalidHandle;
  if (Result r = CaptureCheckUnsafe()) return r;
  return Flush(((Event*)e)->stream);
}

extern "C" int cuEventElapsedTime(float* ms, void* start, void* end) {
  NEED_INIT();
  if (!ms || !start || !end) return kInvalidHandle;
  Event *a = (Event*)start, *b = (Event*)end;
  if ((a->flags & 2) || (b->flags & 2)) return kInvalidHandle;  // CU_EVENT_DISABLE_TIMING
  if (!a->recorded || !b->recorded) return kNotReady;
  *ms = (float)(b->ms - a->ms);
  return kSuccess;
}

extern "C" int cuEventDestroy_v2(void* e) {
  NEED_INIT();
  if (!e) return kInvalidHandle;
  delete (Event*)e;
  return kSuccess;
}

// ---- modules and launches ----

namespace {

// elfSize returns the length of an ELF64 image from its headers: the end of its section
// header table or of its last segment, whichever is further.
size_t elfSize(const unsigned char* p) {
  if (p[4] != 2) return 0;  // ELFCLASS64 only
  uint64_t shoff, phoff;
  uint16_t shentsize, shnum, phentsize, phnum;
  memcpy(&phoff, p + 0x20, 8);
  memcpy(&shoff, p + 0x28, 8);
  memcpy(&phentsize, p + 0x36, 2);
  memcpy(&phnum, p + 0x38, 2);
  memcpy(&shentsize, p + 0x3a, 2);
  memcpy(&shnum, p + 0x3c, 2);
  size_t end = shoff + (size_t)shentsize * shnum;
  for (int i = 0; i < phnum; i++) {
    const unsigned char* ph = p + phoff + (size_t)i * phentsize;
    uint64_t off, filesz;
    memcpy(&off, ph + 0x08, 8);
    memcpy(&filesz, ph + 0x20, 8);
    if (off + filesz > end) end = off + filesz;
  }
  return end;
}

// contentHash names n bytes at p: two FNV-1a hashes from different bases.
std::string contentHash(const unsigned char* p, size_t n) {
  uint64_t a = 0xcbf29ce484222325ull, b = 0x84222325cbf29ce4ull ^ n;
  for (size_t i = 0; i < n; i++) {
    a = (a ^ p[i]) * 0x100000001b3ull;
    b = (b ^ p[i]) * 0x100000001b3ull;
  }
  char buf[40];
  snprintf(buf, sizeof buf, "%016llx%016llx", (unsigned long long)a, (unsigned long long)b);
  return buf;
}

// writeImage writes the n bytes of a module at p to path, under a temporary name renamed
// into place.
Result writeImage(const std::string& dir, const std::string& path, const unsigned char* p, size_t n) {
  std::string tmpl = path + ".tmp-XXXXXX";
  std::vector<char> tmp(tmpl.begin(), tmpl.end());
  tmp.push_back(0);
  int fd = mkstemp(tmp.data());
  if (fd < 0) {
    SetLaunchError("emulated device: cannot write a module into " + dir);
    return kInvalidImage;
  }
  size_t done = 0;
  while (done < n) {
    ssize_t w = write(fd, p + done, n - done);
    if (w <= 0) break;
    done += (size_t)w;
  }
  close(fd);
  if (done != n || rename(tmp.data(), path.c_str()) != 0) {
    unlink(tmp.data());
    SetLaunchError("emulated device: cannot write the module " + path);
    return kInvalidImage;
  }
  return kSuccess;
}

Result openModule(const std::string& path, Module** out) {
  void* dl = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!dl) {
    const char* e = dlerror();
    SetLaunchError(std::string("emulated device: cannot load module ") + path + ": " + (e ? e : "?"));
    return kInvalidImage;
  }
  Module* m = new Module();
  m->dl = dl;
  m->path = path;
  m->launch = (LaunchFn)dlsym(dl, "resin_emu_launch");
  m->has = (HasFn)dlsym(dl, "resin_emu_has_kernel");
  m->stats = (StatsFn)dlsym(dl, "resin_emu_stats");
  m->params = (ParamSizesFn)dlsym(dl, "resin_emu_param_sizes");
  if (!m->params) m->params = (ParamSizesFn)dlsym(dl, "resin_emu_lib_param_sizes");  // nvrtc.cpp's
  if (!m->launch || !m->has) {
    SetLaunchError("emulated device: " + path + " is not an emulator module (no resin_emu_launch)");
    dlclose(dl);
    delete m;
    return kInvalidImage;
  }
  std::lock_guard<std::mutex> l(Mu());
  g_modules.insert(m);
  *out = m;
  return kSuccess;
}

}  // namespace

extern "C" int cuModuleLoadData(void** mod, const void* image) {
  NEED_INIT();
  if (!mod || !image) return kInvalidValue;
  SetLaunchError("");
  const unsigned char* p = (const unsigned char*)image;
  static const char kRef[] = "RESIN-EMU-MODULE ";
  if (memcmp(p, "\x7f" "ELF", 4) == 0) {
    // The module itself, as the emulated NVRTC returns it: kept in the module directory
    // under a name from its contents (the emulator reads a module's own file), written
    // under a temporary name and renamed into place.
    size_t n = elfSize(p);
    if (n == 0) return kInvalidImage;
    std::string dir = Cfg().module_dir.empty() ? "/tmp" : Cfg().module_dir;
    std::string path = dir + "/image-" + contentHash(p, n) + ".so";
    // Another process's cache prune may delete the file between the write (or the
    // check that it is there) and the dlopen: then it is written again.
    for (int attempt = 0;; attempt++) {
      if (access(path.c_str(), R_OK) == 0) {
        utime(path.c_str(), nullptr);  // recently used: pruned last
      } else if (Result r = writeImage(dir, path, p, n)) {
        return r;
      }
      Module* m = nullptr;
      Result r = openModule(path, &m);
      if (r == kSuccess) {
        *mod = m;
        return kSuccess;
      }
      if (attempt > 0 || access(path.c_str(), F_OK) == 0) return r;
    }
  }
  if (memcmp(p, kRef, sizeof kRef - 1) == 0) {
    std::string path((const char*)p + sizeof kRef - 1);
    while (!path.empty() && (path.back() == '\n' || path.back() == ' ')) path.pop_back();
    utime(path.c_str(), nullptr);  // recently used: pruned last
    Module* m = nullptr;
    if (Result r = openModule(path, &m)) return r;
    *mod = m;
    return kSuccess;
  }
  // PTX or a cubin from a real compiler: nothing the CPU can run.
  SetLaunchError("emulated device: the image is not an emulator module (PTX or a cubin from a real NVRTC?)");
  return kInvalidImage;
}

extern "C" int cuModuleUnload(void* mod) {
  NEED_INIT();
  Module* m = (Module*)mod;
  std::lock_guard<std::mutex> l(Mu());
  if (!g_modules.count(m)) return kInvalidHandle;
  g_modules.erase(m);
  // The library stays mapped and the Module allocated: graphs and queued launches may
  // still hold its functions, and kernels are cheap to keep.
  return kSuccess;
}

extern "C" int cuModuleGetFunction(void** f, void* mod, const char* name) {
  NEED_INIT();
  if (!f || !name) return kInvalidValue;
  Module* m = (Module*)mod;
  {
    std::lock_guard<std::mutex> l(Mu());
    if (!g_modules.count(m)) return kInvalidHandle;
  }
  if (!m->has(name)) return kNotFound;
  Function* fn = new Function{m, name, {}, false, 48 << 10};
  if (m->params) {
    unsigned sizes[64];
    int n = m->params(name, sizes, 64);
    if (n >= 0 && n <= 64) {
      fn->param_sizes.assign(sizes, sizes + n);
      fn->sizes_known = true;
    }
  }
  *f = fn;
  return kSuccess;
}

extern "C" int cuFuncGetAttribute(int* v, int attr, void* f) {
  NEED_INIT();
  if (!v || !f) return kInvalidValue;
  Function* fn = (Function*)f;
  switch (attr) {
    case 0: *v = 1024; break;               // max threads per block
    case 1: *v = 0; break;                  // static shared bytes (not known)
    case 4: *v = 0; break;                  // registers: none on the CPU
    case 8: *v = fn->max_dyn_shared; break; // max dynamic shared bytes
    default: *v = 0;
  }
  return kSuccess;
}

extern "C" int cuFuncSetAttribute(void* f, int attr, int v) {
  NEED_INIT();
  if (!f) return kInvalidValue;
  if (attr == 8) {
    if (v < 0 || v > kMaxSharedOptin) return kInvalidValue;
    ((Function*)f)->max_dyn_shared = v;
  }
  return kSuccess;
}

namespace {

// kernelOp is one launch with its parameters copied, so a graph replays the values of
// the capture (as a GPU's kernel node does) whatever the caller's buffers hold later.
Op kernelOp(Function* fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
            unsigned shmem, void** params, bool copy) {
  struct Launch {
    std::vector<uint64_t> vals;
    std::vector<void*> ptrs;
  };
  auto l = std::make_shared<Launch>();
  void** use = params;
  if (copy) {
    // Each parameter in 8-byte-aligned slots of its own size (a struct may be larger).
    size_t n = fn->param_sizes.size(), words = 0;
    for (unsigned sz : fn->param_sizes) words += (sz + 7) / 8;
    l->vals.resize(words ? words : 1);
    l->ptrs.resize(n ? n : 1);
    for (size_t i = 0, w = 0; i < n; i++) {
      memcpy(&l->vals[w], params[i], fn->param_sizes[i]);
      l->ptrs[i] = &l->vals[w];
      w += (fn->param_sizes[i] + 7) / 8;
    }
    use = l->ptrs.data();
  }
  Config cfg = Cfg();
  return Op{"kernel " + fn->name, [=]() -> Result {
              char err[1024];
              err[0] = 0;
              int r = fn->mod->launch(fn->name.c_str(), gx, gy, gz, bx, by, bz, shmem, copy ? l->ptrs.data() : use,
                                      cfg.schedule, cfg.seed, err, sizeof err);
              if (r != 0) {
                SetLaunchError("kernel " + fn->name + ": " + err);
                return kLaunchFailed;
              }
              return kSuccess;
            }};
}

}  // namespace

extern "C" int cuLaunchKernel(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                              unsigned shmem, void* s, void** params, void** extra) {
  NEED_INIT();
  NEED_STREAM(s);
  if (!f) return kInvalidHandle;
  if (extra != nullptr) return kNotSupported;
  Function* fn = (Function*)f;
  SetLaunchError("");
  if (gx == 0 || gy == 0 || gz == 0 || bx == 0 || by == 0 || bz == 0 || gy > 65535 || gz > 65535 || gx > 0x7fffffffu ||
      bx > 1024 || by > 1024 || bz > 64) {
    return kInvalidValue;
  }
  if ((unsigned long long)bx * by * bz > 1024) return kInvalidValue;
  if (shmem > (unsigned)fn->max_dyn_shared) return kInvalidValue;
  bool capturing = StreamCapturing(s);
  if (!capturing && Deferring(s) && !fn->sizes_known) {
    // Without its parameter sizes a launch cannot keep its values for later: it runs now,
    // after the stream's queued work.
    if (Result r = Flush((Stream*)s)) return r;
    return kernelOp(fn, gx, gy, gz, bx, by, bz, shmem, params, false).run();
  }
  if (capturing && !fn->sizes_known) {
    // Without the kernel's parameter sizes a recorded launch cannot keep its values.
    SetLaunchError("kernel " + fn->name + ": the module does not say its parameter sizes, so it cannot be captured");
    ((Stream*)s)->invalidated = true;
    return kCaptureUnsupported;
  }
  return Submit(s, kernelOp(fn, gx, gy, gz, bx, by, bz, shmem, params, capturing || Deferring(s)));
}

// ---- stream capture and graphs ----

extern "C" int cuStreamBeginCapture_v2(void* s, int mode) {
  NEED_INIT();
  if (!s) return kCaptureUnsupported;
  NEED_STREAM(s);
  Stream* st = (Stream*)s;
  if (st->capturing) return kIllegalState;
  if (mode < 0 || mode > 2) return kInvalidValue;
  st->capturing = true;
  st->invalidated = false;
  st->mode = mode;
  st->graph = new Graph();
  tl_captures.push_back(st);
  return kSuccess;
}

extern "C" int cuStreamEndCapture(void* s, void** g) {
  NEED_INIT();
  NEED_STREAM(s);
  if (!s || !g) return kInvalidValue;
  Stream* st = (Stream*)s;
  *g = nullptr;
  if (!st->capturing) return kIllegalState;
  bool found = false;
  for (size_t i = 0; i < tl_captures.size(); i++) {
    if (tl_captures[i] == st) {
      tl_captures.erase(tl_captures.begin() + i);
      found = true;
      break;
    }
  }
  st->capturing = false;
  Graph* graph = st->graph;
  st->graph = nullptr;
  if (!found) {
    delete graph;
    return kCaptureWrongThread;
  }
  if (st->invalidated) {
    delete graph;
    return kCaptureInvalidated;
  }
  *g = graph;
  return kSuccess;
}

extern "C" int cuStreamIsCapturing(void* s, int* status) {
  NEED_INIT();
  NEED_STREAM(s);
  if (!status) return kInvalidValue;
  if (!s) {
    *status = 0;
    return kSuccess;
  }
  Stream* st = (Stream*)s;
  *status = st->capturing ? (st->invalidated ? 2 : 1) : 0;
  return kSuccess;
}

extern "C" int cuGraphInstantiateWithFlags(void** exec, void* g, unsigned long long flags) {
  NEED_INIT();
  (void)flags;
  if (!exec || !g) return kInvalidValue;
  GraphExec* e = new GraphExec();
  e->ops = ((Graph*)g)->ops;  // the recorded ops share their parameter copies
  *exec = e;
  return kSuccess;
}

extern "C" int cuGraphLaunch(void* exec, void* s) {
  NEED_INIT();
  NEED_STREAM(s);
  if (!exec) return kInvalidHandle;
  GraphExec* e = (GraphExec*)exec;
  if (s != nullptr) {
    // Queued (or run, or recorded into the outer graph of a capture) op by op.
    for (const Op& op : e->ops) {
      if (Result r = Submit(s, op)) return r;
    }
    return kSuccess;
  }
  if (Result r = legacyUnsafe(s)) return r;
  for (const Op& op : e->ops) {
    if (Result r = op.run()) return r;
  }
  return kSuccess;
}

extern "C" int cuGraphExecDestroy(void* exec) {
  NEED_INIT();
  if (!exec) return kInvalidHandle;
  delete (GraphExec*)exec;
  return kSuccess;
}

extern "C" int cuGraphDestroy(void* g) {
  NEED_INIT();
  if (!g) return kInvalidHandle;
  delete (Graph*)g;
  return kSuccess;
}

// ---- errors ----

namespace {
struct ErrText {
  int code;
  const char* name;
  const char* text;
};
const ErrText kErrors[] = {
    {0, "CUDA_SUCCESS", "no error"},
    {1, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {3, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {101, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {200, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {201, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {400, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {401, "CUDA_ERROR_ILLEGAL_STATE", "the operation is not permitted in the current state"},
    {500, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {600, "CUDA_ERROR_NOT_READY", "device not ready"},
    {701, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "too many resources requested for launch"},
    {712, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED", "part or all of the requested memory range is already mapped"},
    {713, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED", "pointer does not correspond to a registered memory region"},
    {719, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
    {801, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {900, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", "operation not permitted when stream is capturing"},
    {901, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED", "operation failed due to a previous error during capture"},
    {903, "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED", "capture was not initiated in this stream"},
    {906, "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD", "attempt to terminate a thread-local capture sequence from another thread"},
    {999, "CUDA_ERROR_UNKNOWN", "unknown error"},
};
thread_local std::string tl_err_text;
}  // namespace

extern "C" int cuGetErrorName(int r, const char** s) {
  if (!s) return kInvalidValue;
  for (const ErrText& e : kErrors) {
    if (e.code == r) {
      *s = e.name;
      return kSuccess;
    }
  }
  *s = nullptr;
  return kInvalidValue;
}

// cuGetErrorString gives the driver's text, with the emulator's own explanation of the
// last failed launch or module load on this thread for the codes those return.
extern "C" int cuGetErrorString(int r, const char** s) {
  if (!s) return kInvalidValue;
  for (const ErrText& e : kErrors) {
    if (e.code == r) {
      if ((r == kLaunchFailed || r == kInvalidImage || r == kCaptureUnsupported) && !tl_launch_error.empty()) {
        tl_err_text = std::string(e.text) + " (" + tl_launch_error + ")";
        *s = tl_err_text.c_str();
        return kSuccess;
      }
      *s = e.text;
      return kSuccess;
    }
  }
  *s = nullptr;
  return kInvalidValue;
}
