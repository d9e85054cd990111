// The Go side of skinny_amd64.s: the AVX2/FMA kernels of products of a few rows (skinny,
// gemv, gemvBF16), with the checks their callers rely on.

package ref

import "golang.org/x/sys/cpu"

// skinnyAVX2 is in skinny_amd64.s.
//
//go:noescape
func skinnyAVX2(ct *float32, x *float32, k int, w *float32, ldw int, n int)

// skinnyVector says whether skinny runs for inner dimension k: with AVX2 and FMA, and k a
// multiple of 8.
func skinnyVector(k int) bool { return hasAttnAVX2 && k > 0 && k%8 == 0 }

// skinnyAVX512 is in skinny_amd64.s.
//
//go:noescape
func skinnyAVX512(ct *float32, x *float32, k int, w *float32, ldw int, n int)

// hasSkinnyAVX512 says whether skinny runs skinnyAVX512 (AVX-512F, with the OS saving its
// registers) for inner dimensions that are a multiple of 16.
var hasSkinnyAVX512 = hasAttnAVX2 && cpu.X86.HasAVX512F

// skinny sets ct[j*8 + i] = x[i*k:][:k]·w[j*ldw:][:k] for i < 4, j < n: 4 rows of x (k
// values each, contiguous) against n rows of w, transposed into rows of 8 (ct offset by 4
// takes x's rows 4 to 7); skinnyVector(k) must hold.
func skinny(ct, x []float32, k int, w []float32, ldw, n int) {
	if n == 0 {
		return
	}
	_, _, _ = ct[(n-1)*8+3], x[4*k-1], w[(n-1)*ldw+k-1]
	if hasSkinnyAVX512 && k%16 == 0 {
		skinnyAVX512(&ct[0], &x[0], k, &w[0], ldw, n)
		return
	}
	skinnyAVX2(&ct[0], &x[0], k, &w[0], ldw, n)
}

// gemvAVX2 and gemvAVX512 are in skinny_amd64.s.
//
//go:noescape
func gemvAVX2(out *float32, x *float32, k int, w *float32, ldw int, n8 int)

//go:noescape
func gemvAVX512(out *float32, x *float32, k int, w *float32, ldw int, n8 int)

// gemv sets out[j] = x[:k]·w[j*ldw:][:k] for j < n: one row of x against n rows of w, 8
// rows at a time on the kernel (16 lanes where the CPU has AVX-512 and k%16 = 0), the
// last n%8 in a loop; skinnyVector(k) must hold.
func gemv(out, x []float32, k int, w []float32, ldw, n int) {
	if n8 := n / 8; n8 > 0 {
		_, _, _ = out[n8*8-1], x[k-1], w[(n8*8-1)*ldw+k-1]
		if hasSkinnyAVX512 && k%16 == 0 {
			gemvAVX512(&out[0], &x[0], k, &w[0], ldw, n8)
		} else {
			gemvAVX2(&out[0], &x[0], k, &w[0], ldw, n8)
		}
	}
	for j := n &^ 7; j < n; j++ {
		var s float32
		for l, v := range x[:k] {
			s += v * w[j*ldw+l]
		}
		out[j] = s
	}
}

// gemvBF16AVX2 and gemvBF16AVX512 are in skinny_amd64.s.
//
//go:noescape
func gemvBF16AVX2(out *float32, x *float32, k int, w *uint16, ldw int, n8 int)

//go:noescape
func gemvBF16AVX512(out *float32, x *float32, k int, w *uint16, ldw int, n8 int)

// gemvBF16EOAVX512 and gemvBF16EOAVX2 are in skinny_amd64.s.
//
//go:noescape
func gemvBF16EOAVX512(out *float32, xp *float32, k int, w *uint16, ldw int, n8 int)

//go:noescape
func gemvBF16EOAVX2(out *float32, xp *float32, k int, w *uint16, ldw int, n8 int)

// gemvBF16EvenOdd says whether gemvBF16 runs an even-odd kernel for inner dimension k (AVX2
// and FMA, k a multiple of 32), given x in evenOdd's layout.
func gemvBF16EvenOdd(k int) bool { return hasAttnAVX2 && k > 0 && k%32 == 0 }

// gemvBF16 is gemv on a bfloat16 w, widened to float32 as it is read; skinnyVector(k)
// must hold. xp is x in evenOdd's layout where gemvBF16EvenOdd(k), for its kernel; nil
// runs the others.
func gemvBF16(out, x, xp []float32, k int, w []uint16, ldw, n int) {
	if n8 := n / 8; n8 > 0 {
		_, _, _ = out[n8*8-1], x[k-1], w[(n8*8-1)*ldw+k-1]
		switch {
		case xp != nil && gemvBF16EvenOdd(k) && hasSkinnyAVX512:
			_ = xp[k-1]
			gemvBF16EOAVX512(&out[0], &xp[0], k, &w[0], ldw, n8)
		case xp != nil && gemvBF16EvenOdd(k):
			_ = xp[k-1]
			gemvBF16EOAVX2(&out[0], &xp[0], k, &w[0], ldw, n8)
		case hasSkinnyAVX512 && k%16 == 0:
			gemvBF16AVX512(&out[0], &x[0], k, &w[0], ldw, n8)
		default:
			gemvBF16AVX2(&out[0], &x[0], k, &w[0], ldw, n8)
		}
	}
	for j := n &^ 7; j < n; j++ {
		var s float32
		for l, v := range x[:k] {
			s += v * FromBF16(w[j*ldw+l])
		}
		out[j] = s
	}
}

// skinnyBF16EOAVX512 is in skinny_amd64.s.
//
//go:noescape
func skinnyBF16EOAVX512(ct *float32, xp *float32, k int, w *uint16, ldw int, n int)

// skinnyBF16Direct says whether skinnyBF16 multiplies w's bfloat16 rows as stored
// (skinnyBF16EOAVX512, x in evenOdd's layout) instead of widening runs of them into
// scratch: AVX-512, k a multiple of 32.
func skinnyBF16Direct(k int) bool { return hasAttnAVX2 && hasSkinnyAVX512 && k > 0 && k%32 == 0 }

// skinnyBF16EO is skinny on a bfloat16 w read as stored, x's 4 rows (xp) in evenOdd's
// layout; skinnyBF16Direct(k) must hold.
func skinnyBF16EO(ct, xp []float32, k int, w []uint16, ldw, n int) {
	if n == 0 {
		return
	}
	_ = ct[(n-1)*8+3]
	_ = xp[4*k-1]
	_ = w[(n-1)*ldw+k-1]
	skinnyBF16EOAVX512(&ct[0], &xp[0], k, &w[0], ldw, n)
}
