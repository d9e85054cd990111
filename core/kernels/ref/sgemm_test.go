package ref

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// ownShapes puts m, k and n on both sides of every block size of ownGemm (MR 6 and 14, NR
// 16 and 32, gemmKC 256, gemmNC 256) and at 1.
var ownShapes = [][3]int{ // m, k, n
	{1, 1, 1}, {1, 300, 97}, {2, 1, 33}, {5, 17, 16}, {6, 256, 32}, {7, 257, 31},
	{13, 255, 65}, {14, 512, 64}, {15, 513, 257}, {29, 40, 300}, {64, 64, 64},
	{100, 700, 513}, {130, 257, 300}, {3, 1024, 1},
}

// ownKernels runs f on each micro-kernel this CPU has: AVX-512, then AVX2 with AVX-512
// switched off.
func ownKernels(t *testing.T, f func(kernel string, mr, nr int)) {
	t.Helper()
	mr, nr := gemmMicro()
	if mr == 0 {
		t.Skip("no micro-kernel on this CPU (gonum runs the GEMMs)")
	}
	f(fmt.Sprintf("%dx%d", mr, nr), mr, nr)
	if hasSkinnyAVX512 {
		hasSkinnyAVX512 = false
		defer func() { hasSkinnyAVX512 = true }()
		mr, nr := gemmMicro()
		f(fmt.Sprintf("%dx%d", mr, nr), mr, nr)
	}
}

// TestOwnGemm checks ownGemm, both layouts, against the exact product within float32
// GEMM rounding (checkProduct: (k+2)·2⁻²⁴·Σ|a||b| per element), on one goroutine and split
// across the pool, and that the split changes no bit.
func TestOwnGemm(t *testing.T) {
	rng := rand.New(rand.NewPCG(27, 1))
	ownKernels(t, func(kernel string, mr, nr int) {
		for _, s := range ownShapes {
			m, k, n := s[0], s[1], s[2]
			for _, transB := range []bool{false, true} {
				a, b, exact, scale := gemmOperands(rng, transB, m, k, n)
				what := fmt.Sprintf("%s transB=%v m=%d k=%d n=%d", kernel, transB, m, k, n)
				one := nanFilled(m * n)
				ownGemm(false, transB, one, a, b, m, k, n, mr, nr)
				checkProduct(t, what, one, exact, scale, k)
				split := nanFilled(m * n)
				ownGemm(true, transB, split, a, b, m, k, n, mr, nr)
				for i := range one {
					if math.Float32bits(one[i]) != math.Float32bits(split[i]) {
						t.Fatalf("%s: out[%d] = %v on one goroutine, %v split", what, i, one[i], split[i])
					}
				}
			}
		}
	})
}
