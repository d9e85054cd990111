package ref

import (
	"math"
	"math/rand/v2"
	"testing"
)

// bf16DotTol bounds |bf16DotGemm − the float64 product of the bf16-rounded x and w| over
// the row's Σ|x·w|: the dot products sum in float32 in another order than the reference.
const bf16DotTol = 1e-5

// TestBF16DotGemm: the AVX-512 BF16 prefill product equals the product of x rounded to
// bfloat16 and the bfloat16 w (float64 reference), within bf16DotTol of each output's
// Σ|terms|, on shapes with partial tiles (rows not a multiple of 14, columns not of 32),
// one k-pair and long rows; an odd k is refused (false) for the caller's fallback.
func TestBF16DotGemm(t *testing.T) {
	if !canBF16Dot {
		t.Skip("no AVX512_BF16 here")
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, sh := range [][3]int{{9, 2, 1}, {14, 64, 32}, {15, 64, 33}, {33, 1024, 100}, {512, 256, 31}, {1, 8, 8}} {
		m, k, n := sh[0], sh[1], sh[2]
		x, wf := make([]float32, m*k), make([]float32, n*k)
		for i := range x {
			x[i] = float32(rng.NormFloat64())
		}
		w := make([]uint16, n*k)
		for i := range wf {
			w[i] = BF16(float32(rng.NormFloat64()) / 8)
		}
		out := make([]float32, m*n)
		for i := range out {
			out[i] = float32(math.NaN()) // every output written
		}
		if !bf16DotGemm(out, x, w, m, k, n) {
			t.Fatalf("%v: refused", sh)
		}
		worst := 0.0
		for i := range m {
			for j := range n {
				var ref, mag float64
				for l := range k {
					term := float64(FromBF16(BF16(x[i*k+l]))) * float64(FromBF16(w[j*k+l]))
					ref += term
					mag += math.Abs(term)
				}
				d := math.Abs(float64(out[i*n+j])-ref) / max(mag, 1e-30)
				if !(d <= bf16DotTol) {
					t.Fatalf("%v: out[%d,%d] = %g, reference %g (%.3g of Σ|terms|)", sh, i, j, out[i*n+j], ref, d)
				}
				worst = max(worst, d)
			}
		}
		t.Logf("%v: within %.3g of Σ|terms|", sh, worst)
	}
	if bf16DotGemm(make([]float32, 9), make([]float32, 9*3), make([]uint16, 3), 9, 3, 1) {
		t.Error("an odd k was not refused")
	}
}

// BenchmarkBF16DotGemm: a 512-token prefill's gate_up product of the bench llama (k
// 1024, n 5632) on AMX tiles, on the AVX-512 BF16 path and on the widening own GEMM, in
// GFLOP/s.
func BenchmarkBF16DotGemm(b *testing.B) {
	const m, k, n = 512, 1024, 5632
	x, w, out := make([]float32, m*k), make([]uint16, n*k), make([]float32, m*n)
	for i := range x {
		x[i] = float32(i%7) - 3
	}
	for i := range w {
		w[i] = BF16(float32(i%5) - 2)
	}
	flops := func(b *testing.B) { b.ReportMetric(2*m*k*n*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s") }
	b.Run("bf16dot", func(b *testing.B) {
		if !canBF16Dot {
			b.Skip("no AVX512_BF16")
		}
		for b.Loop() {
			bf16DotGemm(out, x, w, m, k, n)
		}
		flops(b)
	})
	b.Run("amx", func(b *testing.B) {
		if !hasAMXBF16 {
			b.Skip("no AMX-BF16 granted")
		}
		for b.Loop() {
			amxBF16Gemm(out, x, w, m, k, n)
		}
		flops(b)
	})
	b.Run("widened", func(b *testing.B) {
		mr, nr := gemmMicro()
		if mr == 0 {
			b.Skip("no own GEMM here")
		}
		for b.Loop() {
			ownGemmOn(true, true, out, x, nil, w, m, k, n, mr, nr)
		}
		flops(b)
	})
}
