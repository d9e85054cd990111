package cudart

import (
	"errors"
	"fmt"
)

var (
	// ErrNoCUDA reports that the CUDA driver (libcuda.so.1) could not be loaded, or that it
	// found no GPU.
	ErrNoCUDA = errors.New("cudart: CUDA driver not available")
	// ErrNoNVRTC reports that NVRTC (libnvrtc.so) could not be loaded.
	ErrNoNVRTC = errors.New("cudart: NVRTC not available")
	// ErrNoCUBLAS reports that cuBLASLt (libcublasLt.so) could not be loaded.
	ErrNoCUBLAS = errors.New("cudart: cuBLASLt not available")
	// ErrNoNCCL reports that NCCL (libnccl.so.2) could not be loaded.
	ErrNoNCCL = errors.New("cudart: NCCL not available")
	// ErrMissingSymbol reports that a library was loaded but lacks a function Resin needs
	// (usually a library older than the API it uses).
	ErrMissingSymbol = errors.New("cudart: symbol missing from library")
	// ErrClosed reports a call on a Device, Module, buffer or handle already released.
	ErrClosed = errors.New("cudart: use after close")
	// ErrCompile reports that NVRTC rejected a kernel source; the error text holds its log.
	ErrCompile = errors.New("cudart: kernel compile failed")
)

// Error is a failed call into a CUDA library.
type Error struct {
	Lib  string // "cuda", "nvrtc", "cublasLt", "nccl"
	Call string // the C function, e.g. "cuMemAlloc_v2"
	Code int    // the library's status code
	Name string // the status name (CUDA_ERROR_OUT_OF_MEMORY), when the library gives one
	Msg  string // the library's description of the status
}

func (e *Error) Error() string {
	name := e.Name
	if name == "" {
		name = fmt.Sprintf("status %d", e.Code)
	}
	if e.Msg != "" {
		return fmt.Sprintf("%s: %s: %s (%s)", e.Lib, e.Call, name, e.Msg)
	}
	return fmt.Sprintf("%s: %s: %s", e.Lib, e.Call, name)
}
