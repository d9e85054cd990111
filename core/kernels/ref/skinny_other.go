//go:build !amd64

package ref

// skinnyVector is false where there is no vector form: small products go to the BLAS or
// gonum.
func skinnyVector(k int) bool { return false }

func skinny(ct, x []float32, k int, w []float32, ldw, n int) {
	panic("ref: skinny without a vector form")
}

// hasSkinnyAVX512 is false where there is no vector form.
var hasSkinnyAVX512 = false

func gemv(out, x []float32, k int, w []float32, ldw, n int) {
	panic("ref: gemv without a vector form")
}

func gemvBF16EvenOdd(k int) bool { return false }

func gemvBF16(out, x, xp []float32, k int, w []uint16, ldw, n int) {
	panic("ref: gemvBF16 without a vector form")
}

func skinnyBF16Direct(k int) bool { return false }

func skinnyBF16EO(ct, xp []float32, k int, w []uint16, ldw, n int) {
	panic("ref: skinnyBF16EO without a vector form")
}
