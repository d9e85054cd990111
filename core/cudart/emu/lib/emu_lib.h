// emu_lib.h: the state shared by the emulated CUDA libraries (libcuda, NVRTC, cuBLASLt,
// NCCL) that core/cudart loads when RESIN_CUDA=emulate or --device cuda-emu selects the
// emulated device. The four are built by g++ into one shared library, so that a stream
// capture started through the driver API also records the cuBLASLt and NCCL calls queued
// on that stream.
//
// Execution model: work queued on a created stream waits there, in order, until the host
// synchronises with the stream (cuStreamSynchronize, an event's query or synchronize, a
// stream waiting on one of its events, cuCtxSynchronize, cuMemFree), and then runs on the
// thread that waits, as a GPU would have run it meanwhile; Config.defer off runs it when
// it is queued. Work on the legacy stream runs at once. Each emulated device has one
// context; device memory is host memory. Kernels run in the modules the emulated NVRTC
// builds (core/cudart/emu's fiber runtime), launched through the module ABI
// resin_emu_launch. During a stream capture, work is recorded instead, and cuGraphLaunch
// queues the recorded work on its stream.
#ifndef RESIN_EMU_LIB_H
#define RESIN_EMU_LIB_H

#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

namespace resin_emu {

typedef int Result;  // CUresult

// CUresult codes the emulated driver returns.
enum : int {
  kSuccess = 0,
  kInvalidValue = 1,
  kOutOfMemory = 2,
  kNotInitialized = 3,
  kInvalidContext = 201,
  kInvalidImage = 200,
  kInvalidHandle = 400,
  kNotFound = 500,
  kNotReady = 600,
  kLaunchOutOfResources = 701,
  kLaunchFailed = 719,
  kNotSupported = 801,
  kCaptureUnsupported = 900,
  kCaptureInvalidated = 901,
  kCaptureUnmatched = 903,
  kCaptureWrongThread = 906,
  kIllegalState = 401,
  kUnknown = 999,
};

// A recorded piece of stream work: run() does it. Kernel launches, copies, memsets,
// GEMMs and collectives all become one Op, so a graph is a list of them.
struct Op {
  std::string what;  // for errors: "kernel resin_rmsnorm", "memcpy HtoD", ...
  std::function<Result()> run;
};

struct Graph {
  std::vector<Op> ops;
};

struct Stream {
  bool capturing = false;
  bool invalidated = false;
  int mode = 0;
  Graph* graph = nullptr;
  int device = 0;
  // Work queued and not yet run (Config.defer): it runs, in order, when the host waits
  // for the stream (a synchronize, an event the host or another stream waits on).
  std::mutex mu;
  std::vector<Op> pending;
};

// Flush runs the work queued on s and returns the first failure (later work is dropped,
// as a GPU's faulted context would not run it).
Result Flush(Stream* s);

// Deferring reports whether stream work on s is queued rather than run at once.
bool Deferring(void* stream);

// Submit runs op now, queues it (Config.defer, on a created stream), or records it when s
// is capturing. It returns the op's result (or success once queued or recorded).
Result Submit(void* stream, Op op);

// StreamCapturing reports whether s records instead of running.
bool StreamCapturing(void* stream);

// CaptureCheckUnsafe is called by calls a capture forbids on the capturing thread
// (allocation, synchronous copies, synchronisation): it invalidates the thread's
// captures and returns kCaptureUnsupported, or kSuccess when none is running here.
Result CaptureCheckUnsafe();

// SetLaunchError keeps the detail of the last failed launch on this thread, which
// cuGetErrorString returns with the code.
void SetLaunchError(const std::string& msg);

// DeviceMemoryKnown reports whether [p, p+n) lies inside one live device allocation or
// registered or pinned host buffer; copies check their ranges with it.
bool DeviceRange(uintptr_t p, size_t n);
bool HostPinned(const void* p, size_t n);

// Config is what core/cudart set through resin_emu_configure.
struct Config {
  std::string build;       // shell command building a kernel module: {src} {out} {name}
  std::string module_dir;  // where built modules go
  int schedule = 0;        // the emulator's thread schedule (module ABI)
  unsigned long long seed = 1;
  size_t memory = 4ull << 30;  // bytes the device reports
  int sms = 8;
  int devices = 1;  // emulated GPUs (ordinals 0..devices-1)
  bool poison = false;  // fill new device allocations with 0xff bytes
  // Queue work on created streams until the host waits for it, as a GPU does, so that a
  // host reading a result before it synchronises reads what was there before.
  bool defer = true;
};
Config& Cfg();
std::mutex& Mu();

}  // namespace resin_emu

#endif
