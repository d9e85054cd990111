package cudart

import (
	"fmt"
	"sync"
	"unsafe"
)

// driverAPI holds the CUDA driver functions Resin calls. Each returns a CUresult.
type driverAPI struct {
	cuInit                    func(flags uint32) int32
	cuDriverGetVersion        func(v *int32) int32
	cuDeviceGetCount          func(n *int32) int32
	cuDeviceGet               func(dev *int32, ordinal int32) int32
	cuDeviceGetName           func(name *byte, n int32, dev int32) int32
	cuDeviceGetAttribute      func(v *int32, attr int32, dev int32) int32
	cuDeviceTotalMem          func(bytes *uint64, dev int32) int32
	cuDeviceGetPCIBusId       func(buf *byte, n int32, dev int32) int32
	cuDevicePrimaryCtxRetain  func(ctx *uintptr, dev int32) int32
	cuDevicePrimaryCtxRelease func(dev int32) int32
	cuCtxSetCurrent           func(ctx uintptr) int32
	cuCtxSynchronize          func() int32
	cuMemGetInfo              func(free, total *uint64) int32
	cuMemAlloc                func(p *uintptr, size uint64) int32
	cuMemFree                 func(p uintptr) int32
	cuMemAllocHost            func(p *unsafe.Pointer, size uint64) int32
	cuMemFreeHost             func(p unsafe.Pointer) int32
	cuMemHostRegister         func(p unsafe.Pointer, size uint64, flags uint32) int32
	cuMemHostUnregister       func(p unsafe.Pointer) int32
	cuMemsetD8                func(p uintptr, v uint8, n uint64) int32
	cuMemsetD8Async           func(p uintptr, v uint8, n uint64, s uintptr) int32
	cuMemcpyHtoD              func(dst uintptr, src unsafe.Pointer, n uint64) int32
	cuMemcpyDtoH              func(dst unsafe.Pointer, src uintptr, n uint64) int32
	cuMemcpyDtoD              func(dst, src uintptr, n uint64) int32
	cuMemcpyHtoDAsync         func(dst uintptr, src unsafe.Pointer, n uint64, s uintptr) int32
	cuMemcpyDtoHAsync         func(dst unsafe.Pointer, src uintptr, n uint64, s uintptr) int32
	cuMemcpyDtoDAsync         func(dst, src uintptr, n uint64, s uintptr) int32
	cuMemcpy2DAsync           func(p *memcpy2D, s uintptr) int32
	cuStreamCreate            func(s *uintptr, flags uint32) int32
	cuStreamDestroy           func(s uintptr) int32
	cuStreamSynchronize       func(s uintptr) int32
	cuEventCreate             func(e *uintptr, flags uint32) int32
	cuEventRecord             func(e, s uintptr) int32
	cuEventSynchronize        func(e uintptr) int32
	cuEventElapsedTime        func(ms *float32, start, end uintptr) int32
	cuEventDestroy            func(e uintptr) int32
	cuModuleLoadData          func(m *uintptr, image unsafe.Pointer) int32
	cuModuleUnload            func(m uintptr) int32
	cuModuleGetFunction       func(f *uintptr, m uintptr, name string) int32
	cuFuncGetAttribute        func(v *int32, attr int32, f uintptr) int32
	cuFuncSetAttribute        func(f uintptr, attr int32, v int32) int32
	cuStreamBeginCapture      func(s uintptr, mode int32) int32
	cuStreamEndCapture        func(s uintptr, g *uintptr) int32
	cuStreamIsCapturing       func(s uintptr, status *int32) int32
	cuStreamWaitEvent         func(s, e uintptr, flags uint32) int32
	cuEventQuery              func(e uintptr) int32
	cuGraphInstantiate        func(exec *uintptr, g uintptr, flags uint64) int32
	cuGraphExecDestroy        func(exec uintptr) int32
	cuGraphDestroy            func(g uintptr) int32
	cuGetErrorName            func(r int32, s **byte) int32
	cuGetErrorString          func(r int32, s **byte) int32

	// Hot calls go through purego.SyscallN on the raw symbol, without reflection.
	launchKernel uintptr // cuLaunchKernel
	graphLaunch  uintptr // cuGraphLaunch
}

var (
	cudaLib = &library{name: "cuda", sentinel: ErrNoCUDA,
		names: []string{"libcuda.so.1", "libcuda.so"}, dirs: cudaDirs}
	driverOnce sync.Once
	driver     *driverAPI
	driverErr  error
)

// loadDriver opens libcuda, binds the API and calls cuInit, once per process.
func loadDriver() (*driverAPI, error) {
	driverOnce.Do(func() {
		driver, driverErr = bindDriver(cudaLib)
	})
	return driver, driverErr
}

func bindDriver(lib *library) (*driverAPI, error) {
	d := &driverAPI{}
	_, err := lib.bindAll([]binding{
		{&d.cuInit, "cuInit"},
		{&d.cuDriverGetVersion, "cuDriverGetVersion"},
		{&d.cuDeviceGetCount, "cuDeviceGetCount"},
		{&d.cuDeviceGet, "cuDeviceGet"},
		{&d.cuDeviceGetName, "cuDeviceGetName"},
		{&d.cuDeviceGetAttribute, "cuDeviceGetAttribute"},
		{&d.cuDeviceTotalMem, "cuDeviceTotalMem_v2"},
		{&d.cuDeviceGetPCIBusId, "cuDeviceGetPCIBusId"},
		{&d.cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"},
		{&d.cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2"},
		{&d.cuCtxSetCurrent, "cuCtxSetCurrent"},
		{&d.cuCtxSynchronize, "cuCtxSynchronize"},
		{&d.cuMemGetInfo, "cuMemGetInfo_v2"},
		{&d.cuMemAlloc, "cuMemAlloc_v2"},
		{&d.cuMemFree, "cuMemFree_v2"},
		{&d.cuMemAllocHost, "cuMemAllocHost_v2"},
		{&d.cuMemFreeHost, "cuMemFreeHost"},
		{&d.cuMemHostRegister, "cuMemHostRegister_v2"},
		{&d.cuMemHostUnregister, "cuMemHostUnregister"},
		{&d.cuMemsetD8, "cuMemsetD8_v2"},
		{&d.cuMemsetD8Async, "cuMemsetD8Async"},
		{&d.cuMemcpyHtoD, "cuMemcpyHtoD_v2"},
		{&d.cuMemcpyDtoH, "cuMemcpyDtoH_v2"},
		{&d.cuMemcpyDtoD, "cuMemcpyDtoD_v2"},
		{&d.cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2"},
		{&d.cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2"},
		{&d.cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2"},
		{&d.cuMemcpy2DAsync, "cuMemcpy2DAsync_v2"},
		{&d.cuStreamCreate, "cuStreamCreate"},
		{&d.cuStreamDestroy, "cuStreamDestroy_v2"},
		{&d.cuStreamSynchronize, "cuStreamSynchronize"},
		{&d.cuEventCreate, "cuEventCreate"},
		{&d.cuEventRecord, "cuEventRecord"},
		{&d.cuEventSynchronize, "cuEventSynchronize"},
		{&d.cuEventElapsedTime, "cuEventElapsedTime"},
		{&d.cuEventDestroy, "cuEventDestroy_v2"},
		{&d.cuModuleLoadData, "cuModuleLoadData"},
		{&d.cuModuleUnload, "cuModuleUnload"},
		{&d.cuModuleGetFunction, "cuModuleGetFunction"},
		{&d.cuFuncGetAttribute, "cuFuncGetAttribute"},
		{&d.cuFuncSetAttribute, "cuFuncSetAttribute"},
		{&d.cuStreamBeginCapture, "cuStreamBeginCapture_v2"},
		{&d.cuStreamEndCapture, "cuStreamEndCapture"},
		{&d.cuStreamIsCapturing, "cuStreamIsCapturing"},
		{&d.cuStreamWaitEvent, "cuStreamWaitEvent"},
		{&d.cuEventQuery, "cuEventQuery"},
		{&d.cuGraphInstantiate, "cuGraphInstantiateWithFlags"},
		{&d.cuGraphExecDestroy, "cuGraphExecDestroy"},
		{&d.cuGraphDestroy, "cuGraphDestroy"},
		{&d.cuGetErrorName, "cuGetErrorName"},
		{&d.cuGetErrorString, "cuGetErrorString"},
	})
	if err != nil {
		return nil, err
	}
	if d.launchKernel, err = lib.sym("cuLaunchKernel"); err != nil {
		return nil, err
	}
	if d.graphLaunch, err = lib.sym("cuGraphLaunch"); err != nil {
		return nil, err
	}
	if err := d.check("cuInit", d.cuInit(0)); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNoCUDA, err)
	}
	return d, nil
}

// check turns a CUresult into an error.
func (d *driverAPI) check(call string, r int32) error {
	if r == 0 {
		return nil
	}
	if r == codeMissing {
		return fmt.Errorf("cuda: %s: %w", call, ErrMissingSymbol)
	}
	e := &Error{Lib: "cuda", Call: call, Code: int(r)}
	var s *byte
	if d.cuGetErrorName(r, &s) == 0 {
		e.Name = goString(s)
	}
	if d.cuGetErrorString(r, &s) == 0 {
		e.Msg = goString(s)
	}
	return e
}

// goString copies a NUL-terminated C string.
func goString(p *byte) string {
	if p == nil {
		return ""
	}
	n := 0
	for *(*byte)(unsafe.Add(unsafe.Pointer(p), n)) != 0 {
		n++
	}
	return string(unsafe.Slice(p, n))
}

// cString trims a fixed buffer at its first NUL.
func cString(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

// DriverVersion returns the CUDA version the driver supports, e.g. 12040 for 12.4.
func DriverVersion() (int, error) {
	d, err := loadDriver()
	if err != nil {
		return 0, err
	}
	var v int32
	if err := d.check("cuDriverGetVersion", d.cuDriverGetVersion(&v)); err != nil {
		return 0, err
	}
	return int(v), nil
}

// DriverPath returns the file libcuda was loaded from, or "" when it is not loaded.
func DriverPath() string { return cudaLib.Path() }

// DeviceCount returns the number of GPUs the driver sees.
func DeviceCount() (int, error) {
	d, err := loadDriver()
	if err != nil {
		return 0, err
	}
	var n int32
	if err := d.check("cuDeviceGetCount", d.cuDeviceGetCount(&n)); err != nil {
		return 0, err
	}
	return int(n), nil
}

// Device attributes (CUdevice_attribute) Resin reads.
const (
	attrMaxThreadsPerBlock     = 1
	attrMaxSharedPerBlock      = 8
	attrClockRate              = 13
	attrMultiprocessorCount    = 16
	attrMemoryClockRate        = 36
	attrGlobalMemoryBusWidth   = 37
	attrL2CacheSize            = 38
	attrComputeCapabilityMajr  = 75
	attrComputeCapabilityMinr  = 76
	attrMaxSharedPerBlockOptin = 97
)

// DeviceInfo describes one GPU.
type DeviceInfo struct {
	Ordinal            int
	Name               string
	Major, Minor       int   // compute capability
	TotalMem           int64 // bytes
	SMs                int
	MaxSharedPerBlock  int // bytes, with opt-in
	L2Bytes            int
	MemoryBusWidthBits int
	PCIBusID           string // e.g. 0000:3b:00.0
}

// Arch returns the architecture name NVRTC and ptxas use, e.g. sm_90a for a Hopper GPU
// (the "a" variant unlocks wgmma and TMA) or sm_89.
func (i DeviceInfo) Arch() string {
	a := fmt.Sprintf("sm_%d%d", i.Major, i.Minor)
	if i.Major == 9 && i.Minor == 0 {
		a += "a"
	}
	return a
}

// Devices describes every GPU the driver sees.
func Devices() ([]DeviceInfo, error) {
	n, err := DeviceCount()
	if err != nil {
		return nil, err
	}
	out := make([]DeviceInfo, 0, n)
	for i := 0; i < n; i++ {
		info, err := deviceInfo(i)
		if err != nil {
			return nil, err
		}
		out = append(out, info)
	}
	return out, nil
}

func deviceInfo(ordinal int) (DeviceInfo, error) {
	d, err := loadDriver()
	if err != nil {
		return DeviceInfo{}, err
	}
	var dev int32
	if err := d.check("cuDeviceGet", d.cuDeviceGet(&dev, int32(ordinal))); err != nil {
		return DeviceInfo{}, fmt.Errorf("device %d: %w", ordinal, err)
	}
	info := DeviceInfo{Ordinal: ordinal}
	var name [256]byte
	if err := d.check("cuDeviceGetName", d.cuDeviceGetName(&name[0], int32(len(name)), dev)); err != nil {
		return info, err
	}
	info.Name = cString(name[:])
	var mem uint64
	if err := d.check("cuDeviceTotalMem_v2", d.cuDeviceTotalMem(&mem, dev)); err != nil {
		return info, err
	}
	info.TotalMem = int64(mem)
	for _, a := range []struct {
		attr int32
		dst  *int
	}{
		{attrComputeCapabilityMajr, &info.Major},
		{attrComputeCapabilityMinr, &info.Minor},
		{attrMultiprocessorCount, &info.SMs},
		{attrMaxSharedPerBlockOptin, &info.MaxSharedPerBlock},
		{attrL2CacheSize, &info.L2Bytes},
		{attrGlobalMemoryBusWidth, &info.MemoryBusWidthBits},
	} {
		var v int32
		if err := d.check("cuDeviceGetAttribute", d.cuDeviceGetAttribute(&v, a.attr, dev)); err != nil {
			return info, err
		}
		*a.dst = int(v)
	}
	var bus [64]byte
	if err := d.check("cuDeviceGetPCIBusId", d.cuDeviceGetPCIBusId(&bus[0], int32(len(bus)), dev)); err != nil {
		return info, err
	}
	info.PCIBusID = cString(bus[:])
	return info, nil
}
