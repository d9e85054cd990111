package ref

import (
	"fmt"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/blas32"

	cblas "github.com/resin-llm/resin/core/blas"
)

// minBLASWork is the smallest product (m·k·n multiply-adds) that goes to the BLAS library:
// below it the call into the library costs more than gonum's whole product
// (BenchmarkMatMulTSmall: OpenBLAS overtakes gonum between 16³ and 24³).
const minBLASWork = 20 * 20 * 20

// MatMul computes out = a·b.
//
//	a: [m, k]   b: [k, n]   out: [m, n]
func MatMul(out, a, b []float32, m, k, n int) error {
	return gemm("MatMul", false, out, a, b, m, k, n)
}

// MatMulT computes out = x·wᵀ, the layout of a Hugging Face Linear weight.
//
//	x: [m, k]   w: [n, k]   out: [m, n]
func MatMulT(out, x, w []float32, m, k, n int) error {
	return gemm("MatMulT", true, out, x, w, m, k, n)
}

// GEMMBackend names what runs MatMul and MatMulT: the vendor of the BLAS library that
// core/blas loaded ("OpenBLAS", "BLIS", "MKL", "CBLAS"), or "gonum" when there is none
// (core/blas.Info says why). Products under minBLASWork run on gonum either way.
func GEMMBackend() string {
	return cblas.Info().Vendor
}

// gemm computes out = a·op(b), where b is [k, n], or [n, k] when transB.
func gemm(op string, transB bool, out, a, b []float32, m, k, n int) error {
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
	if m*k*n >= minBLASWork {
		if lib := cblas.Default(); lib != nil {
			if err := lib.Sgemm(transB, m, n, k, a, b, out); err != nil {
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
