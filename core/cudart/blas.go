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
	cublasLtMatmul                       func(h, op uintptr, alpha unsafe.Pointer, a, adesc, b, bdesc uintptr, beta unsafe.Pointer, c, cdesc, d, ddesc uintptr, algo unsafe.Pointer, ws uintptr, wsSize uint64, stream uintptr) int32
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
			{&a.cublasLtMatmul, "cublasLtMatmul"},
		})
		if err != nil {
			cublasLtErr = err
			return
		}
		if len(missing) > 0 {
			cublasLtErr = fmt.Errorf("cublasLt: %v: %w", missing, ErrMissingSymbol)
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

// GEMM element types.
const (
	F32 DType = iota
	BF16
	F16
)

func (t DType) String() string {
	if !t.valid() {
		return fmt.Sprintf("dtype(%d)", int(t))
	}
	return [...]string{"f32", "bf16", "f16"}[t]
}

func (t DType) valid() bool { return t >= F32 && t <= F16 }

// Size returns the bytes of one element (0 for an unknown type).
func (t DType) Size() int {
	if !t.valid() {
		return 0
	}
	return [...]int{4, 2, 2}[t]
}

// cudaType is the cudaDataType: CUDA_R_32F, CUDA_R_16BF, CUDA_R_16F.
func (t DType) cudaType() int32 { return [...]int32{0, 14, 2}[t] }

const (
	computeF32       = 68 // CUBLAS_COMPUTE_32F
	descTransA       = 3  // CUBLASLT_MATMUL_DESC_TRANSA
	descTransB       = 4  // CUBLASLT_MATMUL_DESC_TRANSB
	prefMaxWorkspace = 1  // CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES
	opN, opT         = int32(0), int32(1)
	heuristicBytes   = 96 // sizeof(cublasLtMatmulHeuristicResult_t)
	blasWorkspace    = 32 << 20
)

// Blas runs GEMMs on one device through cuBLASLt, keeping a plan (descriptors and the
// heuristic's algorithm) per shape.
type Blas struct {
	dev   *Device
	api   *cublasLtAPI
	h     uintptr
	ws    Buffer
	plans map[gemmShape]*gemmPlan
}

type gemmShape struct {
	t       DType
	m, n, k int
}

type gemmPlan struct {
	op, a, b, c uintptr
	algo        [heuristicBytes]byte
	wsSize      uint64
}

// NewBlas creates a cuBLASLt handle and a workspace on d.
func NewBlas(d *Device) (*Blas, error) {
	api, err := loadCublasLt()
	if err != nil {
		return nil, err
	}
	if d == nil {
		return nil, fmt.Errorf("cublasLt: nil device")
	}
	b := &Blas{dev: d, api: api, plans: map[gemmShape]*gemmPlan{}}
	err = d.Do(func(c *Ctx) error {
		if err := api.check("cublasLtCreate", api.cublasLtCreate(&b.h)); err != nil {
			return err
		}
		ws, err := c.Alloc(blasWorkspace)
		b.ws = ws
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("cublasLt on device %d: %w", d.Info.Ordinal, err)
	}
	return b, nil
}

// MatMulT computes out[m, n] = x[m, k] · w[n, k]ᵀ on stream s, with all three matrices
// row-major of element type t and accumulation in float32 — the layout of ref.MatMulT and
// of a Hugging Face Linear layer. It must run inside Device.Do of the Blas's device.
func (b *Blas) MatMulT(c *Ctx, s *Stream, t DType, out, x, w DevicePtr, m, k, n int) error {
	if m <= 0 || n <= 0 || k <= 0 {
		return fmt.Errorf("cublasLt gemm: dimensions m=%d k=%d n=%d must be positive", m, k, n)
	}
	if !t.valid() {
		return fmt.Errorf("cublasLt gemm: unknown element type %v", t)
	}
	if c.dev != b.dev {
		return fmt.Errorf("cublasLt gemm: context of device %d, handle of device %d", c.dev.Info.Ordinal, b.dev.Info.Ordinal)
	}
	p, err := b.plan(gemmShape{t, m, n, k})
	if err != nil {
		return err
	}
	alpha, beta := float32(1), float32(0)
	// In cuBLAS's column-major terms the row-major out[m, n] is C (n×m) = Wᵀ · X, where W
	// (k×n) and X (k×m) are the column-major views of w and x.
	r := b.api.cublasLtMatmul(b.h, p.op, unsafe.Pointer(&alpha), uintptr(w), p.a, uintptr(x), p.b,
		unsafe.Pointer(&beta), uintptr(out), p.c, uintptr(out), p.c, unsafe.Pointer(&p.algo[0]),
		uintptr(b.ws.Ptr), p.wsSize, s.handle())
	if err := b.api.check("cublasLtMatmul", r); err != nil {
		return fmt.Errorf("gemm %s m=%d k=%d n=%d: %w", t, m, k, n, err)
	}
	return nil
}

func (b *Blas) plan(sh gemmShape) (*gemmPlan, error) {
	if p := b.plans[sh]; p != nil {
		return p, nil
	}
	api := b.api
	p := &gemmPlan{}
	ct := sh.t.cudaType()
	if err := api.check("cublasLtMatmulDescCreate", api.cublasLtMatmulDescCreate(&p.op, computeF32, 0)); err != nil {
		return nil, err
	}
	ta, tb := opT, opN
	api.cublasLtMatmulDescSetAttribute(p.op, descTransA, unsafe.Pointer(&ta), 4)
	api.cublasLtMatmulDescSetAttribute(p.op, descTransB, unsafe.Pointer(&tb), 4)
	for _, l := range []struct {
		dst            *uintptr
		rows, cols, ld int
	}{{&p.a, sh.k, sh.n, sh.k}, {&p.b, sh.k, sh.m, sh.k}, {&p.c, sh.n, sh.m, sh.n}} {
		if err := api.check("cublasLtMatrixLayoutCreate", api.cublasLtMatrixLayoutCreate(l.dst, ct, uint64(l.rows), uint64(l.cols), int64(l.ld))); err != nil {
			return nil, err
		}
	}
	var pref uintptr
	if err := api.check("cublasLtMatmulPreferenceCreate", api.cublasLtMatmulPreferenceCreate(&pref)); err != nil {
		return nil, err
	}
	defer api.cublasLtMatmulPreferenceDestroy(pref)
	ws := uint64(blasWorkspace)
	api.cublasLtMatmulPreferenceSetAttribute(pref, prefMaxWorkspace, unsafe.Pointer(&ws), 8)
	var count int32
	if err := api.check("cublasLtMatmulAlgoGetHeuristic", api.cublasLtMatmulAlgoGetHeuristic(b.h, p.op, p.a, p.b, p.c, p.c, pref, 1, unsafe.Pointer(&p.algo[0]), &count)); err != nil {
		return nil, fmt.Errorf("gemm %s m=%d k=%d n=%d: %w", sh.t, sh.m, sh.k, sh.n, err)
	}
	if count == 0 {
		return nil, fmt.Errorf("gemm %s m=%d k=%d n=%d: cuBLASLt found no algorithm", sh.t, sh.m, sh.k, sh.n)
	}
	p.wsSize = *(*uint64)(unsafe.Pointer(&p.algo[64])) // workspaceSize follows the 64-byte algo
	b.plans[sh] = p
	return p, nil
}

// Close releases the plans, workspace and handle; it must not run inside Device.Do.
func (b *Blas) Close() error {
	return b.dev.Do(func(c *Ctx) error {
		for _, p := range b.plans {
			b.api.cublasLtMatmulDescDestroy(p.op)
			b.api.cublasLtMatrixLayoutDestroy(p.a)
			b.api.cublasLtMatrixLayoutDestroy(p.b)
			b.api.cublasLtMatrixLayoutDestroy(p.c)
		}
		b.plans = nil
		c.Free(b.ws)
		return b.api.check("cublasLtDestroy", b.api.cublasLtDestroy(b.h))
	})
}
