package runnertest

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestChiSquare: draws from the expected distribution stay under the bound, draws from a
// shifted one exceed it, and the bound for 11 degrees of freedom is within 3% of the
// chi-square quantile at 1 − 1e-6 (48.87).
func TestChiSquare(t *testing.T) {
	p := []float64{0.3, 0.2, 0.15, 0.1, 0.1, 0.05, 0.04, 0.03, 0.02, 0.01, 0.0005, 0.0005}
	const n = 20000
	r := rand.New(rand.NewPCG(3, 4))
	draw := func(q []float64) []float64 {
		got := make([]float64, len(q))
		for range n {
			u, i := r.Float64(), 0
			for ; i < len(q)-1 && u >= q[i]; i++ {
				u -= q[i]
			}
			got[i]++
		}
		return got
	}
	exp := make([]float64, len(p))
	for i := range p {
		exp[i] = p[i] * n
	}
	x, bound := ChiSquare(t, exp, draw(p))
	// 12 cells: the last two expect 10 draws each, so none is pooled.
	if math.Abs(bound/48.87-1) > 0.03 {
		t.Errorf("bound %.2f for 11 degrees of freedom, want about 48.87", bound)
	}
	if x > bound {
		t.Errorf("draws from the expected distribution: %.1f over the bound %.1f", x, bound)
	}
	shifted := append([]float64{0.25, 0.25}, p[2:]...)
	if x, bound := ChiSquare(t, exp, draw(shifted)); x <= bound {
		t.Errorf("draws from a shifted distribution: %.1f under the bound %.1f", x, bound)
	}
}
