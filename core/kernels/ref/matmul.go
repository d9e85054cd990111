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
// core/blas loaded ("OpenBLAS", "BLIS", "MKL", "CBLAS"), or "gonum" when there is none
// (core/blas.Info says why). Products with a b under minBLASWeight run on gonum either way.
//
// gonum gives a row the same bits whatever m is; a BLAS need not (one row goes to sgemv,
// and OpenBLAS has separate kernels for small products), so on it a row computed alone
// and in a batch can differ by float32 rounding (~1e-6 relative per GEMM): tests that
// compare batch shapes need a tolerance, not equality.
func GEMMBackend() string {
	if lib := cblas.Default(); lib != nil {
		return lib.Vendor
	}
	return "gonum"
}

// gemm computes out = a·op(b), where b is [k, n], or [n, k] when transB. With split, a
// large product on the BLAS is split across the worker pool (blasGemm); without, it runs
// whole on the caller, as a participant of a pool loop computes its own small products.
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
