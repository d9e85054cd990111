package cudart

import (
	"fmt"
	"math"
	"runtime"
	"unsafe"

	"github.com/ebitengine/purego"
)

const (
	computeF32       = 68 // CUBLAS_COMPUTE_32F
	scaleF32         = 0  // CUDA_R_32F, the type of alpha and beta
	descTransA       = 3  // CUBLASLT_MATMUL_DESC_TRANSA
	descTransB       = 4  // CUBLASLT_MATMUL_DESC_TRANSB
	descAScalePtr    = 17 // CUBLASLT_MATMUL_DESC_A_SCALE_POINTER
	descBScalePtr    = 18 // CUBLASLT_MATMUL_DESC_B_SCALE_POINTER
	descAScaleMode   = 31 // CUBLASLT_MATMUL_DESC_A_SCALE_MODE (cuBLAS 12.8+)
	descBScaleMode   = 32 // CUBLASLT_MATMUL_DESC_B_SCALE_MODE
	prefMaxWorkspace = 1  // CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES
	prefMinAlignA    = 5  // CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES; B, C, D follow
	opN, opT         = int32(0), int32(1)
	heuristicBytes   = 96 // sizeof(cublasLtMatmulHeuristicResult_t)
	matmulArgs       = 16 // parameters of cublasLtMatmul

	// DefaultBlasWorkspace is the cuBLASLt workspace NewBlas preallocates: 32 MiB, what
	// NVIDIA recommends for Hopper.
	DefaultBlasWorkspace = 32 << 20
	// DefaultBlasPlans is how many GEMM plans NewBlas keeps before evicting the least
	// recently used.
	DefaultBlasPlans = 256
	// maxAlignment is the largest alignment cuBLASLt asks about (its default assumption).
	maxAlignment = 256
)

// GemmSpec describes D = Alpha·op(A)·op(B) + Beta·C with every matrix row-major: op(A) is
// [M, K], op(B) is [K, N], C and D are [M, N]. TransA means A is stored [K, M]; TransB
// means B is stored [N, K], the layout of a Hugging Face Linear weight, so x·Wᵀ is
// {TransB: true}. A and B are bf16 (or f16, or f32 for the reference variant); the
// product accumulates in float32 (CUBLAS_COMPUTE_32F, float32 alpha and beta) and D, with
// C, is bf16 or float32 (OutType). Beta 0 ignores C.
type GemmSpec struct {
	M, N, K        int
	TransA, TransB bool
	AType, BType   DType
	OutType        DType
	Alpha, Beta    float32
}

func (g GemmSpec) String() string {
	ta, tb := "n", "n"
	if g.TransA {
		ta = "t"
	}
	if g.TransB {
		tb = "t"
	}
	return fmt.Sprintf("gemm m=%d n=%d k=%d %s%s %s·%s→%s", g.M, g.N, g.K, ta, tb, g.AType, g.BType, g.OutType)
}

// check refuses shapes and type combinations cuBLASLt does not run with float32 compute.
func (g GemmSpec) check() error {
	if g.M <= 0 || g.N <= 0 || g.K <= 0 {
		return fmt.Errorf("%v: dimensions must be positive", g)
	}
	if g.M > math.MaxInt32 || g.N > math.MaxInt32 || g.K > math.MaxInt32 {
		return fmt.Errorf("%v: dimension beyond 2^31", g)
	}
	if !g.AType.valid() || !g.BType.valid() || !g.OutType.valid() {
		return fmt.Errorf("%v: unknown element type", g)
	}
	if g.AType != g.BType {
		return fmt.Errorf("%v: A and B must have one element type", g)
	}
	if g.OutType != g.AType && g.OutType != F32 {
		return fmt.Errorf("%v: the output must be %s or f32", g, g.AType)
	}
	return nil
}

// gemmKey is everything a cuBLASLt plan depends on: shape, transposes, element types
// and the alignment of each matrix's address, which decides the kernels allowed.
type gemmKey struct {
	m, n, k                        int32
	transA, transB                 bool
	a, b, out                      DType
	alignA, alignB, alignC, alignD uint16
	scaleA, scaleB                 scaleMode // of cuBLASLt's A and B slots; 0 unscaled
}

// Alignment returns the largest power of two, up to 256 bytes, that divides p: what
// cuBLASLt's MIN_ALIGNMENT preferences are set from, since its fastest kernels need
// 16-byte or stricter alignment and reject pointers that lack it.
func Alignment(p DevicePtr) int {
	if p == 0 {
		return maxAlignment
	}
	a := int(uint64(p) & -uint64(p))
	if a > maxAlignment || a <= 0 {
		return maxAlignment
	}
	return a
}

// key builds the plan key of g over the given pointers. In cuBLAS's column-major terms the
// row-major product is Dᵀ = op(B)ᵀ·op(A)ᵀ, so the matrix in cuBLASLt's "A" slot is our B
// and its "B" slot is our A: the alignments follow the slots.
func (g GemmSpec) key(a, b, c, d DevicePtr) gemmKey {
	return gemmKey{
		m: int32(g.M), n: int32(g.N), k: int32(g.K),
		transA: g.TransA, transB: g.TransB,
		a: g.AType, b: g.BType, out: g.OutType,
		alignA: uint16(Alignment(b)), alignB: uint16(Alignment(a)),
		alignC: uint16(Alignment(c)), alignD: uint16(Alignment(d)),
	}
}

// layout is one cuBLASLt matrix layout: column-major rows×cols with leading dimension ld.
type layout struct{ rows, cols, ld int }

// layouts returns the cuBLASLt operations and column-major layouts of the "A" slot (our
// B), the "B" slot (our A) and C/D.
func (k gemmKey) layouts() (opA, opB int32, la, lb, lc layout) {
	m, n, kk := int(k.m), int(k.n), int(k.k)
	// Our B: stored [K, N] row-major is N×K column-major (ld N), which is op(B)ᵀ as is;
	// stored [N, K] (TransB) it is K×N (ld K), to be transposed.
	opA, la = opN, layout{n, kk, n}
	if k.transB {
		opA, la = opT, layout{kk, n, kk}
	}
	// Our A: stored [M, K] is K×M column-major (ld K) = op(A)ᵀ; stored [K, M] (TransA) it
	// is M×K (ld M), to be transposed.
	opB, lb = opN, layout{kk, m, kk}
	if k.transA {
		opB, lb = opT, layout{m, kk, m}
	}
	return opA, opB, la, lb, layout{n, m, n}
}

type gemmPlan struct {
	op, a, b, c, d uintptr // descriptors: matmul, layouts of the A, B, C and D slots
	algo           [heuristicBytes]byte
	wsSize         uint64
}

// Blas runs GEMMs on one device through cuBLASLt. It keeps a bounded cache of plans
// (descriptors and the heuristic's algorithm) keyed by shape, transposes, element types
// and pointer alignment, and one preallocated workspace; a GEMM whose plan is cached
// allocates nothing. A Blas is used inside its device's Do only, one call at a time.
type Blas struct {
	dev   *Device
	api   *cublasLtAPI
	h     uintptr
	ws    Buffer
	plans *lru[gemmKey, *gemmPlan]

	alpha, beta float32             // the scalars cublasLtMatmul reads, in the heap-allocated Blas
	scalePtrs   [2]uintptr          // the A and B slots' scale pointers of a block-scaled GEMM
	attrCall    [4]uintptr          // cublasLtMatmulDescSetAttribute's arguments
	call        [matmulArgs]uintptr // its arguments, kept here so a call allocates nothing

	hits, misses, evictions int64
}

// BlasConfig sizes a Blas: its workspace and its plan cache (0 for the defaults).
type BlasConfig struct {
	WorkspaceBytes int64
	MaxPlans       int
}

// NewBlas creates a cuBLASLt handle, a DefaultBlasWorkspace workspace and a cache of
// DefaultBlasPlans plans on d.
func NewBlas(d *Device) (*Blas, error) { return NewBlasWith(d, BlasConfig{}) }

// NewBlasWith is NewBlas with a chosen workspace and plan cache size.
func NewBlasWith(d *Device, cfg BlasConfig) (*Blas, error) {
	api, err := loadCublasLt()
	if err != nil {
		return nil, err
	}
	if d == nil {
		return nil, fmt.Errorf("cublasLt: nil device")
	}
	if cfg.WorkspaceBytes < 0 || cfg.MaxPlans < 0 {
		return nil, fmt.Errorf("cublasLt: negative workspace (%d bytes) or plan cache (%d)", cfg.WorkspaceBytes, cfg.MaxPlans)
	}
	if cfg.WorkspaceBytes == 0 {
		cfg.WorkspaceBytes = DefaultBlasWorkspace
	}
	if cfg.MaxPlans == 0 {
		cfg.MaxPlans = DefaultBlasPlans
	}
	b := &Blas{dev: d, api: api, plans: newLRU[gemmKey, *gemmPlan](cfg.MaxPlans)}
	err = d.Do(func(c *Ctx) error {
		if err := api.check("cublasLtCreate", api.cublasLtCreate(&b.h)); err != nil {
			return err
		}
		ws, err := c.Alloc(cfg.WorkspaceBytes)
		if err != nil {
			api.cublasLtDestroy(b.h)
			return err
		}
		b.ws = ws
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("cublasLt on device %d: %w", d.Info.Ordinal, err)
	}
	return b, nil
}

// PlanStats returns the plan cache's hits, misses (heuristic queries) and evictions.
func (b *Blas) PlanStats() (hits, misses, evictions int64) { return b.hits, b.misses, b.evictions }

// MatMulT computes out[m, n] = x[m, k] · w[n, k]ᵀ on stream s, with all three matrices
// row-major of element type t and accumulation in float32 — the layout of ref.MatMulT and
// of a Hugging Face Linear layer. It must run inside Device.Do of the Blas's device.
func (b *Blas) MatMulT(c *Ctx, s *Stream, t DType, out, x, w DevicePtr, m, k, n int) error {
	return b.Gemm(c, s, GemmSpec{M: m, N: n, K: k, TransB: true, AType: t, BType: t, OutType: t, Alpha: 1}, x, w, 0, out)
}

// Gemm computes g on stream s: d = Alpha·op(a)·op(bm) + Beta·cm (cm is read only when
// Beta is not 0, and may equal d). The first call for a shape, type and alignment asks
// cuBLASLt's heuristic for an algorithm, with the pointers' real alignments as
// preferences; later calls reuse that plan and allocate nothing. It must run inside
// Device.Do of the Blas's device, and may be captured into a CUDA graph.
func (b *Blas) Gemm(c *Ctx, s *Stream, g GemmSpec, a, bm, cm, d DevicePtr) error {
	if err := g.check(); err != nil {
		return err
	}
	if b.plans == nil {
		return fmt.Errorf("%v: cublasLt handle: %w", g, ErrClosed)
	}
	if c.dev != b.dev {
		return fmt.Errorf("%v: context of device %d, handle of device %d", g, c.dev.Info.Ordinal, b.dev.Info.Ordinal)
	}
	if g.Beta == 0 {
		cm = d
	}
	key := g.key(a, bm, cm, d)
	p, err := b.plan(key)
	if err != nil {
		return fmt.Errorf("%v: %w", g, err)
	}
	b.alpha, b.beta = g.Alpha, g.Beta
	b.call = [matmulArgs]uintptr{b.h, p.op,
		uintptr(unsafe.Pointer(&b.alpha)), uintptr(bm), p.a, uintptr(a), p.b,
		uintptr(unsafe.Pointer(&b.beta)), uintptr(cm), p.c, uintptr(d), p.d,
		uintptr(unsafe.Pointer(&p.algo[0])), uintptr(b.ws.Ptr), uintptr(p.wsSize), s.handle()}
	r, _, _ := purego.SyscallN(b.api.matmul, b.call[:]...)
	runtime.KeepAlive(b)
	runtime.KeepAlive(p)
	if err := b.api.check("cublasLtMatmul", int32(r)); err != nil {
		return fmt.Errorf("%v: %w", g, err)
	}
	return nil
}

// plan returns the cached plan for k, building it (and evicting the least recently used
// one when the cache is full) on a miss.
func (b *Blas) plan(k gemmKey) (*gemmPlan, error) {
	if p, ok := b.plans.get(k); ok {
		b.hits++
		return p, nil
	}
	b.misses++
	p, err := b.newPlan(k)
	if err != nil {
		return nil, err
	}
	if _, old, displaced := b.plans.put(k, p); displaced {
		b.evictions++
		b.destroyPlan(old)
	}
	return p, nil
}

func (b *Blas) newPlan(k gemmKey) (_ *gemmPlan, err error) {
	api := b.api
	p := &gemmPlan{}
	defer func() {
		if err != nil {
			b.destroyPlan(p) // the descriptors made before the failure
		}
	}()
	if err := api.check("cublasLtMatmulDescCreate", api.cublasLtMatmulDescCreate(&p.op, computeF32, scaleF32)); err != nil {
		return nil, err
	}
	opA, opB, la, lb, lc := k.layouts()
	for _, attr := range []struct {
		id int32
		v  int32
	}{{descTransA, opA}, {descTransB, opB}} {
		v := attr.v
		if err := api.check("cublasLtMatmulDescSetAttribute", api.cublasLtMatmulDescSetAttribute(p.op, attr.id, unsafe.Pointer(&v), 4)); err != nil {
			return nil, fmt.Errorf("set transpose attribute %d: %w", attr.id, err)
		}
	}
	for _, attr := range []struct {
		id int32
		v  scaleMode
	}{{descAScaleMode, k.scaleA}, {descBScaleMode, k.scaleB}} {
		if attr.v == 0 {
			continue
		}
		v := int32(attr.v)
		if err := api.check("cublasLtMatmulDescSetAttribute", api.cublasLtMatmulDescSetAttribute(p.op, attr.id, unsafe.Pointer(&v), 4)); err != nil {
			return nil, fmt.Errorf("set scale mode attribute %d: %w", attr.id, err)
		}
	}
	for _, l := range []struct {
		dst *uintptr
		t   DType
		l   layout
	}{{&p.a, k.b, la}, {&p.b, k.a, lb}, {&p.c, k.out, lc}, {&p.d, k.out, lc}} {
		if err := api.check("cublasLtMatrixLayoutCreate", api.cublasLtMatrixLayoutCreate(l.dst, l.t.cudaType(), uint64(l.l.rows), uint64(l.l.cols), int64(l.l.ld))); err != nil {
			return nil, err
		}
	}
	var pref uintptr
	if err := api.check("cublasLtMatmulPreferenceCreate", api.cublasLtMatmulPreferenceCreate(&pref)); err != nil {
		return nil, err
	}
	defer api.cublasLtMatmulPreferenceDestroy(pref)
	ws := uint64(b.ws.Size)
	if err := api.check("cublasLtMatmulPreferenceSetAttribute", api.cublasLtMatmulPreferenceSetAttribute(pref, prefMaxWorkspace, unsafe.Pointer(&ws), 8)); err != nil {
		return nil, fmt.Errorf("set workspace preference: %w", err)
	}
	for i, align := range []uint16{k.alignA, k.alignB, k.alignC, k.alignD} {
		v := uint32(align)
		if err := api.check("cublasLtMatmulPreferenceSetAttribute", api.cublasLtMatmulPreferenceSetAttribute(pref, prefMinAlignA+int32(i), unsafe.Pointer(&v), 4)); err != nil {
			return nil, fmt.Errorf("set alignment preference of %c: %w", "ABCD"[i], err)
		}
	}
	var count int32
	if err := api.check("cublasLtMatmulAlgoGetHeuristic", api.cublasLtMatmulAlgoGetHeuristic(b.h, p.op, p.a, p.b, p.c, p.d, pref, 1, unsafe.Pointer(&p.algo[0]), &count)); err != nil {
		return nil, err
	}
	if count == 0 {
		return nil, fmt.Errorf("cuBLASLt found no algorithm (alignments A %d B %d C %d D %d bytes)", k.alignA, k.alignB, k.alignC, k.alignD)
	}
	p.wsSize = *(*uint64)(unsafe.Pointer(&p.algo[64])) // workspaceSize follows the 64-byte algo
	return p, nil
}

// destroyPlan releases a plan's descriptors (those created so far).
func (b *Blas) destroyPlan(p *gemmPlan) {
	if p.op != 0 {
		b.api.cublasLtMatmulDescDestroy(p.op)
	}
	for _, l := range []uintptr{p.a, p.b, p.c, p.d} {
		if l != 0 {
			b.api.cublasLtMatrixLayoutDestroy(l)
		}
	}
	*p = gemmPlan{}
}

// Close releases the plans, workspace and handle; it must not run inside Device.Do.
func (b *Blas) Close() error {
	if b.plans == nil {
		return nil
	}
	return b.dev.Do(func(c *Ctx) error {
		b.plans.each(func(_ gemmKey, p *gemmPlan) { b.destroyPlan(p) })
		b.plans = nil
		c.Free(b.ws)
		return b.api.check("cublasLtDestroy", b.api.cublasLtDestroy(b.h))
	})
}
