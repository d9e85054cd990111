package ref

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// TestExpfAccuracy checks expf against math.Exp over float32's range: within 2 ulp where
// e^x is a normal float32, 0 below it, +Inf above, NaN for NaN.
func TestExpfAccuracy(t *testing.T) {
	worst := 0.0
	for x := float32(-87.3); x <= 88.7; x += 0.000731 {
		want := math.Exp(float64(x))
		got := float64(expf(x))
		ulp := float64(math.Nextafter32(float32(want), float32(math.Inf(1)))) - float64(float32(want))
		if d := math.Abs(got-want) / ulp; d > worst {
			worst = d
			if d > 2 {
				t.Fatalf("expf(%v) = %v, want %v (%.2f ulp)", x, got, want, d)
			}
		}
	}
	t.Logf("worst error %.2f ulp", worst)
	for _, c := range []struct{ x, want float32 }{
		{-200, 0}, {-87.5, 0}, {0, 1}, {89, float32(math.Inf(1))}, {float32(math.Inf(1)), float32(math.Inf(1))}, {float32(math.Inf(-1)), 0},
	} {
		if got := expf(c.x); got != c.want {
			t.Errorf("expf(%v) = %v, want %v", c.x, got, c.want)
		}
	}
	if got := expf(float32(math.NaN())); got == got {
		t.Errorf("expf(NaN) = %v, want NaN", got)
	}
}

// TestSiLUMatchesFloat64 checks SiLU on expf against x·sigmoid(x) in float64, both tails
// included (large negative x gives -0, not NaN).
func TestSiLUMatchesFloat64(t *testing.T) {
	for x := float32(-120); x <= 120; x += 0.0137 {
		want := float64(x) / (1 + math.Exp(-float64(x)))
		got := float64(SiLU(x))
		if d := math.Abs(got - want); d > 3e-7*math.Abs(want)+1e-36 {
			t.Fatalf("SiLU(%v) = %v, want %v", x, got, want)
		}
	}
}

func BenchmarkExp(b *testing.B) {
	xs := make([]float32, 4096)
	for i := range xs {
		xs[i] = -float32(i) / 256
	}
	b.Run("expf", func(b *testing.B) {
		var s float32
		for b.Loop() {
			for _, x := range xs {
				s += expf(x)
			}
		}
		_ = s
	})
	b.Run("math.Exp", func(b *testing.B) {
		var s float64
		for b.Loop() {
			for _, x := range xs {
				s += math.Exp(float64(x))
			}
		}
		_ = s
	})
}

// extremeFloats is a row of ordinary values with both exp tails, ±Inf and NaN among them,
// for the vector kernels' stop-and-resume paths.
func extremeFloats() []float32 {
	src := make([]float32, 500)
	for i := range src {
		src[i] = float32(math.Sin(float64(i)*0.37)) * 100
	}
	src[17], src[40], src[41], src[90] = float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1)), 0
	for x := float32(87.2); x < 87.45; x += 0.01 { // around both edges of expf's range
		src = append(src, x, -x)
	}
	for x := float32(88.3); x < 88.45; x += 0.01 {
		src = append(src, x, -x)
	}
	return src
}

// TestSiLUMulVectorMatchesScalar: siluMulRows (8 lanes at a time with AVX2) gives the bits
// of the scalar expression for every element: row widths with and without a tail, gates
// in both exp tails, ±Inf and NaN.
func TestSiLUMulVectorMatchesScalar(t *testing.T) {
	src := extremeFloats()
	for _, dim := range []int{1, 7, 8, 9, 31, 64, 100, 250} {
		rows := len(src) / (2 * dim)
		gateUp := src[:rows*2*dim]
		got := make([]float32, rows*dim)
		siluMulRows(got, gateUp, dim, 0, rows)
		for r := range rows {
			for i := range dim {
				g, u := gateUp[r*2*dim+i], gateUp[r*2*dim+dim+i]
				want := SiLU(g) * u
				if v := got[r*dim+i]; math.Float32bits(v) != math.Float32bits(want) && !(v != v && want != want) {
					t.Fatalf("dim %d row %d col %d: SiLU(%v)·%v = %v, want %v", dim, r, i, g, u, v, want)
				}
			}
		}
	}
}

// TestSoftmaxExpSumMatchesScalar: softmaxExpSum's weights have the scalar form's bits and
// its sum (8 float64 lanes) is the scalar sum to float64 rounding, on rows with and
// without a tail, unaligned starts, weights that underflow and blocks holding a NaN.
func TestSoftmaxExpSumMatchesScalar(t *testing.T) {
	src := extremeFloats()
	for _, n := range []int{1, 7, 8, 9, 63, 64, 65, 300, len(src) - 1} {
		for _, off := range []int{0, 1} {
			if off+n > len(src) {
				continue
			}
			in := src[off : off+n]
			for _, scale := range []float32{0.125, 1, 3} {
				mx := rowMax(in, scale)
				got := append([]float32(nil), in...)
				sum := softmaxExpSum(got, scale, mx)
				var want float64
				for i, v := range in {
					w := expf(float32(v*scale) - mx)
					want += float64(w)
					if math.Float32bits(got[i]) != math.Float32bits(w) && !(w != w && got[i] != got[i]) {
						t.Fatalf("n=%d off=%d scale=%v: weight %d (score %v) = %v, want %v", n, off, scale, i, v, got[i], w)
					}
				}
				if d := math.Abs(sum - want); !(d <= 1e-12*math.Abs(want)) && !(sum != sum && want != want) {
					t.Fatalf("n=%d off=%d scale=%v: sum %v, want %v", n, off, scale, sum, want)
				}
			}
		}
	}
}

// TestRowMaxVectorSkipsNaN: the vector max gives the scalar max over rows of every length,
// a NaN anywhere skipped (a row of NaNs only gives -Inf); with no AVX2 it does nothing.
func TestRowMaxVectorSkipsNaN(t *testing.T) {
	src := extremeFloats()
	src[40] = 7 // no +Inf: the max is then an ordinary value
	for n := 1; n <= 80; n++ {
		m, done := rowMaxVector(src[:n])
		if done == 0 {
			continue
		}
		want := float32(math.Inf(-1))
		for _, v := range src[:done] {
			if v > want {
				want = v
			}
		}
		if m != want {
			t.Fatalf("n=%d: vector max %v over %d values, want %v", n, m, done, want)
		}
	}
	nan := make([]float32, 16)
	for i := range nan {
		nan[i] = float32(math.NaN())
	}
	if m, done := rowMaxVector(nan); done != 0 && !math.IsInf(float64(m), -1) {
		t.Errorf("max of NaNs = %v, want -Inf", m)
	}
}

// TestAxpyF64MatchesScalar: AxpyF64 gives the scalar loop's bits for lengths with and
// without a tail.
func TestAxpyF64MatchesScalar(t *testing.T) {
	for _, n := range []int{0, 1, 7, 8, 9, 64, 67} {
		x := make([]float32, n)
		acc, want := make([]float64, n), make([]float64, n)
		for i := range x {
			x[i] = float32(math.Sin(float64(i))) * 3
			acc[i] = math.Cos(float64(i))
			want[i] = acc[i]
		}
		a := 0.37
		AxpyF64(acc, a, x)
		for i := range want {
			want[i] += float64(a * float64(x[i]))
			if math.Float64bits(acc[i]) != math.Float64bits(want[i]) {
				t.Fatalf("n=%d: acc[%d] = %v, want %v", n, i, acc[i], want[i])
			}
		}
	}
}

// TestSiLUMulClamped: SiLUMulClamped gives Go's expression bit for bit, with NaNs, both exp
// tails and ±Inf among the inputs, for limits that clamp, that clamp nothing (+Inf) and a
// NaN limit; a long input splits across the pool; out may alias gate.
func TestSiLUMulClamped(t *testing.T) {
	src := extremeFloats()
	for _, lim := range []float32{7, 0.5, 50, float32(math.Inf(1)), float32(math.NaN())} {
		for _, n := range []int{0, 1, 7, 8, 9, 100, len(src) / 2} {
			gate, up := src[:n], src[len(src)-n:]
			got := make([]float32, n)
			if err := SiLUMulClamped(got, gate, up, lim); err != nil {
				t.Fatal(err)
			}
			for i := range n {
				want := SiLU(min(gate[i], lim)) * min(max(up[i], -lim), lim)
				if math.Float32bits(got[i]) != math.Float32bits(want) && !(got[i] != got[i] && want != want) {
					t.Fatalf("lim %v n %d: out[%d] (gate %v, up %v) = %v, want %v", lim, n, i, gate[i], up[i], got[i], want)
				}
			}
		}
	}
	n := 3*minParallelElems + 5
	gate, up := make([]float32, n), make([]float32, n)
	for i := range gate {
		gate[i], up[i] = float32(math.Sin(float64(i)))*12, float32(math.Cos(float64(i)))*12
	}
	want := make([]float32, n)
	for i := range want {
		want[i] = SiLU(min(gate[i], 10)) * min(max(up[i], -10), 10)
	}
	if err := SiLUMulClamped(gate, gate, up, 10); err != nil { // split, in place
		t.Fatal(err)
	}
	for i := range want {
		if gate[i] != want[i] {
			t.Fatalf("split in place: out[%d] = %v, want %v", i, gate[i], want[i])
		}
	}
	if err := SiLUMulClamped(make([]float32, 3), make([]float32, 4), make([]float32, 4), 1); err == nil {
		t.Error("a short out was accepted")
	}
}

// TestSoftmaxSink: against the float64 formula, rows whose length is and is not a
// multiple of the vector width, a sink above every score (it takes most of the weight)
// and below (TestSoftmaxSinkWithoutVector: the same bits with the vector kernels off).
func TestSoftmaxSink(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	const rows, n, scale = 4, 45, 0.125
	x := make([]float32, rows*n)
	for i := range x {
		x[i] = float32(r.NormFloat64() * 8)
	}
	sinks := []float32{-3, 0.5, 40, float32(math.Inf(-1))}
	got := slices.Clone(x)
	if err := SoftmaxSink(got, rows, n, scale, sinks); err != nil {
		t.Fatal(err)
	}
	for row := range rows {
		xs := x[row*n : (row+1)*n]
		mx := float64(sinks[row])
		for _, v := range xs {
			mx = math.Max(mx, float64(v)*scale)
		}
		sum := math.Exp(float64(sinks[row]) - mx)
		for _, v := range xs {
			sum += math.Exp(float64(v)*scale - mx)
		}
		var total float64
		for i, v := range xs {
			want := math.Exp(float64(v)*scale-mx) / sum
			total += float64(got[row*n+i])
			if d := math.Abs(float64(got[row*n+i]) - want); d > 1e-6*want+1e-12 {
				t.Fatalf("row %d [%d]: %g, want %g", row, i, got[row*n+i], want)
			}
		}
		if sinkShare := math.Exp(float64(sinks[row])-mx) / sum; math.Abs(total+sinkShare-1) > 1e-5 {
			t.Fatalf("row %d: weights sum to %g with the sink's %g", row, total, sinkShare)
		}
	}
	if err := SoftmaxSink(got, rows, n, scale, sinks[:3]); err == nil || !strings.Contains(err.Error(), "sinks") {
		t.Fatalf("3 sinks for 4 rows: %v", err)
	}
}
