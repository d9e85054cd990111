package runnertest

import (
	"math"
	"testing"
)

// ChiSquare returns Pearson's statistic of the counts got against the counts exp a
// correct sampler expects in the same cells, and its failure bound: the value a correct
// sampler exceeds with probability about 1e-6 (Wilson-Hilferty's approximation of the
// chi-square quantile at z = 4.75, for cells−1 degrees of freedom). Cells expecting fewer
// than 5 draws are pooled into one (the statistic's approximation needs it); a cell
// expecting none that got some fails t, as do slices of different lengths and fewer
// than two cells left after pooling.
func ChiSquare(t testing.TB, exp, got []float64) (x, bound float64) {
	t.Helper()
	if len(exp) != len(got) {
		t.Fatalf("chi-square over %d expected and %d observed cells", len(exp), len(got))
	}
	var poolE, poolGot float64
	cells := 0
	for i, e := range exp {
		switch {
		case e == 0:
			if got[i] != 0 {
				t.Errorf("cell %d drawn %v times, expected never", i, got[i])
			}
		case e < 5:
			poolE, poolGot = poolE+e, poolGot+got[i]
		default:
			x += (got[i] - e) * (got[i] - e) / e
			cells++
		}
	}
	if poolE > 0 {
		x += (poolGot - poolE) * (poolGot - poolE) / poolE
		cells++
	}
	if cells < 2 {
		t.Fatalf("chi-square over %d cells after pooling: draw more samples", cells)
	}
	k := float64(cells - 1)
	bound = k * math.Pow(1-2/(9*k)+4.75*math.Sqrt(2/(9*k)), 3)
	return x, bound
}
