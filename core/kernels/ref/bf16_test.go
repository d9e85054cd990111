package ref

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestBF16 checks the rounding to bfloat16: nearest, ties to even, NaN kept a NaN, and
// FromBF16 exact on what BF16 returns.
func TestBF16(t *testing.T) {
	for _, c := range []struct {
		f    float32
		want uint16
	}{
		{1, 0x3f80}, {-2, 0xc000}, {0, 0}, {float32(math.Inf(1)), 0x7f80},
		{math.Float32frombits(0x3f808000), 0x3f80}, // a tie: to the even 0x3f80
		{math.Float32frombits(0x3f818000), 0x3f82}, // a tie: to the even 0x3f82
		{math.Float32frombits(0x3f808001), 0x3f81}, // above the tie
		{math.MaxFloat32, 0x7f80},                  // rounds up to +Inf, as torch's bfloat16 does
	} {
		if got := BF16(c.f); got != c.want {
			t.Errorf("BF16(%v = %#08x) = %#04x, want %#04x", c.f, math.Float32bits(c.f), got, c.want)
		}
	}
	if nan := FromBF16(BF16(float32(math.NaN()))); !math.IsNaN(float64(nan)) {
		t.Errorf("BF16(NaN) widens to %v", nan)
	}
	if got := FromBF16(0x3f81); got != 1+1.0/128 {
		t.Errorf("FromBF16(0x3f81) = %v", got)
	}
}

// TestMatMulTBF16 checks MatMulTBF16 three ways, on each kernel this CPU has and with the
// vector kernels off (blocks widened for gonum): against the exact product of x and the
// widened weights within float32 GEMM rounding (checkProduct's (k+2)·2⁻²⁴·Σ|x||w|); from
// 9 rows, to the bit what the own GEMM computes on the widened weights; and against the
// float32 weights the bfloat16 ones were rounded from, within the rounding of the weights
// (2⁻⁹ relative each) on top: 2⁻⁸·Σ|x||w| + the GEMM's bound.
func TestMatMulTBF16(t *testing.T) {
	rng := rand.New(rand.NewPCG(27, 4))
	shapes := [][3]int{{1, 8, 7}, {1, 24, 33}, {1, 1024, 300}, {1, 300, 9}, {2, 256, 33}, {8, 24, 300}, {5, 1024, 300}, {9, 300, 65}, {37, 1024, 100}, {5, 1, 3}}
	check := func(kernel string) {
		for _, s := range shapes {
			m, k, n := s[0], s[1], s[2]
			x, w32, exact32, scale := gemmOperands(rng, true, m, k, n)
			wb, wf := make([]uint16, n*k), make([]float32, n*k)
			for i, v := range w32 {
				wb[i] = BF16(v)
				wf[i] = FromBF16(wb[i])
			}
			// AMX rounds x to bfloat16 (two rows and more on the tiles, amxBF16Gemm, checked
			// against the float64 product in TestAMXBF16Gemm; one row on the GEMV on the
			// rounded x), as the opt-in AVX-512 BF16 prefill does; the float32 paths compute
			// on x as given.
			amx := hasAMXBF16 && k%32 == 0
			tiles := amx || hasBF16Dot && m > skinnyRows && k%2 == 0
			xr := x
			if tiles {
				xr = make([]float32, len(x))
				for i, v := range x {
					xr[i] = FromBF16(BF16(v))
				}
			}
			exact := make([]float64, m*n)
			for i := range m {
				for j := range n {
					for l := range k {
						exact[i*n+j] += float64(xr[i*k+l]) * float64(wf[j*k+l])
					}
				}
			}
			what := fmt.Sprintf("%s m=%d k=%d n=%d", kernel, m, k, n)
			got := nanFilled(m * n)
			if err := MatMulTBF16(got, x, wb, m, k, n); err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			checkProduct(t, what+" (widened weights)", got, exact, scale, k)
			for i := range exact32 {
				tol := (1.0/256+float64(k+2)/(1<<24))*scale[i] + 1e-30
				if tiles {
					tol += scale[i] / 256 // x's rounding: 2⁻⁹ of each term more
				}
				if d := math.Abs(float64(got[i]) - exact32[i]); !(d <= tol) {
					t.Fatalf("%s: out[%d] = %v, %v with the float32 weights (off by %.3g, tolerance %.3g)", what, i, got[i], exact32[i], d, tol)
				}
			}
			if amx && m >= 2 { // each row's bits whichever rows share its tiles
				pair := append(slices.Clone(x[:k]), x[(m-1)*k:m*k]...)
				two := nanFilled(2 * n)
				if err := MatMulTBF16(two, pair, wb, 2, k, n); err != nil {
					t.Fatal(err)
				}
				for r, i := range []int{0, m - 1} {
					for j := range n {
						if math.Float32bits(two[r*n+j]) != math.Float32bits(got[i*n+j]) {
							t.Fatalf("%s: row %d beside row %d alone gives out[%d] = %v, among %d rows %v", what, i, m-1-i, j, two[r*n+j], m, got[i*n+j])
						}
					}
				}
				continue
			}
			if amx { // one row: the GEMV on x rounded to bfloat16, to the bit
				want := nanFilled(n)
				if err := matMulTBF16F32(want, xr, wb, 1, k, n); err != nil {
					t.Fatal(err)
				}
				for j := range n {
					if math.Float32bits(want[j]) != math.Float32bits(got[j]) {
						t.Fatalf("%s: out[%d] = %v, the float32 GEMV gives %v on x rounded", what, j, got[j], want[j])
					}
				}
				continue
			}
			// skinnyGemm's bits on the widened weights, but where the AVX-512 kernel reads
			// the bfloat16 rows as stored (skinnyBF16Direct: even and odd steps summed
			// apart, as the even-odd GEMV does), within checkProduct's bound above.
			if m > 1 && m <= skinnyRows && skinnyVector(k) && !skinnyBF16Direct(k) {
				want := make([]float32, m*n)
				skinnyGemm(true, want, x, wf, m, k, n)
				for i := range want {
					if math.Float32bits(want[i]) != math.Float32bits(got[i]) {
						t.Fatalf("%s: out[%d] = %v, skinnyGemm gives %v on the widened weights", what, i, got[i], want[i])
					}
				}
			}
			if mr, nr := gemmMicro(); mr > 0 && m > skinnyRows && !tiles {
				want := make([]float32, m*n)
				ownGemm(true, true, want, x, wf, m, k, n, mr, nr)
				for i := range want {
					if math.Float32bits(want[i]) != math.Float32bits(got[i]) {
						t.Fatalf("%s: out[%d] = %v, the own GEMM gives %v on the widened weights", what, i, got[i], want[i])
					}
				}
			}
		}
	}
	if mr, _ := gemmMicro(); mr > 0 {
		ownKernels(t, func(kernel string, _, _ int) {
			bf16Paths(func(path string) { check(kernel + " " + path) })
		})
	}
	withoutVector(t, func() { check("no vector kernels") })
}

// TestMatMulTBF16ChecksShapes: bad shapes are errors naming the argument.
func TestMatMulTBF16ChecksShapes(t *testing.T) {
	for name, err := range map[string]error{
		"short w":    MatMulTBF16(make([]float32, 4), make([]float32, 4), make([]uint16, 3), 2, 2, 2),
		"short x":    MatMulTBF16(make([]float32, 4), make([]float32, 3), make([]uint16, 4), 2, 2, 2),
		"short out":  MatMulTBF16(make([]float32, 3), make([]float32, 4), make([]uint16, 4), 2, 2, 2),
		"negative k": MatMulTBF16(nil, nil, nil, 2, -1, 2),
	} {
		if err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// BenchmarkMatMulTBF16 puts MatMulTBF16 beside MatMulT (float32 weights, on whatever
// backend this process chose) at a ~120M llama's gate+up and lm head shapes, for decode
// (m=1), a decode batch (m=8) and a prefill chunk (m=512); the dtype is the last element
// of the name.
func BenchmarkMatMulTBF16(b *testing.B) {
	for _, m := range []int{1, 8, 512} {
		for _, s := range []struct {
			name string
			k, n int
		}{{"gateup", 1024, 5632}, {"lmhead", 1024, 32000}} {
			for _, dtype := range []string{"fp32", "bf16"} {
				b.Run(fmt.Sprintf("m=%d/%s_k=%d_n=%d/%s", m, s.name, s.k, s.n, dtype), func(b *testing.B) {
					x, w, out := randSlice(rand.New(rand.NewPCG(1, 2)), m*s.k), randSlice(rand.New(rand.NewPCG(3, 4)), s.n*s.k), make([]float32, m*s.n)
					wb := make([]uint16, len(w))
					for i, v := range w {
						wb[i] = BF16(v)
					}
					b.ReportAllocs()
					for b.Loop() {
						var err error
						if dtype == "bf16" {
							err = MatMulTBF16(out, x, wb, m, s.k, s.n)
						} else {
							err = MatMulT(out, x, w, m, s.k, s.n)
						}
						if err != nil {
							b.Fatal(err)
						}
					}
					b.ReportMetric(2*float64(m*s.k*s.n)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
				})
			}
		}
	}
}
