package ref

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// TestAttnKernelsMatchNaive checks attnDots and attnAxpys against float64 loops over head
// dimensions that take each column path (8 at a time, 64 at a time, both), key counts
// around the 8-key blocks, several heads and strides wider than a row.
func TestAttnKernelsMatchNaive(t *testing.T) {
	if !attnVector(8) {
		t.Skip("no AVX2 and FMA: the attention units run on the GEMM and scalar paths")
	}
	r := rand.New(rand.NewPCG(31, 32))
	for _, d := range []int{8, 24, 64, 72, 128, 136} {
		for _, heads := range []int{1, 3, 4} {
			for _, n := range []int{0, 1, 7, 8, 9, 16, 17, 33} {
				kstride := d + 8*r.IntN(3)
				name := fmt.Sprintf("d=%d heads=%d n=%d kstride=%d", d, heads, n, kstride)
				q := randSlice(r, heads*d)
				k := randSlice(r, max(n, 1)*kstride)
				sstride := n + 3
				s := make([]float32, heads*sstride)
				attnDots(s, sstride, q, heads, d, k, kstride, n)
				for h := range heads {
					for i := range n {
						var want float64
						for j := range d {
							want += float64(q[h*d+j]) * float64(k[i*kstride+j])
						}
						if got := float64(s[h*sstride+i]); math.Abs(got-want) > 1e-5*(1+math.Abs(want)) {
							t.Fatalf("%s: score[%d][%d] = %v, want %v", name, h, i, got, want)
						}
					}
					for i := n; i < sstride; i++ {
						if s[h*sstride+i] != 0 {
							t.Fatalf("%s: wrote past the %d scores of head %d", name, n, h)
						}
					}
				}

				ostride := d + 8
				o := randSlice(r, heads*ostride)
				o0 := append([]float32(nil), o...)
				w := randSlice(r, heads*sstride)
				attnAxpys(o, ostride, w, sstride, heads, d, k, kstride, n)
				for h := range heads {
					for j := range ostride {
						want := float64(o0[h*ostride+j])
						if j < d {
							for i := range n {
								want += float64(w[h*sstride+i]) * float64(k[i*kstride+j])
							}
						}
						if got := float64(o[h*ostride+j]); math.Abs(got-want) > 1e-5*(1+math.Abs(want)) {
							t.Fatalf("%s: out[%d][%d] = %v, want %v", name, h, j, got, want)
						}
					}
				}
			}
		}
	}
}
