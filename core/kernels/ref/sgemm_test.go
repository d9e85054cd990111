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
	{100, 700, 513}, {130, 257, 300}, {3, 1024, 1}, {1100, 40, 70},
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

// TestOwnGemmAllocatesNothing: in steady state the own GEMM, split or not, keeps its
// packing buffers and allocates nothing, as the models' allocation-free steps need.
func TestOwnGemmAllocatesNothing(t *testing.T) {
	mr, nr := gemmMicro()
	if mr == 0 {
		t.Skip("no micro-kernel on this CPU")
	}
	m, k, n := 70, 300, 600
	x, w, out := make([]float32, m*k), make([]float32, n*k), make([]float32, m*n)
	for _, split := range []bool{false, true} {
		if a := testing.AllocsPerRun(20, func() { ownGemm(split, true, out, x, w, m, k, n, mr, nr) }); a != 0 {
			t.Errorf("split=%v: %v allocations per call", split, a)
		}
	}
}

// TestOwnGemmRowsIndependent: beyond the skinny kernel's 8 rows, a row of the own GEMM
// has the same bits whatever rows are beside it (a prefill chunk's token computed alone
// or in a batch of 100), since the sums' order depends on k alone.
func TestOwnGemmRowsIndependent(t *testing.T) {
	mr, nr := gemmMicro()
	if mr == 0 {
		t.Skip("no micro-kernel on this CPU")
	}
	rng := rand.New(rand.NewPCG(27, 2))
	m, k, n := 100, 600, 130
	x, w := randSlice(rng, m*k), randSlice(rng, n*k)
	all := make([]float32, m*n)
	ownGemm(true, true, all, x, w, m, k, n, mr, nr)
	for _, r := range [][2]int{{0, 9}, {37, 60}, {91, 100}} {
		part := make([]float32, (r[1]-r[0])*n)
		ownGemm(true, true, part, x[r[0]*k:r[1]*k], w, r[1]-r[0], k, n, mr, nr)
		for i, v := range part {
			if math.Float32bits(v) != math.Float32bits(all[r[0]*n+i]) {
				t.Fatalf("rows %v: out[%d] = %v, %v in the whole product", r, r[0]*n+i, v, all[r[0]*n+i])
			}
		}
	}
}

// TestGemv checks the one-row kernel the own GEMM runs MatMulT's single rows on against
// the exact product (within checkProduct's float32 bound), in 16 lanes (k%16 = 0) and 8,
// for fewer rows of w than a group of 8, a group, and groups with a tail.
func TestGemv(t *testing.T) {
	if !skinnyVector(8) {
		t.Skip("no AVX2+FMA: MatMulT's single rows run on gonum")
	}
	rng := rand.New(rand.NewPCG(27, 3))
	ownKernels(t, func(kernel string, _, _ int) {
		for _, k := range []int{8, 16, 24, 1024, 1032} {
			for _, n := range []int{1, 7, 8, 9, 300} {
				x, w, exact, scale := gemmOperands(rng, true, 1, k, n)
				got := nanFilled(n)
				gemv(got, x, k, w, k, n)
				checkProduct(t, fmt.Sprintf("gemv %s k=%d n=%d", kernel, k, n), got, exact, scale, k)
				got = nanFilled(n) // and through MatMulT's split, on the own GEMM
				skinnyGemm(true, got, x, w, 1, k, n)
				checkProduct(t, fmt.Sprintf("skinnyGemm m=1 %s k=%d n=%d", kernel, k, n), got, exact, scale, k)
			}
		}
	})
}

// TestPackRows checks packRows, on its transposing kernels (8 rows; 6 rows into a panel 6
// wide) and its loops, against the definition: dst[l*width + i] = src[i*ld + l], zeros
// for rows ≤ i < width, and nothing written past kc·width.
func TestPackRows(t *testing.T) {
	const ld = 37
	src := make([]float32, 16*ld)
	for i := range src {
		src[i] = float32(i + 1)
	}
	for _, width := range []int{6, 14, 16} {
		for rows := 1; rows <= width; rows++ {
			for _, kc := range []int{1, 7, 8, 19, 32} {
				dst := make([]float32, kc*width+8)
				for i := range dst {
					dst[i] = -1
				}
				packRows(dst, src, ld, rows, width, kc)
				for l := range kc {
					for i := range width {
						want := float32(0)
						if i < rows {
							want = src[i*ld+l]
						}
						if got := dst[l*width+i]; got != want {
							t.Fatalf("width %d rows %d kc %d: dst[%d*%d + %d] = %v, want %v", width, rows, kc, l, width, i, got, want)
						}
					}
				}
				for i := kc * width; i < len(dst); i++ {
					if dst[i] != -1 {
						t.Fatalf("width %d rows %d kc %d: dst[%d] past the panel written (%v)", width, rows, kc, i, dst[i])
					}
				}
			}
		}
	}
}
