package ref

import (
	"math"
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

// TestExpfsMatchesExpf checks the batch form (8 lanes at a time on amd64 with AVX2) gives
// expf's bits for every element: lengths with and without a tail, unaligned starts, blocks
// holding arguments outside the polynomial's range (±Inf, NaN, both tails) among ones inside.
func TestExpfsMatchesExpf(t *testing.T) {
	src := make([]float32, 1000)
	for i := range src {
		src[i] = float32(math.Sin(float64(i)*0.37)) * 90 // spans (-90, 90): both tails too
	}
	src[17], src[40], src[41] = float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1))
	for x := float32(-87.4); x < -87.2; x += 0.01 { // around the lower edge
		src = append(src, x)
	}
	for _, n := range []int{0, 1, 7, 8, 9, 63, 64, len(src) - 3, len(src)} {
		for _, off := range []int{0, 1, 3} {
			if off+n > len(src) {
				continue
			}
			in := src[off : off+n]
			got := make([]float32, n)
			expfs(got, in)
			for i, x := range in {
				want := expf(x)
				if math.Float32bits(got[i]) != math.Float32bits(want) && !(want != want && got[i] != got[i]) {
					t.Fatalf("n=%d off=%d: expfs[%d] (x=%v) = %v, expf %v", n, off, i, x, got[i], want)
				}
			}
		}
	}
	in := append([]float32(nil), src...) // in place
	expfs(in, in)
	for i, x := range src {
		if want := expf(x); math.Float32bits(in[i]) != math.Float32bits(want) && !(want != want && in[i] != in[i]) {
			t.Fatalf("in place: expfs[%d] (x=%v) = %v, expf %v", i, x, in[i], want)
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
	b.Run("expfs", func(b *testing.B) {
		out := make([]float32, len(xs))
		for b.Loop() {
			expfs(out, xs)
		}
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
