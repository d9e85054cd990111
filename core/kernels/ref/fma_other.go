//go:build !amd64

package ref

// attnVector is false where there is no vector form (only amd64 has one): attention
// units run on the GEMM and scalar paths.
func attnVector(d int) bool { return false }

// prefetch does nothing where there is no vector form.
func prefetch(s []float32) {}

func attnDots(s []float32, sstride int, q []float32, g, d int, k []float32, kstride, n int) {
	panic("ref: attnDots without a vector form")
}

func attnAxpys(o []float32, ostride int, w []float32, wstride, g, d int, v []float32, vstride, n int) {
	panic("ref: attnAxpys without a vector form")
}

// skinnyVector is false where there is no vector form: small products go to the BLAS or
// gonum.
func skinnyVector(k int) bool { return false }

func skinny(ct, x []float32, k int, w []float32, ldw, n int) {
	panic("ref: skinny without a vector form")
}

// CPUKernels names the vector forms this CPU runs: "scalar" where there are none (only
// amd64 has them).
func CPUKernels() string { return "scalar" }

// hasSkinnyAVX512 is false where there is no vector form.
var hasSkinnyAVX512 = false

func gemv(out, x []float32, k int, w []float32, ldw, n int) {
	panic("ref: gemv without a vector form")
}

func gemvBF16EvenOdd(k int) bool { return false }

func gemvBF16(out, x, xp []float32, k int, w []uint16, ldw, n int) {
	panic("ref: gemvBF16 without a vector form")
}
