package cudart

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"
)

type nvrtcAPI struct {
	nvrtcVersion              func(major, minor *int32) int32
	nvrtcGetErrorString       func(r int32) string
	nvrtcCreateProgram        func(prog *uintptr, src, name string, numHeaders int32, headers, includeNames unsafe.Pointer) int32
	nvrtcCompileProgram       func(prog uintptr, numOptions int32, options unsafe.Pointer) int32
	nvrtcGetProgramLogSize    func(prog uintptr, n *uint64) int32
	nvrtcGetProgramLog        func(prog uintptr, buf *byte) int32
	nvrtcGetPTXSize           func(prog uintptr, n *uint64) int32
	nvrtcGetPTX               func(prog uintptr, buf *byte) int32
	nvrtcGetCUBINSize         func(prog uintptr, n *uint64) int32
	nvrtcGetCUBIN             func(prog uintptr, buf *byte) int32
	nvrtcDestroyProgram       func(prog *uintptr) int32
	nvrtcGetNumSupportedArchs func(n *int32) int32
	nvrtcGetSupportedArchs    func(archs *int32) int32
}

var (
	nvrtcLib = &library{name: "nvrtc", sentinel: ErrNoNVRTC, fileEnv: "RESIN_NVRTC_LIB", probe: "nvrtcVersion",
		names: []string{"libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so.1[0-9]"},
		dirs:  append(append([]string{}, cudaDirs...), pythonLibDirs("cuda_nvrtc")...)}
	nvrtcOnce sync.Once
	nvrtc     *nvrtcAPI
	nvrtcErr  error
)

func loadNVRTC() (*nvrtcAPI, error) {
	nvrtcOnce.Do(func() {
		n := &nvrtcAPI{}
		_, err := nvrtcLib.bindAll([]binding{
			{&n.nvrtcVersion, "nvrtcVersion"},
			{&n.nvrtcCreateProgram, "nvrtcCreateProgram"},
			{&n.nvrtcCompileProgram, "nvrtcCompileProgram"},
			{&n.nvrtcGetProgramLogSize, "nvrtcGetProgramLogSize"},
			{&n.nvrtcGetProgramLog, "nvrtcGetProgramLog"},
			{&n.nvrtcGetPTXSize, "nvrtcGetPTXSize"},
			{&n.nvrtcGetPTX, "nvrtcGetPTX"},
			{&n.nvrtcGetCUBINSize, "nvrtcGetCUBINSize"},
			{&n.nvrtcGetCUBIN, "nvrtcGetCUBIN"},
			{&n.nvrtcDestroyProgram, "nvrtcDestroyProgram"},
			{&n.nvrtcGetNumSupportedArchs, "nvrtcGetNumSupportedArchs"},
			{&n.nvrtcGetSupportedArchs, "nvrtcGetSupportedArchs"},
		})
		if err != nil {
			nvrtcErr = err
			return
		}
		p, err := nvrtcLib.sym("nvrtcGetErrorString")
		if err != nil {
			nvrtcErr = err
			return
		}
		bindString(&n.nvrtcGetErrorString, p)
		nvrtc = n
		nvrtcLoaded.Store(true)
	})
	return nvrtc, nvrtcErr
}

func (n *nvrtcAPI) check(call string, r int32) error {
	if r == 0 {
		return nil
	}
	if r == codeMissing {
		return fmt.Errorf("nvrtc: %s: %w", call, ErrMissingSymbol)
	}
	return &Error{Lib: "nvrtc", Call: call, Code: int(r), Name: n.nvrtcGetErrorString(r)}
}

// NVRTCVersion returns NVRTC's version, e.g. "12.9".
func NVRTCVersion() (string, error) {
	n, err := loadNVRTC()
	if err != nil {
		return "", err
	}
	var maj, minr int32
	if err := n.check("nvrtcVersion", n.nvrtcVersion(&maj, &minr)); err != nil {
		return "", err
	}
	return fmt.Sprintf("%d.%d", maj, minr), nil
}

// NVRTCPath returns the file NVRTC was loaded from ("" when it is not loaded).
func NVRTCPath() string { return nvrtcLib.Path() }

// NVRTCWarning returns why the file RESIN_NVRTC_LIB names was passed over for the search
// order (it is missing, not loadable or not NVRTC), or "" when it was used or is unset.
// The same text was printed to standard error when NVRTC loaded.
func NVRTCWarning() string { return nvrtcLib.Warning() }

// ErrNVRTCTooNew reports an NVRTC whose CUDA major version is newer than the driver's: the
// driver cannot load what it compiles.
var ErrNVRTCTooNew = errors.New("cudart: NVRTC is newer than the CUDA driver")

// CheckNVRTCDriver checks that the driver can load what NVRTC compiles: NVRTC's major
// version must not exceed the CUDA version the driver supports (a CUDA 13 NVRTC emits
// cubins and PTX a CUDA 12 driver refuses). It returns the loaders' errors (ErrNoCUDA,
// ErrNoNVRTC) when either is missing and an error matching ErrNVRTCTooNew, with what to do,
// on a mismatch. Ctx.LoadModule runs it when NVRTC is loaded in the process.
func CheckNVRTCDriver() error {
	dv, err := DriverVersion()
	if err != nil {
		return err
	}
	n, err := loadNVRTC()
	if err != nil {
		return err
	}
	var maj, minr int32
	if err := n.check("nvrtcVersion", n.nvrtcVersion(&maj, &minr)); err != nil {
		return err
	}
	return checkNVRTCDriver(int(maj), int(minr), dv, NVRTCPath())
}

// checkNVRTCDriver compares NVRTC major.minor with the driver's CUDA version (e.g. 12040).
func checkNVRTCDriver(major, minor, driverVersion int, path string) error {
	dmaj, dmin := driverVersion/1000, driverVersion%1000/10
	if major <= dmaj {
		return nil
	}
	return fmt.Errorf("%w: NVRTC %d.%d (%s) compiles for CUDA %d, but the driver supports CUDA %d.%d and cannot load its kernels: "+
		"point RESIN_NVRTC_LIB at an NVRTC %d.x (pip install nvidia-cuda-nvrtc-cu%d) or upgrade the NVIDIA driver",
		ErrNVRTCTooNew, major, minor, path, major, dmaj, dmin, dmaj, dmaj)
}

var (
	nvrtcLoaded      atomic.Bool // set once NVRTC is bound in this process
	nvrtcDriverOnce  sync.Once
	nvrtcDriverError error
)

// nvrtcDriverCompat is CheckNVRTCDriver, once per process, when NVRTC is loaded (a process
// that loads only prebuilt images does not need it).
func nvrtcDriverCompat() error {
	if !nvrtcLoaded.Load() {
		return nil
	}
	nvrtcDriverOnce.Do(func() {
		nvrtcDriverError = CheckNVRTCDriver()
		if errors.Is(nvrtcDriverError, ErrNoCUDA) || errors.Is(nvrtcDriverError, ErrNoNVRTC) {
			nvrtcDriverError = nil // the caller's own calls report these
		}
	})
	return nvrtcDriverError
}

// NVRTCArchs lists the architectures NVRTC can compile for, e.g. [75 80 86 89 90 100].
func NVRTCArchs() ([]int, error) {
	n, err := loadNVRTC()
	if err != nil {
		return nil, err
	}
	var cnt int32
	if err := n.check("nvrtcGetNumSupportedArchs", n.nvrtcGetNumSupportedArchs(&cnt)); err != nil {
		return nil, err
	}
	if cnt <= 0 {
		return nil, nil
	}
	a := make([]int32, cnt)
	if err := n.check("nvrtcGetSupportedArchs", n.nvrtcGetSupportedArchs(&a[0])); err != nil {
		return nil, err
	}
	out := make([]int, cnt)
	for i, v := range a {
		out[i] = int(v)
	}
	return out, nil
}

// Compiled is NVRTC's output for one source.
type Compiled struct {
	PTX   []byte // set when compiled for a virtual architecture (compute_XX)
	CUBIN []byte // set when compiled for a real architecture (sm_XX)
	Log   string
}

// Image returns the CUBIN when there is one, else the PTX.
func (c Compiled) Image() []byte {
	if len(c.CUBIN) > 0 {
		return c.CUBIN
	}
	return c.PTX
}

// Compile compiles CUDA C++ source with NVRTC. Options are nvcc-style flags; arch is an
// architecture such as "sm_90a" (giving a cubin and no PTX) or "compute_90a" (giving PTX,
// which the driver or ptxas assembles). A source NVRTC rejects returns an error matching
// ErrCompile whose text includes the compiler's log.
func Compile(src, name, arch string, options ...string) (Compiled, error) {
	n, err := loadNVRTC()
	if err != nil {
		return Compiled{}, err
	}
	if arch == "" {
		return Compiled{}, fmt.Errorf("compile %s: no architecture given", name)
	}
	var prog uintptr
	if err := n.check("nvrtcCreateProgram", n.nvrtcCreateProgram(&prog, src, name, 0, nil, nil)); err != nil {
		return Compiled{}, fmt.Errorf("compile %s: %w", name, err)
	}
	defer n.nvrtcDestroyProgram(&prog)

	opts := append([]string{"--gpu-architecture=" + arch}, options...)
	cstrs := make([][]byte, len(opts))
	ptrs := make([]*byte, len(opts))
	for i, o := range opts {
		cstrs[i] = append([]byte(o), 0)
		ptrs[i] = &cstrs[i][0]
	}
	r := n.nvrtcCompileProgram(prog, int32(len(ptrs)), unsafe.Pointer(&ptrs[0]))
	runtime.KeepAlive(cstrs)
	var out Compiled
	var logSize uint64
	if n.nvrtcGetProgramLogSize(prog, &logSize) == 0 && logSize > 1 {
		buf := make([]byte, logSize)
		if n.nvrtcGetProgramLog(prog, &buf[0]) == 0 {
			out.Log = strings.TrimSpace(cString(buf))
		}
	}
	if r != 0 {
		return out, fmt.Errorf("compile %s for %s: %w: %v\n%s", name, arch, ErrCompile, n.check("nvrtcCompileProgram", r), out.Log)
	}
	if strings.HasPrefix(arch, "sm_") {
		var size uint64
		if err := n.check("nvrtcGetCUBINSize", n.nvrtcGetCUBINSize(prog, &size)); err != nil {
			return out, fmt.Errorf("compile %s: %w", name, err)
		}
		out.CUBIN = make([]byte, size)
		if err := n.check("nvrtcGetCUBIN", n.nvrtcGetCUBIN(prog, &out.CUBIN[0])); err != nil {
			return out, fmt.Errorf("compile %s: %w", name, err)
		}
		return out, nil
	}
	var size uint64
	if err := n.check("nvrtcGetPTXSize", n.nvrtcGetPTXSize(prog, &size)); err != nil {
		return out, fmt.Errorf("compile %s: %w", name, err)
	}
	buf := make([]byte, size)
	if err := n.check("nvrtcGetPTX", n.nvrtcGetPTX(prog, &buf[0])); err != nil {
		return out, fmt.Errorf("compile %s: %w", name, err)
	}
	out.PTX = []byte(cString(buf))
	return out, nil
}
