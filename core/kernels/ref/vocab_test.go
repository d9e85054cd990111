package ref

import (
	"math"
	"testing"
)

// TestExpSumNearMathExp: ExpSum's values are within 2 ulp of e^x rounded from float64 (0
// past float32's normal range), and
// its sum within 1e-6 of the float64 sum, over the arguments a sampler hands it (logits
// minus their maximum: 0 down to beyond underflow), with -Inf (0) and NaN (NaN) kept.
func TestExpSumNearMathExp(t *testing.T) {
	n := 32003 // not a multiple of 8: a tail
	x := make([]float32, n)
	for i := range x {
		x[i] = -float32(i) * 100 / float32(n)
	}
	x[5], x[9] = float32(math.Inf(-1)), 0
	got := append([]float32(nil), x...)
	sum := ExpSum(got)
	var want float64
	for i, v := range x {
		e := math.Exp(float64(v))
		want += e
		w := float32(e)
		if v < expfMinArg {
			w = 0 // where e^x leaves float32's normal range
		}
		if d := math.Abs(float64(got[i] - w)); d > 2*ulp32(w) {
			t.Fatalf("e^%v = %v, want %v (±2 ulp)", v, got[i], w)
		}
	}
	if math.Abs(sum-want) > 1e-6*want {
		t.Fatalf("sum %v, want %v", sum, want)
	}
	nan := []float32{0, 1, float32(math.NaN()), 2, 3, 4, 5, 6, 7}
	if s := ExpSum(nan); s == s || nan[2] == nan[2] {
		t.Fatalf("a NaN argument gave %v, sum %v: want NaN", nan[2], s)
	}
}

// ulp32 is the gap between |v| and the next float32 away from zero (the smallest
// subnormal for 0).
func ulp32(v float32) float64 {
	a := float32(math.Abs(float64(v)))
	return float64(math.Nextafter32(a, float32(math.Inf(1))) - a)
}

// TestMaxSkipsNaN: Max is the largest value whatever the length (vector blocks and tail),
// NaNs anywhere skipped, −Inf for a row of NaNs or an empty one.
func TestMaxSkipsNaN(t *testing.T) {
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	if m := Max(nil); m != -inf {
		t.Fatalf("Max of nothing = %v, want -Inf", m)
	}
	for _, n := range []int{1, 7, 8, 9, 17, 64, 100} {
		x := make([]float32, n)
		for i := range x {
			x[i] = nan
		}
		if m := Max(x); m != -inf {
			t.Fatalf("n=%d: Max of NaNs = %v, want -Inf", n, m)
		}
		for at := range n {
			for i := range x {
				x[i] = float32(i%5) - 10
				if i%3 == 0 {
					x[i] = nan
				}
			}
			x[at] = 3
			if m := Max(x); m != 3 {
				t.Fatalf("n=%d: Max = %v with 3 at %d, want 3 (%v)", n, m, at, x)
			}
		}
	}
}
