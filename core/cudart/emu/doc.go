// Package emu is Resin's emulated CUDA device for kernels: the project's .cu sources,
// unmodified, compiled as host C++ with g++ and run on the CPU under an emulation of the
// CUDA execution model, so that GPU code is executed and checked on machines without a
// GPU (CI included).
//
// Build compiles a source (as NVRTC would get it, prelude inlined) with the shim
// cuda_emu.h force-included and -D__CUDACC_RTC__, so prelude.cuh takes its NVRTC branch
// and finds CUDA's built-in names defined by the shim; it appends a registration for each
// extern "C" kernel (a trampoline that unpacks cuLaunchKernel's void** parameters into
// the kernel's own parameter types). Modules are content-addressed in CacheDir. Open
// loads one with dlopen (purego: CGO_ENABLED=0 builds keep working) and Module.Launch
// runs a grid to its end. Every module exports the same C ABI (resin_emu_launch,
// resin_emu_has_kernel, resin_emu_stats), which the emulated driver library calls too.
//
// # Execution model
//
// Each CUDA thread of a block is a fiber with its own 64 KiB stack (a guard page below
// it, a canary checked after every block); the blocks of a grid run one after another on
// the calling OS thread, and a module runs one launch at a time. A fiber runs until it
// reaches __syncthreads, a warp operation (__shfl*_sync, __ballot_sync, __syncwarp, ...)
// or its end; then the schedule picks the next runnable fiber:
//
//	Forward    thread 0 to its next barrier, then thread 1, ...; blocks in order
//	Reverse    the last thread first; blocks in reverse order
//	Random     a seeded random runnable thread each time; blocks in a seeded order
//	WarpAhead  one warp (chosen by the seed) runs to its barrier before any other thread
//
// A correct kernel writes the same bits under every schedule; a read of another thread's
// write without a barrier between gives different results under Forward and Reverse.
// Atomics are plain read-modify-writes (fibers switch only at barriers and warp
// operations). Shared memory (the module's block-scope statics, found in its symbol
// table, and extern __shared__ arrays) is filled with 0xFF bytes before every block:
// NaN as a float, -1 as an integer, so a read of what no thread wrote shows.
//
// Checks a GPU would not give, each an error from Launch naming the block, the thread
// and the source lines: a barrier reached by the block's threads at more than one call
// site; a thread that exits while others wait at a barrier; a warp operation whose mask
// does not name exactly the lanes that reach it at one call site (a full-mask shuffle in
// a warp of fewer than 32 threads included), or that reads a lane outside its mask;
// deadlock (every live fiber blocked); a fiber near the end of its stack; a launch shape
// a GPU refuses (more than 1024 threads, a zero dimension, grid y or z above 65535,
// more dynamic shared memory than the module holds).
//
// For AddressSanitizer and UBSan, BuildProgram links a source with a small driver into
// an executable (a sanitizer runtime cannot be loaded into a Go test process without
// LD_PRELOAD) and RunScript runs a Script of launches there, each buffer allocated at its
// exact size so a read past its end is reported.
//
// # What a green run proves
//
// That the kernels index correctly (every element of the output is written from the
// elements the reference reads, for every tail that is not a multiple of the block size,
// and every branch the test shapes reach); that every barrier is reached by every thread
// and every warp operation by every lane of its mask, at one site; that the result does
// not depend on the order in which threads run between barriers or on the order of
// blocks; that no kernel reads shared memory nobody wrote; the numerics of the kernels'
// own float32 arithmetic to the ulps the tests state, with the host's libm for expf,
// logf and sqrtf; and the host logic around the launches (grids, parameter packing,
// workspaces) that the tests drive through the production launchers.
//
// The kernel tests (core/kernels/cuda emu_*_test.go, models/*/kernels emu_test.go) state
// their numerics against core/kernels/ref or a float64 reference: bit-exact where the
// kernel's arithmetic is the reference's (rotary embeddings, gathers, the residual adds
// and bf16 roundings of exact sums); |got - want| <= tol·(1 + |want|) with tol from 1e-6
// to 2e-5 for the float32 reductions, whose order differs from the reference's, and 8e-3
// for bf16 outputs (half a bf16 ulp, 2^-9, plus the accumulation); and for device
// sampling the same tokens, logprobs to 2e-5 and the same alternatives as engine.Sampler. A full run of core/kernels/cuda's tests also
// fails when some kernel entry point never ran on the emulated device, and prints the
// emulated time and counts.
//
// # What it cannot catch
//
// The GPU memory model (a missing __threadfence, visibility between blocks, volatile and
// weak loads), races between blocks (blocks never overlap here), anything about timing,
// occupancy, register pressure, spills, coalescing or bank conflicts; the device's own
// expf, rsqrtf and logf (their ulps differ from the host libm's) and the FMA contraction
// NVRTC applies by default (here every a*b+c rounds twice: -ffp-contract=off); warp
// divergence semantics beyond the explicit masks (independent thread scheduling on Volta
// and later is modelled only at barriers and warp operations); and resource limits such
// as 48 KiB of static shared memory per block.
package emu
