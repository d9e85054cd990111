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
// The driver API is reached through a Device: every call for a device runs on one OS
// thread locked to it, with the device's primary context current there (Device.Do).
// Around the bindings sit the kernel cache shared by every model and process
// (KernelCache), GPU and NUMA topology from sysfs (ReadTopology, BindNode), a device
// memory arena for core/kvslab (DeviceArena) and CUDA graphs (Ctx.BeginCapture).
package cudart
