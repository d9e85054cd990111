package cudart

import (
	"fmt"
	"sync"
	"unsafe"
)

type cublasLtAPI struct {
	cublasLtCreate                       func(h *uintptr) int32
	cublasLtDestroy                      func(h uintptr) int32
	cublasLtGetVersion                   func() uint64
	cublasLtMatmulDescCreate             func(d *uintptr, compute int32, scale int32) int32
	cublasLtMatmulDescDestroy            func(d uintptr) int32
	cublasLtMatmulDescSetAttribute       func(d uintptr, attr int32, buf unsafe.Pointer, size uint64) int32
	cublasLtMatrixLayoutCreate           func(l *uintptr, dtype int32, rows, cols uint64, ld int64) int32
	cublasLtMatrixLayoutDestroy          func(l uintptr) int32
	cublasLtMatmulPreferenceCreate       func(p *uintptr) int32
	cublasLtMatmulPreferenceDestroy      func(p uintptr) int32
	cublasLtMatmulPreferenceSetAttribute func(p uintptr, attr int32, buf unsafe.Pointer, size uint64) int32
	cublasLtMatmulAlgoGetHeuristic       func(h, op, a, b, c, d, pref uintptr, requested int32, results unsafe.Pointer, count *int32) int32

	// cublasLtMatmul is called through purego.SyscallN on the raw symbol, from arguments
	// kept in the Blas, so a GEMM allocates nothing; so is the descriptor attribute setter
	// a block-scaled GEMM calls for its scale pointers each time.
	matmul, setAttr uintptr
}

var (
	cublasLtLib = &library{name: "cublasLt", sentinel: ErrNoCUBLAS,
		names: []string{"libcublasLt.so", "libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so.1[0-9]"},
		dirs:  append(append([]string{}, cudaDirs...), pythonLibDirs("cublas")...)}
	cublasLtOnce sync.Once
	cublasLt     *cublasLtAPI
	cublasLtErr  error
)

func loadCublasLt() (*cublasLtAPI, error) {
	cublasLtOnce.Do(func() {
		a := &cublasLtAPI{}
		missing, err := cublasLtLib.bindAll([]binding{
			{&a.cublasLtCreate, "cublasLtCreate"},
			{&a.cublasLtDestroy, "cublasLtDestroy"},
			{&a.cublasLtMatmulDescCreate, "cublasLtMatmulDescCreate"},
			{&a.cublasLtMatmulDescDestroy, "cublasLtMatmulDescDestroy"},
			{&a.cublasLtMatmulDescSetAttribute, "cublasLtMatmulDescSetAttribute"},
			{&a.cublasLtMatrixLayoutCreate, "cublasLtMatrixLayoutCreate"},
			{&a.cublasLtMatrixLayoutDestroy, "cublasLtMatrixLayoutDestroy"},
			{&a.cublasLtMatmulPreferenceCreate, "cublasLtMatmulPreferenceCreate"},
			{&a.cublasLtMatmulPreferenceDestroy, "cublasLtMatmulPreferenceDestroy"},
			{&a.cublasLtMatmulPreferenceSetAttribute, "cublasLtMatmulPreferenceSetAttribute"},
			{&a.cublasLtMatmulAlgoGetHeuristic, "cublasLtMatmulAlgoGetHeuristic"},
		})
		if err != nil {
			cublasLtErr = err
			return
		}
		if len(missing) > 0 {
			cublasLtErr = fmt.Errorf("cublasLt: %v: %w", missing, ErrMissingSymbol)
			return
		}
		if a.matmul, err = cublasLtLib.sym("cublasLtMatmul"); err != nil {
			cublasLtErr = err
			return
		}
		if a.setAttr, err = cublasLtLib.sym("cublasLtMatmulDescSetAttribute"); err != nil {
			cublasLtErr = err
			return
		}
		p, err := cublasLtLib.sym("cublasLtGetVersion")
		if err != nil {
			cublasLtErr = err
			return
		}
		bindUint64(&a.cublasLtGetVersion, p)
		cublasLt = a
	})
	return cublasLt, cublasLtErr
}

func (a *cublasLtAPI) check(call string, r int32) error {
	if r == 0 {
		return nil
	}
	if r == codeMissing {
		return fmt.Errorf("cublasLt: %s: %w", call, ErrMissingSymbol)
	}
	return &Error{Lib: "cublasLt", Call: call, Code: int(r), Name: cublasStatusName(r)}
}

func cublasStatusName(r int32) string {
	names := map[int32]string{1: "CUBLAS_STATUS_NOT_INITIALIZED", 3: "CUBLAS_STATUS_ALLOC_FAILED",
		7: "CUBLAS_STATUS_INVALID_VALUE", 8: "CUBLAS_STATUS_ARCH_MISMATCH", 11: "CUBLAS_STATUS_MAPPING_ERROR",
		13: "CUBLAS_STATUS_EXECUTION_FAILED", 14: "CUBLAS_STATUS_INTERNAL_ERROR", 15: "CUBLAS_STATUS_NOT_SUPPORTED"}
	return names[r]
}

// CublasLtVersion returns cuBLASLt's version number, e.g. 120904.
func CublasLtVersion() (int, error) {
	a, err := loadCublasLt()
	if err != nil {
		return 0, err
	}
	return int(a.cublasLtGetVersion()), nil
}

// DType is an element type of a GEMM.
type DType int

// GEMM element types. E4M3 (OCP float8 e4m3fn) is an input type of the block-scaled FP8
// GEMM only (Blas.MatMulFP8Block); GemmSpec takes F32, BF16 and F16.
const (
	F32 DType = iota
	BF16
	F16
	E4M3
)

func (t DType) String() string {
	if !t.known() {
		return fmt.Sprintf("dtype(%d)", int(t))
	}
	return [...]string{"f32", "bf16", "f16", "e4m3"}[t]
}

// valid reports a type GemmSpec takes.
func (t DType) valid() bool { return t >= F32 && t <= F16 }

func (t DType) known() bool { return t >= F32 && t <= E4M3 }

// Size returns the bytes of one element (0 for an unknown type).
func (t DType) Size() int {
	if !t.known() {
		return 0
	}
	return [...]int{4, 2, 2, 1}[t]
}

// cudaType is the cudaDataType: CUDA_R_32F, CUDA_R_16BF, CUDA_R_16F, CUDA_R_8F_E4M3.
func (t DType) cudaType() int32 { return [...]int32{0, 14, 2, 28}[t] }
