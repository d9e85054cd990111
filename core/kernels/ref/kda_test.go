package ref

import (
	"math"
	"math/rand/v2"
	"testing"
)

func kdaInputs(r *rand.Rand, tokens int, a KDA) (q, k, v, g, beta []float32) {
	norm := func(x []float32, d int) {
		for o := 0; o < len(x); o += d {
			var s float32
			for _, e := range x[o : o+d] {
				s += e * e
			}
			for i := range d {
				x[o+i] /= float32(math.Sqrt(float64(s) + 1e-6))
			}
		}
	}
	rnd := func(n int, f func() float32) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = f()
		}
		return x
	}
	nrm := func() float32 { return float32(r.NormFloat64()) }
	q = rnd(tokens*a.Heads*a.DK, nrm)
	k = rnd(tokens*a.Heads*a.DK, nrm)
	norm(q, a.DK)
	norm(k, a.DK)
	v = rnd(tokens*a.Heads*a.DV, nrm)
	g = rnd(tokens*a.Heads*a.DK, func() float32 { return -5 / (1 + float32(math.Exp(-r.NormFloat64()))) })
	beta = rnd(tokens*a.Heads, func() float32 { return 1 / (1 + float32(math.Exp(-r.NormFloat64()))) })
	return
}

// TestKDAChunkedEqualsStep checks the chunked (prefill) form against the step (decode) form
// for chunk sizes that divide the sequence, that do not, and that exceed it, from a non-zero
// state; outputs and the final state agree.
func TestKDAChunkedEqualsStep(t *testing.T) {
	// DK 8 runs the pairs' decays in one vector of 8; 20 in vectors and a scalar tail.
	for _, a := range []KDA{{Heads: 3, DK: 8, DV: 6}, {Heads: 2, DK: 20, DV: 12}} {
		kdaChunkedEqualsStep(t, a)
	}
}

func kdaChunkedEqualsStep(t *testing.T, a KDA) {
	r := rand.New(rand.NewPCG(1, 2))
	const tokens = 37
	q, k, v, g, beta := kdaInputs(r, tokens, a)
	s0 := make([]float32, a.Heads*a.DK*a.DV)
	for i := range s0 {
		s0[i] = float32(r.NormFloat64()) * 0.3
	}
	want := make([]float32, tokens*a.Heads*a.DV)
	ws := append([]float32(nil), s0...)
	if err := KDAStep(want, ws, q, k, v, g, beta, tokens, a); err != nil {
		t.Fatal(err)
	}
	for _, chunk := range []int{1, 4, 16, 64} {
		got := make([]float32, len(want))
		gs := append([]float32(nil), s0...)
		if err := KDAChunked(got, gs, q, k, v, g, beta, tokens, chunk, a); err != nil {
			t.Fatal(err)
		}
		if d := maxDiff(got, want); d > 1e-5 {
			t.Errorf("%+v, chunk %d: outputs differ by %g", a, chunk, d)
		}
		if d := maxDiff(gs, ws); d > 1e-5 {
			t.Errorf("%+v, chunk %d: final states differ by %g", a, chunk, d)
		}
	}
}

// TestKDAStepOneToken checks one step against the formula written out.
func TestKDAStepOneToken(t *testing.T) {
	a := KDA{Heads: 1, DK: 2, DV: 1}
	state := []float32{1, 2} // S[i][0]
	q, k, v := []float32{1, 0}, []float32{0, 1}, []float32{5}
	g, beta := []float32{float32(math.Log(0.5)), 0}, []float32{0.5}
	out := make([]float32, 1)
	if err := KDAStep(out, state, q, k, v, g, beta, 1, a); err != nil {
		t.Fatal(err)
	}
	// S = [0.5, 2]; Sᵀk = 2; delta = 0.5·(5−2) = 1.5; S = [0.5, 3.5]; out = Sᵀq = 0.5.
	if math.Abs(float64(state[0]-0.5)) > 1e-6 || math.Abs(float64(state[1]-3.5)) > 1e-6 || math.Abs(float64(out[0]-0.5)) > 1e-6 {
		t.Fatalf("state %v out %v", state, out)
	}
}

// TestCausalConvStepSplits checks that convolving in pieces with the carried state equals one pass.
func TestCausalConvStepSplits(t *testing.T) {
	const tokens, ch, kern = 11, 5, 4
	r := rand.New(rand.NewPCG(3, 4))
	x := make([]float32, tokens*ch)
	w := make([]float32, ch*kern)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	for i := range w {
		w[i] = float32(r.NormFloat64())
	}
	want := make([]float32, len(x))
	if err := CausalConvStep(want, make([]float32, ch*(kern-1)), x, w, tokens, ch, kern); err != nil {
		t.Fatal(err)
	}
	// Direct: zero history.
	for tt := range tokens {
		for c := range ch {
			var s float32
			for j := range kern {
				if src := tt - (kern - 1) + j; src >= 0 {
					s += w[c*kern+j] * x[src*ch+c]
				}
			}
			if math.Abs(float64(s-want[tt*ch+c])) > 1e-5 {
				t.Fatalf("t %d c %d: %g want %g", tt, c, want[tt*ch+c], s)
			}
		}
	}
	got := make([]float32, len(x))
	st := make([]float32, ch*(kern-1))
	for _, cut := range [][2]int{{0, 3}, {3, 4}, {4, 11}} {
		if err := CausalConvStep(got[cut[0]*ch:], st, x[cut[0]*ch:cut[1]*ch], w, cut[1]-cut[0], ch, kern); err != nil {
			t.Fatal(err)
		}
	}
	if d := maxDiff(got, want); d != 0 {
		t.Fatalf("split differs by %g", d)
	}
}

func maxDiff(a, b []float32) float64 {
	var m float64
	for i := range a {
		m = max(m, math.Abs(float64(a[i]-b[i])))
	}
	return m
}
