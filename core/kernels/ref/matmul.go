package ref

import (
	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/blas32"
)

// MatMul computes out = a·b.
//
//	a: [m, k]   b: [k, n]   out: [m, n]
func MatMul(out, a, b []float32, m, k, n int) error {
	return gemm("MatMul", blas.NoTrans, out, a, b, m, k, n)
}

// MatMulT computes out = x·wᵀ, the layout of a Hugging Face Linear weight.
//
//	x: [m, k]   w: [n, k]   out: [m, n]
func MatMulT(out, x, w []float32, m, k, n int) error {
	return gemm("MatMulT", blas.Trans, out, x, w, m, k, n)
}

// gemm computes out = a·op(b), where b is [k, n] (NoTrans) or [n, k] (Trans).
func gemm(op string, tb blas.Transpose, out, a, b []float32, m, k, n int) error {
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
	bm := blas32.General{Rows: k, Cols: n, Stride: n, Data: b}
	if tb == blas.Trans {
		bm = blas32.General{Rows: n, Cols: k, Stride: k, Data: b}
	}
	blas32.Gemm(blas.NoTrans, tb, 1,
		blas32.General{Rows: m, Cols: k, Stride: k, Data: a}, bm,
		0, blas32.General{Rows: m, Cols: n, Stride: n, Data: out})
	return nil
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
