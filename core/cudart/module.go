package cudart

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"runtime"
	"unsafe"

	"github.com/ebitengine/purego"
)

// Module is a loaded PTX or cubin image.
type Module struct{ h uintptr }

// LoadModule loads a PTX text or cubin (ELF) image into the current context.
func (c *Ctx) LoadModule(image []byte) (*Module, error) {
	if len(image) == 0 {
		return nil, fmt.Errorf("cudart: load module: empty image")
	}
	img := image
	if !bytes.HasPrefix(image, []byte("\x7fELF")) && image[len(image)-1] != 0 {
		img = append(append(make([]byte, 0, len(image)+1), image...), 0) // PTX must end in NUL
	}
	if err := nvrtcDriverCompat(); err != nil {
		return nil, fmt.Errorf("load module: %w", err)
	}
	var h uintptr
	if err := c.api.check("cuModuleLoadData", c.api.cuModuleLoadData(&h, unsafe.Pointer(&img[0]))); err != nil {
		return nil, fmt.Errorf("load module: %w%s", err, loadHint(err))
	}
	runtime.KeepAlive(img)
	return &Module{h: h}, nil
}

// UnloadModule releases m; its functions become invalid.
func (c *Ctx) UnloadModule(m *Module) error {
	if m == nil || m.h == 0 {
		return nil
	}
	err := c.api.check("cuModuleUnload", c.api.cuModuleUnload(m.h))
	m.h = 0
	return err
}

// Function is a kernel entry point of a loaded module.
type Function struct {
	h    uintptr
	Name string
}

// Function looks up a kernel by its (extern "C") name.
func (c *Ctx) Function(m *Module, name string) (Function, error) {
	if m == nil || m.h == 0 {
		return Function{}, fmt.Errorf("function %s: module: %w", name, ErrClosed)
	}
	var h uintptr
	if err := c.api.check("cuModuleGetFunction", c.api.cuModuleGetFunction(&h, m.h, name)); err != nil {
		return Function{}, fmt.Errorf("function %s: %w", name, err)
	}
	return Function{h: h, Name: name}, nil
}

const (
	funcAttrNumRegs          = 4
	funcAttrMaxDynamicShared = 8
)

// NumRegs returns the registers per thread the kernel uses.
func (c *Ctx) NumRegs(f Function) (int, error) {
	var v int32
	err := c.api.check("cuFuncGetAttribute", c.api.cuFuncGetAttribute(&v, funcAttrNumRegs, f.h))
	return int(v), err
}

// SetMaxDynamicShared allows f to use up to n bytes of dynamic shared memory (above 48 KiB
// this opt-in is required).
func (c *Ctx) SetMaxDynamicShared(f Function, n int) error {
	return c.api.check("cuFuncSetAttribute", c.api.cuFuncSetAttribute(f.h, funcAttrMaxDynamicShared, int32(n)))
}

// Dim3 is a grid or block size.
type Dim3 struct{ X, Y, Z uint32 }

// D1 is a one-dimensional Dim3.
func D1(x int) Dim3 { return Dim3{uint32(x), 1, 1} }

// MaxArgs is the most parameters a kernel launched through Args can take.
const MaxArgs = 24

// Args collects kernel parameters without allocating: each value sits in an 8-byte slot
// and the parameter array points at the slots. Reuse one Args per launcher: the slots, the
// parameter array and the driver call's own argument list all live in it, so a Launch
// through it allocates nothing.
type Args struct {
	vals [MaxArgs]uint64
	ptrs [MaxArgs]unsafe.Pointer
	call [launchArgs]uintptr // cuLaunchKernel's arguments, filled by Launch
	n    int
	err  error
}

// launchArgs is the number of parameters of cuLaunchKernel.
const launchArgs = 11

// Reset empties a.
func (a *Args) Reset() *Args { a.n, a.err = 0, nil; return a }

func (a *Args) put(v uint64) *Args {
	if a.n == MaxArgs {
		a.err = fmt.Errorf("cudart: more than %d kernel parameters", MaxArgs)
		return a
	}
	a.vals[a.n] = v
	a.n++
	return a
}

// Ptr appends a device pointer parameter.
func (a *Args) Ptr(p DevicePtr) *Args { return a.put(uint64(p)) }

// I32 appends an int parameter.
func (a *Args) I32(v int32) *Args { return a.put(uint64(uint32(v))) }

// I64 appends a long long parameter.
func (a *Args) I64(v int64) *Args { return a.put(uint64(v)) }

// F32 appends a float parameter.
func (a *Args) F32(v float32) *Args { return a.put(uint64(math.Float32bits(v))) }

// Len returns the number of parameters.
func (a *Args) Len() int { return a.n }

// Launch queues f on s with the given grid, block, dynamic shared memory and parameters.
// It allocates nothing.
func (c *Ctx) Launch(f Function, grid, block Dim3, shared int, s *Stream, a *Args) error {
	if a.err != nil {
		return fmt.Errorf("launch %s: %w", f.Name, a.err)
	}
	if f.h == 0 {
		return fmt.Errorf("launch %s: %w", f.Name, ErrClosed)
	}
	a.pack(f, grid, block, shared, s)
	// The argument list is passed as an existing slice: SyscallN's variadic parameter
	// would otherwise escape to the heap on every launch.
	r, _, _ := purego.SyscallN(c.api.launchKernel, a.call[:]...)
	runtime.KeepAlive(a)
	if int32(r) != 0 {
		return fmt.Errorf("launch %s: %w", f.Name, c.api.check("cuLaunchKernel", int32(r)))
	}
	return nil
}

// pack points the parameter array at the value slots and fills cuLaunchKernel's argument
// list in a.call, all inside a. a.call holds addresses as uintptrs, which the garbage
// collector neither tracks nor moves; that is sound because storing &a.vals into a makes
// every *Args passed here escape to the heap (go build -gcflags=-m: "leaking param: a"),
// and heap objects do not move, and Launch keeps a alive across the call.
func (a *Args) pack(f Function, grid, block Dim3, shared int, s *Stream) {
	for i := 0; i < a.n; i++ {
		a.ptrs[i] = unsafe.Pointer(&a.vals[i])
	}
	a.call = [launchArgs]uintptr{f.h,
		uintptr(grid.X), uintptr(grid.Y), uintptr(grid.Z),
		uintptr(block.X), uintptr(block.Y), uintptr(block.Z),
		uintptr(shared), s.handle(), uintptr(unsafe.Pointer(&a.ptrs[0])), 0}
}

// CUresult codes of an image the driver cannot use.
const (
	errNoBinaryForGPU        = 209 // CUDA_ERROR_NO_BINARY_FOR_GPU
	errUnsupportedPTXVersion = 222 // CUDA_ERROR_UNSUPPORTED_PTX_VERSION
)

// loadHint says what to do about an image the driver refused.
func loadHint(err error) string {
	var e *Error
	if !errors.As(err, &e) {
		return ""
	}
	switch e.Code {
	case errUnsupportedPTXVersion:
		return ": the PTX comes from a compiler newer than the driver; compile for the GPU's real architecture (sm_XX, a cubin) or use an NVRTC no newer than the driver"
	case errNoBinaryForGPU:
		return ": the image was built for another architecture; compile for this GPU's (DeviceInfo.Arch)"
	}
	return ""
}
