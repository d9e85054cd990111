package ref

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/resin-llm/resin/core/weights"
)

// TestMatMulTFP8: the product over packed e4m3 bytes with 128×128 block scales (partial
// last blocks included) equals MatMulT over weights.DequantFP8's widening of the same
// bytes, within float32 reassociation (1e-5 of Σ|x·w|), for a decode row and a batch.
func TestMatMulTFP8(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, sh := range []struct{ m, n, k int }{{1, 200, 300}, {5, 130, 256}, {3, 7, 129}} {
		w := &FP8Matrix{N: sh.n, K: sh.k, BlockRows: 128, BlockCols: 128, W: make([]byte, sh.n*sh.k)}
		for i := range w.W {
			b := byte(rng.IntN(256))
			for b&0x7f == 0x7f { // NaN codes: a checkpoint holds none
				b = byte(rng.IntN(256))
			}
			w.W[i] = b
		}
		w.Scale = make([]float32, ((sh.n+127)/128)*((sh.k+127)/128))
		for i := range w.Scale {
			w.Scale[i] = float32(rng.Float64()*0.01 + 1e-3)
		}
		deq := make([]float32, sh.n*sh.k)
		if err := weights.DequantFP8(deq, w.W, w.Scale, sh.n, sh.k, 128, 128); err != nil {
			t.Fatal(err)
		}
		checkPacked(t, "fp8", sh.m, sh.n, sh.k, deq, func(out, x []float32) error { return MatMulTFP8(out, x, w, sh.m) }, rng)
	}
	bad := &FP8Matrix{N: 2, K: 4, BlockRows: 128, BlockCols: 128, W: make([]byte, 7), Scale: []float32{1}}
	if err := MatMulTFP8(make([]float32, 2), make([]float32, 4), bad, 1); err == nil {
		t.Error("fp8: 7 bytes for [2, 4]: no error")
	}
}

// TestMatMulTFP4: the product over packed e2m1 nibbles with a scale per 32 (MXFP4)
// equals MatMulT over weights.DequantFP4's widening, within float32 reassociation.
func TestMatMulTFP4(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, sh := range []struct{ m, n, k int }{{1, 64, 256}, {6, 33, 96}, {2, 5, 34}} {
		w := &FP4Matrix{N: sh.n, K: sh.k, Group: 32, W: make([]byte, sh.n*sh.k/2)}
		for i := range w.W {
			w.W[i] = byte(rng.IntN(256))
		}
		w.Scale = make([]float32, sh.n*((sh.k+31)/32))
		for i := range w.Scale {
			w.Scale[i] = float32(math.Ldexp(1, rng.IntN(8)-10)) // E8M0: powers of two
		}
		deq := make([]float32, sh.n*sh.k)
		if err := weights.DequantFP4(deq, w.W, w.Scale, sh.n, sh.k, 32); err != nil {
			t.Fatal(err)
		}
		checkPacked(t, "fp4", sh.m, sh.n, sh.k, deq, func(out, x []float32) error { return MatMulTFP4(out, x, w, sh.m) }, rng)
	}
	bad := &FP4Matrix{N: 2, K: 3, Group: 32, W: make([]byte, 3), Scale: []float32{1, 1}}
	if err := MatMulTFP4(make([]float32, 2), make([]float32, 3), bad, 1); err == nil {
		t.Error("fp4: odd K: no error")
	}
}

// checkPacked compares run's x·wᵀ with MatMulT over deq [n, k].
func checkPacked(t *testing.T, what string, m, n, k int, deq []float32, run func(out, x []float32) error, rng *rand.Rand) {
	t.Helper()
	x := make([]float32, m*k)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	want, got := make([]float32, m*n), make([]float32, m*n)
	if err := MatMulT(want, x, deq, m, k, n); err != nil {
		t.Fatal(err)
	}
	if err := run(got, x); err != nil {
		t.Fatal(err)
	}
	for r := range m {
		for i := range n {
			var mag float64
			for j := range k {
				mag += math.Abs(float64(x[r*k+j] * deq[i*k+j]))
			}
			if d := math.Abs(float64(got[r*n+i] - want[r*n+i])); !(d <= 1e-5*mag+1e-30) {
				t.Fatalf("%s [%d×%d·%d] out[%d, %d] = %g, dequantised reference %g (|Δ| %.3g, Σ|x·w| %.3g)", what, m, n, k, r, i, got[r*n+i], want[r*n+i], d, mag)
			}
		}
	}
}
