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
