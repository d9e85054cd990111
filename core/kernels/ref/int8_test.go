package ref

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// withoutInt8VNNI runs f with MatMulTInt8's VNNI kernels off, as on a CPU without them,
// and its AVX2 kernel off too unless avx2.
func withoutInt8VNNI(f func(), avx2 ...bool) {
	old, old2 := hasInt8VNNI, hasInt8AVX2
	hasInt8VNNI = false
	hasInt8AVX2 = hasInt8AVX2 && len(avx2) > 0 && avx2[0]
	defer func() { hasInt8VNNI, hasInt8AVX2 = old, old2 }()
	f()
}

// TestQuantizeInt8RoundTrip: every dequantised weight is within half its block's scale of
// the weight, and the scale is the block's max|w|/127.
func TestQuantizeInt8RoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(81, 82))
	for _, s := range [][2]int{{1, 1}, {16, 32}, {19, 70}, {40, 256}} {
		n, k := s[0], s[1]
		w := randSlice(r, n*k)
		w[0] = 0.9 // a block with one large value
		q, err := QuantizeInt8(w, n, k)
		if err != nil {
			t.Fatal(err)
		}
		deq := make([]float32, n*k)
		if err := q.Dequantize(deq); err != nil {
			t.Fatal(err)
		}
		for j := range n {
			for b := 0; b*q8Block < k; b++ {
				var amax float32
				for l := b * q8Block; l < min(k, (b+1)*q8Block); l++ {
					amax = max(amax, abs32(w[j*k+l]))
				}
				d := q.scales[(j/q8Group*q.nb+b)*q8Group+j%q8Group]
				if d != amax/127 {
					t.Fatalf("%dx%d: row %d block %d: scale %v, want max|w|/127 = %v", n, k, j, b, d, amax/127)
				}
				for l := b * q8Block; l < min(k, (b+1)*q8Block); l++ {
					if e := abs32(deq[j*k+l] - w[j*k+l]); e > d/2*(1+1e-6) {
						t.Fatalf("%dx%d: w[%d,%d] = %v dequantised to %v: off by %v, more than half the scale %v", n, k, j, l, w[j*k+l], deq[j*k+l], e, d)
					}
				}
			}
		}
	}
}

// int8Bound is the most out[i, j] of MatMulTInt8 may be off from the exact x·wᵀ: per
// block, Σ |x|·d_w/2 + (|w| + d_w/2)·d_x/2, plus float32 rounding of the block sums.
func int8Bound(x, w []float32, q *Int8Matrix, i, j, k int) float64 {
	var bound, mag float64
	for b := 0; b*q8Block < k; b++ {
		var xmax float64
		for l := b * q8Block; l < min(k, (b+1)*q8Block); l++ {
			xmax = max(xmax, math.Abs(float64(x[i*k+l])))
		}
		dx := xmax / 127
		dw := float64(q.scales[(j/q8Group*q.nb+b)*q8Group+j%q8Group])
		for l := b * q8Block; l < min(k, (b+1)*q8Block); l++ {
			xa, wa := math.Abs(float64(x[i*k+l])), math.Abs(float64(w[j*k+l]))
			bound += xa*dw/2 + (wa+dw/2)*dx/2
			mag += xa * wa
		}
	}
	return bound*(1+1e-5) + 1e-5*mag + 1e-6
}

// TestMatMulTInt8: against the exact product of the float32 weights and activations, every
// output is within int8Bound (the error quantising both can make, which this test would
// catch a wrong block, row or scale exceeding), on the VNNI kernels where the CPU has them
// and on the scalar loops; the two agree within float32 rounding. Shapes cover rows in
// fours and ones, k not a multiple of 32 and n not a multiple of 16.
func TestMatMulTInt8(t *testing.T) {
	r := rand.New(rand.NewPCG(83, 84))
	for _, s := range [][3]int{{1, 64, 32}, {1, 70, 19}, {2, 32, 16}, {3, 96, 48}, {4, 128, 16}, {5, 100, 33}, {9, 256, 64}, {17, 1024, 40}, {64, 512, 96}} {
		m, k, n := s[0], s[1], s[2]
		x, w := randSlice(r, m*k), randSlice(r, n*k)
		q, err := QuantizeInt8(w, n, k)
		if err != nil {
			t.Fatal(err)
		}
		got, scalar, avx2 := make([]float32, m*n), make([]float32, m*n), make([]float32, m*n)
		if err := MatMulTInt8(got, x, q, m); err != nil {
			t.Fatal(err)
		}
		withoutInt8VNNI(func() {
			if err := MatMulTInt8(avx2, x, q, m); err != nil {
				t.Fatal(err)
			}
		}, true)
		withoutInt8VNNI(func() {
			if err := MatMulTInt8(scalar, x, q, m); err != nil {
				t.Fatal(err)
			}
		})
		for i := range m {
			for j := range n {
				var exact float64
				for l := range k {
					exact += float64(x[i*k+l]) * float64(w[j*k+l])
				}
				bound := int8Bound(x, w, q, i, j, k)
				for _, c := range []struct {
					name string
					v    float32
				}{{Int8Kernel(), got[i*n+j]}, {"AVX2 or scalar", avx2[i*n+j]}, {"scalar", scalar[i*n+j]}} {
					if e := math.Abs(float64(c.v) - exact); e > bound || math.IsNaN(e) {
						t.Fatalf("%dx%dx%d %s: out[%d,%d] = %v, exact %v: off by %.3g, bound %.3g", m, k, n, c.name, i, j, c.v, exact, e, bound)
					}
				}
				if d := math.Abs(float64(got[i*n+j] - scalar[i*n+j])); d > 1e-5*(math.Abs(exact)+1e-2) {
					t.Fatalf("%dx%dx%d: out[%d,%d] = %v on %s, %v on the scalar loops", m, k, n, i, j, got[i*n+j], Int8Kernel(), scalar[i*n+j])
				}
				if d := math.Abs(float64(avx2[i*n+j] - scalar[i*n+j])); d > 1e-5*(math.Abs(exact)+1e-2) {
					t.Fatalf("%dx%dx%d: out[%d,%d] = %v on AVX2, %v on the scalar loops", m, k, n, i, j, avx2[i*n+j], scalar[i*n+j])
				}
			}
		}
	}
}

// TestMatMulTInt8NaN: a NaN activation makes its row's outputs NaN (as a float32 product
// would), not a silent zero.
func TestMatMulTInt8NaN(t *testing.T) {
	r := rand.New(rand.NewPCG(85, 86))
	const m, k, n = 5, 64, 16
	x, w := randSlice(r, m*k), randSlice(r, n*k)
	x[4*k+3] = float32(math.NaN())
	q, err := QuantizeInt8(w, n, k)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]float32, m*n)
	for _, kernel := range []string{"vector", "avx2", "scalar"} {
		f := func() {
			if err := MatMulTInt8(out, x, q, m); err != nil {
				t.Fatal(err)
			}
		}
		switch kernel {
		case "vector":
			f()
		case "avx2":
			withoutInt8VNNI(f, true)
		default:
			withoutInt8VNNI(f)
		}
		for j := range n {
			if !math.IsNaN(float64(out[4*n+j])) || math.IsNaN(float64(out[3*n+j])) {
				t.Fatalf("%s: column %d: row 4 (a NaN in x) %v, row 3 %v", kernel, j, out[4*n+j], out[3*n+j])
			}
		}
	}
}

// TestInt8Errors: bad shapes, short slices, a missing weight and values that are not
// finite are errors naming the problem.
func TestInt8Errors(t *testing.T) {
	if _, err := QuantizeInt8(make([]float32, 10), 4, 4); err == nil || !strings.Contains(err.Error(), "w has 10 elements") {
		t.Fatalf("short w: %v", err)
	}
	if _, err := QuantizeInt8(nil, -1, 4); err == nil || !strings.Contains(err.Error(), "negative") {
		t.Fatalf("negative n: %v", err)
	}
	w := make([]float32, 2*40)
	w[45] = float32(math.Inf(1))
	if _, err := QuantizeInt8(w, 2, 40); err == nil || !strings.Contains(err.Error(), "row 1") || !strings.Contains(err.Error(), "not finite") {
		t.Fatalf("an infinite weight: %v", err)
	}
	q, err := QuantizeInt8(make([]float32, 3*8), 3, 8)
	if err != nil {
		t.Fatal(err)
	}
	if err := MatMulTInt8(make([]float32, 5), make([]float32, 16), q, 2); err == nil || !strings.Contains(err.Error(), "out has 5 elements") {
		t.Fatalf("short out: %v", err)
	}
	if err := MatMulTInt8(make([]float32, 6), make([]float32, 15), q, 2); err == nil || !strings.Contains(err.Error(), "x has 15 elements") {
		t.Fatalf("short x: %v", err)
	}
	if err := MatMulTInt8(nil, nil, nil, 1); err == nil || !strings.Contains(err.Error(), "no weight") {
		t.Fatalf("nil weight: %v", err)
	}
}

// TestQuantizeActivationsVector: each vector quantiser of activation rows this CPU has
// (AVX-512, AVX2) gives quantBlock's values, scales and sums to the bit (rows of 4 and 1,
// k with a partial last block, a block of zeros, a row with a NaN left to the loops,
// values that round to a tie).
func TestQuantizeActivationsVector(t *testing.T) {
	if !hasInt8VNNI && !hasInt8AVX2 {
		t.Skip("no AVX2 or AVX-512 VNNI: the loops are the only quantiser")
	}
	r := rand.New(rand.NewPCG(87, 88))
	for _, k := range []int{32, 96, 100, 1024} {
		const m = 6
		x := randSlice(r, m*k)
		clear(x[k : k+32])           // row 1's first block: zeros
		x[2*k+5] = 1e-30             // a tiny value beside larger ones
		x[5*k] = float32(math.NaN()) // row 5: the loops
		w, err := QuantizeInt8(make([]float32, 16*k), 16, k)
		if err != nil {
			t.Fatal(err)
		}
		for i := range min(32, k-32) { // row 4's second block: d subnormal, 1/d would overflow: zeros
			x[4*k+32+i] = float32(i%5) * 1e-38
		}
		for i := range 32 { // row 3's first block: 127·(i-16)/16 and its max 127: ties at ±0.5
			x[3*k+i] = float32(i-16) / 16 * 127 / 127 * 8.5
		}
		var loops int8Task
		loops.w, loops.m = w, m
		withoutInt8VNNI(func() { loops.quantize(x) })
		forms := map[string]func(*int8Task){}
		if hasInt8VNNI {
			forms["AVX-512"] = func(v *int8Task) { v.quantize(x) }
		}
		if hasInt8AVX2 {
			forms["AVX2"] = func(v *int8Task) { withoutInt8VNNI(func() { v.quantize(x) }, true) }
		}
		for name, quantize := range forms {
			var vec int8Task
			vec.w, vec.m = w, m
			quantize(&vec)
			for i := range vec.xq {
				if vec.xq[i] != loops.xq[i] {
					t.Fatalf("%s, k=%d: xq[%d] = %d vector, %d loops", name, k, i, vec.xq[i], loops.xq[i])
				}
			}
			for i := range vec.xs {
				if math.Float32bits(vec.xs[i]) != math.Float32bits(loops.xs[i]) || vec.xc[i] != loops.xc[i] {
					t.Fatalf("%s, k=%d: block %d: scale %v sum %d vector, %v %d loops", name, k, i, vec.xs[i], vec.xc[i], loops.xs[i], loops.xc[i])
				}
			}
		}
	}
}

// TestMatMulTInt8RowsIndependent: on the AVX2 kernels a row's outputs are the same bits
// whether it goes through the weight alone (q8DotAVX2) or with 3 others (q8Dot4AVX2), as
// both sum the same block products in the same order.
func TestMatMulTInt8RowsIndependent(t *testing.T) {
	if !hasInt8AVX2 {
		t.Skip("no AVX2 kernel on this CPU")
	}
	r := rand.New(rand.NewPCG(85, 86))
	const m, k, n = 9, 320, 40 // two groups of 4 rows and one alone; a group of w past n
	x, w := randSlice(r, m*k), randSlice(r, n*k)
	q, err := QuantizeInt8(w, n, k)
	if err != nil {
		t.Fatal(err)
	}
	withoutInt8VNNI(func() {
		all := make([]float32, m*n)
		if err := MatMulTInt8(all, x, q, m); err != nil {
			t.Fatal(err)
		}
		one := make([]float32, n)
		for i := range m {
			if err := MatMulTInt8(one, x[i*k:(i+1)*k], q, 1); err != nil {
				t.Fatal(err)
			}
			for j, v := range one {
				if math.Float32bits(v) != math.Float32bits(all[i*n+j]) {
					t.Fatalf("row %d: out[%d] = %v alone, %v among %d rows", i, j, v, all[i*n+j], m)
				}
			}
		}
	}, true)
}
