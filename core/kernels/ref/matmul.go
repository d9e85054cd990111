package ref

import (
	"fmt"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/blas32"

	cblas "github.com/resin-llm/resin/core/blas"
)

// minBLASWeight is the smallest b (k·n values) whose products go to the BLAS library, at
// every m: the choice follows the weight, not the batch, so a row's result does not switch
// backend with the number of rows beside it. Below it the call into the library costs
// about as much as gonum's whole product (BenchmarkMatMulTSmall).
const minBLASWeight = 64 * 64

// MatMul computes out = a·b.
//
//	a: [m, k]   b: [k, n]   out: [m, n]
func MatMul(out, a, b []float32, m, k, n int) error {
	return gemm("MatMul", false, true, out, a, b, m, k, n)
}

// MatMulT computes out = x·wᵀ, the layout of a Hugging Face Linear weight.
//
//	x: [m, k]   w: [n, k]   out: [m, n]
func MatMulT(out, x, w []float32, m, k, n int) error {
	return gemm("MatMulT", true, true, out, x, w, m, k, n)
}

// GEMMBackend names what runs MatMul and MatMulT: the vendor of the BLAS library that
// core/blas loaded ("OpenBLAS", "BLIS", "MKL", "CBLAS"); without one "own", the
// package's own GEMM (ownGemm; GEMMKernel names its micro-kernel), or "gonum" where
// RESIN_BLAS asks for it or the CPU has no micro-kernel (core/blas.Info says why).
// Products with a b under minBLASWeight run on gonum either way.
//
// A row's bits may depend on the rows beside it: products of 2 to 8 rows (1 to 8 on the
// own GEMM) run on an AVX2 kernel where the CPU has one (skinnyGemm), one row goes to
// sgemv on a library, and OpenBLAS has separate kernels for small products; so a row
// computed alone and in a batch can differ by float32 rounding (~1e-6 relative per
// GEMM): tests that compare batch shapes need a tolerance, not equality. Beyond 8 rows
// the own GEMM gives a row the same bits whatever rows are beside it.
func GEMMBackend() string {
	if lib := cblas.Default(); lib != nil {
		return lib.Vendor
	}
	if mr, _ := ownMicro(); mr > 0 {
		return "own"
	}
	return "gonum"
}

// GEMMKernel names the micro-kernel of the own GEMM on this CPU ("AVX-512 14x32",
// "AVX2+FMA 6x16"), or "" where there is none; GEMMBackend says whether it runs.
func GEMMKernel() string {
	switch mr, nr := gemmMicro(); mr {
	case 0:
		return ""
	case 14:
		return fmt.Sprintf("AVX-512 %dx%d", mr, nr)
	default:
		return fmt.Sprintf("AVX2+FMA %dx%d", mr, nr)
	}
}

// ownMicro returns the tile of the micro-kernel ownGemm runs on, or 0, 0 when the own
// GEMM does not run (a library is loaded, RESIN_BLAS asks for gonum, or the CPU has no
// micro-kernel).
func ownMicro() (mr, nr int) {
	if !cblas.Own() {
		return 0, 0
	}
	return gemmMicro()
}

// gemm computes out = a·op(b), where b is [k, n], or [n, k] when transB. With split, a
// large product on the BLAS or the skinny kernel is split across the worker pool;
// without, it is one call on the caller's goroutine, as a participant of a pool loop
// computes its own small products (gonum may still split a product into goroutines of
// its own).
func gemm(op string, transB, split bool, out, a, b []float32, m, k, n int) error {
	if err := checkGemm(op, out, a, b, m, k, n); err != nil {
		return err
	}
	if m == 0 || n == 0 {
		return nil
	}
	if k == 0 {
		clear(out[:m*n])
		return nil
	}
	// One row too on the own GEMM (gemv): ownGemm would pack all of w for one row.
	if transB && m <= skinnyRows && k*n >= minBLASWeight && skinnyVector(k) && (m >= 2 || cblas.Own()) {
		skinnyGemm(split, out, a, b, m, k, n)
		return nil
	}
	if k*n >= minBLASWeight {
		if lib := cblas.Default(); lib != nil {
			var err error
			if split {
				err = blasGemm(lib, transB, out, a, b, m, k, n)
			} else {
				err = lib.Sgemm(transB, m, n, k, a, b, out)
			}
			if err != nil {
				return fmt.Errorf("ref.%s: %w", op, err)
			}
			return nil
		}
		if mr, nr := ownMicro(); mr > 0 {
			ownGemm(split, transB, out, a, b, m, k, n, mr, nr)
			return nil
		}
	}
	gonumGemm(transB, out, a, b, m, k, n)
	return nil
}

// gonumGemm is gemm on gonum's pure-Go SGEMM, for k > 0.
func gonumGemm(transB bool, out, a, b []float32, m, k, n int) {
	tb, bm := blas.NoTrans, blas32.General{Rows: k, Cols: n, Stride: n, Data: b}
	if transB {
		tb, bm = blas.Trans, blas32.General{Rows: n, Cols: k, Stride: k, Data: b}
	}
	blas32.Gemm(blas.NoTrans, tb, 1,
		blas32.General{Rows: m, Cols: k, Stride: k, Data: a}, bm,
		0, blas32.General{Rows: m, Cols: n, Stride: n, Data: out})
}

func checkGemm(op string, out, a, b []float32, m, k, n int) error {
	if err := checkDims(op, m, k, n); err != nil {
		return err
	}
	if err := checkLen(op, "out", len(out), m*n); err != nil {
		return err
	}
	if err := checkLen(op, "a", len(a), m*k); err != nil {
		return err
	}
	return checkLen(op, "b", len(b), k*n)
}

// skinnyRows is the most rows of a product skinnyGemm computes. Below it a decode batch's
// product streams the weight at memory speed on the AVX2 kernel, where OpenBLAS 0.3.34
// (SkylakeX kernels) runs m=8, k=1024, n=2816 at about a third of that.
const skinnyRows = 8

// skinnyGemm computes out = x·wᵀ for 2 ≤ m ≤ skinnyRows on the AVX2 kernel (skinny): x's
// rows copied into 8 rows of scratch (zeros below m), the product computed transposed in
// blocks of w's rows (split across the pool when split and large), then transposed into
// out. One row (m = 1) goes to gemv, in the same blocks, straight into out.
func skinnyGemm(split bool, out, x, w []float32, m, k, n int) {
	t := skinnyTasks.get()
	defer func() {
		t.w, t.out = nil, nil
		skinnyTasks.put(t)
	}()
	t.xp, t.ct = growFloat32s(t.xp, skinnyRows*k), growFloat32s(t.ct, n*skinnyRows)
	copy(t.xp, x[:m*k])
	clear(t.xp[m*k:])
	t.w, t.out, t.m, t.k, t.n = w, out, m, k, n
	if p := parts(); split && p > 1 && m*n*k >= minParallelMACs {
		// Two blocks a participant: the kernel streams w, and a late participant leaves
		// less to the others.
		t.block = roundUp((n+2*p-1)/(2*p), 8)
		parallelFor(&t.loop, t, (n+t.block-1)/t.block, 1)
	} else {
		t.rows(0, n)
	}
	if m == 1 {
		return
	}
	for i := range m {
		o := out[i*n : (i+1)*n]
		for j := range o {
			o[j] = t.ct[j*skinnyRows+i]
		}
	}
}

// skinnyTask is one skinnyGemm call split in blocks of w's rows, a pool task.
type skinnyTask struct {
	loop           loop
	xp, ct, w, out []float32 // xp and ct are kept across calls
	m, k, n, block int
}

var skinnyTasks freeList[skinnyTask]

func (t *skinnyTask) run(_, lo, hi int) {
	for b := lo; b < hi; b++ {
		t.rows(b*t.block, min((b+1)*t.block, t.n))
	}
}

// rows computes the product's columns [j0, j1), in runs of w's rows about 64 KiB long:
// a run against x's first 4 rows, then against its last 4 when there are more than 4 (the
// same rows of w again, from cache).
func (t *skinnyTask) rows(j0, j1 int) {
	if t.m == 1 {
		gemv(t.out[j0:j1], t.xp, t.k, t.w[j0*t.k:], t.k, j1-j0)
		return
	}
	run := max(2, (64<<10)/(4*t.k))
	for r0 := j0; r0 < j1; r0 += run {
		r1 := min(r0+run, j1)
		skinny(t.ct[r0*skinnyRows:], t.xp, t.k, t.w[r0*t.k:], t.k, r1-r0)
		if t.m > 4 {
			skinny(t.ct[r0*skinnyRows+4:], t.xp[4*t.k:], t.k, t.w[r0*t.k:], t.k, r1-r0)
		}
	}
}
