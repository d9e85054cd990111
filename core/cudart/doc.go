// Package cudart drives NVIDIA GPUs from Go without cgo: the CUDA driver API, NVRTC,
// cuBLASLt and NCCL are opened at run time with dlopen (github.com/ebitengine/purego), so
// the module builds with CGO_ENABLED=0 and runs, with clear errors, on machines that have
// no CUDA at all.
//
// Libraries load lazily on first use. A library that cannot be found returns an error that
// matches ErrNoCUDA, ErrNoNVRTC, ErrNoCUBLAS or ErrNoNCCL with errors.Is; a symbol missing
// from a library found returns ErrMissingSymbol; a CUDA call that fails returns an *Error
// carrying the call, the status code and the library's own name and text for it.
// RESIN_CUDA_LIB_DIR names a directory searched before the system's (RESIN_NVRTC_LIB may
// name libnvrtc.so itself).
//
// RESIN_CUDA=emulate (or Emulate, before any call; `--device cuda-emu`) selects the
// emulated device instead: the four libraries are one library built with g++ from
// emu/lib, which runs every kernel on the CPU in core/cudart/emu's fiber emulator, a
// stream's work when the host synchronises with it, GEMMs in float32 and collectives
// between ranks of the process.
// Everything above the bindings (Device, Blas, graphs, the GPU runner) runs unchanged on
// it. It is only ever chosen explicitly, never in place of a missing GPU. Its kernels are
// keyed apart from a GPU's in the kernel cache (Compiler "resin-emu <toolchain>").
// RESIN_EMU_SCHEDULE, RESIN_EMU_SEED, RESIN_EMU_DEFER, RESIN_EMU_POISON, RESIN_EMU_DEVICES
// and RESIN_EMU_MEMORY tune it (emuConfig). Beyond the kernels' own checks
// (core/cudart/emu), a green run on it shows the host side against the driver's rules:
// launch shapes and shared-memory opt-ins a GPU accepts, copies, memsets and GEMMs inside
// live allocations, what a thread-local capture allows (no allocation, synchronisation,
// legacy-stream work or pageable copy) and that replays use the captured parameters,
// results read only after the host synchronised with their stream. It cannot show
// overlap between streams or with the host (queued work runs when the host waits, in
// stream order), cuBLASLt's own summation order (the emulated GEMM sums k in order in
// float32) or anything about speed.
//
// The driver API is reached through a Device: every call for a device runs on one OS
// thread locked to it, with the device's primary context current there (Device.Do).
// Around the bindings sit the kernel cache shared by every model and process
// (KernelCache), GPU and NUMA topology from sysfs (ReadTopology, BindNode), a device
// memory arena for core/kvslab (DeviceArena) and CUDA graphs (Ctx.BeginCapture).
//
// What a GPU runner builds on:
//   - Stream order. A runner queues everything on its own stream: Launch, the Async copies
//     (UploadAsync, DownloadAsync, MemsetAsync), Blas.Gemm, LaunchGraph, and
//     DeviceArena.Copy once SetStream names that stream. The synchronous copies run on the
//     legacy stream, which does not order against non-blocking streams; they are for
//     loading and tests. Fences (NewFence, Wait, Query, SyncEvent) order pinned-buffer
//     reuse without waiting on the whole device.
//   - No allocation per step: Launch, LaunchGraph, GraphCache.Replay and a Blas.Gemm whose
//     plan is cached allocate nothing (their C-call arguments live in Args, GraphExec and
//     Blas).
//   - cuBLASLt GEMMs (GemmSpec): bf16 inputs, fp32 compute, bf16 or fp32 output, plans
//     keyed by shape, types and pointer alignment in a bounded LRU, one preallocated
//     workspace.
//   - CUDA graphs: Ctx.Capture records in thread-local mode (other devices' threads are
//     undisturbed) and ends and discards a failed capture (AbortCapture), leaving the stream
//     usable; GraphCache keeps executable graphs per decode or prefill bucket (GraphKey;
//     engine.PickBucket chooses the bucket) with LRU eviction.
//   - NUMA: ParseNUMAMode reads --numa auto|off|N, PlanNUMA decides and explains,
//     BindNUMA applies (CPU affinity of every thread, preferred memory node of the caller
//     and of device threads) and Ctx.AllocHostOn places pinned buffers on the node.
//   - Versions: CheckNVRTCDriver refuses an NVRTC newer than the driver (ErrNVRTCTooNew),
//     and a stale RESIN_NVRTC_LIB falls back to the search order with a warning
//     (NVRTCWarning).
package cudart
