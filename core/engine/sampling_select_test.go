package engine

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestSelectTopIsTheSortsPrefix: the heap selection of a top-k row gives exactly the first
// k tokens of the whole vocabulary sorted in sampling order, on rows with many ties, NaNs
// and infinities, for k from 1 to the whole row.
func TestSelectTopIsTheSortsPrefix(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	for trial := range 200 {
		n := 1 + rng.IntN(300)
		logits := make([]float32, n)
		for i := range logits {
			switch r := rng.IntN(20); {
			case r == 0:
				logits[i] = nan
			case r == 1:
				logits[i] = -inf
			case r == 2 && trial%3 == 0:
				logits[i] = inf
			default:
				logits[i] = float32(rng.IntN(8)) / 2 // few distinct values: ties
			}
		}
		all := make([]int32, n)
		for i := range all {
			all[i] = int32(i)
		}
		sortCandidates(all, logits)
		var s Sampler
		for _, k := range []int{1, 2, 3, n / 2, n} {
			if k < 1 {
				continue
			}
			s.selectTop(logits, k)
			if !slices.Equal(s.idx, all[:k]) {
				t.Fatalf("trial %d, k %d of %d: selected %v, the sort's first k %v (logits %v)", trial, k, n, s.idx, all[:k], logits)
			}
		}
	}
}

// TestNucleusIsTheSortsCut: a top-p row's candidates through nucleus (only the tokens that
// can be in the nucleus sorted) are those of the whole vocabulary sorted then cut: the
// same tokens in the same order with the same weights, and the same sum up to rounding,
// with min-p, ties, NaNs and infinities, peaked and flat rows.
func TestNucleusIsTheSortsCut(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	settled := 0
	for trial := range 300 {
		n := 1 + rng.IntN(2000)
		spread := []float64{0.1, 1, 4, 20}[trial%4]
		logits := make([]float32, n)
		for i := range logits {
			switch r := rng.IntN(50); {
			case r == 0:
				logits[i] = nan
			case r == 1:
				logits[i] = -inf
			case r == 2 && trial%7 == 0:
				logits[i] = inf
			case r < 10:
				logits[i] = float32(rng.IntN(4)) // ties
			default:
				logits[i] = float32(rng.NormFloat64() * spread)
			}
		}
		row := SamplingRow{Temperature: []float32{0.3, 0.8, 1, 1.7}[trial%4], TopP: []float32{0.1, 0.5, 0.9, 0.99}[trial/4%4]}
		if trial%3 == 0 {
			row.MinP = 0.05
		}
		var whole Sampler
		for i := range n {
			whole.idx = append(whole.idx, int32(i))
		}
		sortCandidates(whole.idx, logits)
		wantSum := whole.weigh(logits, row)
		var s Sampler
		sum, ok := s.nucleus(logits, row)
		if !ok {
			continue
		}
		settled++
		if !slices.Equal(s.idx, whole.idx) || !slices.Equal(s.probs, whole.probs) || math.Abs(sum-wantSum) > 1e-12*wantSum {
			t.Fatalf("trial %d (%+v): nucleus %v %v sum %v, the whole sort %v %v sum %v", trial, row, s.idx, s.probs, sum, whole.idx, whole.probs, wantSum)
		}
	}
	if settled < 250 {
		t.Errorf("nucleus settled %d of 300 rows: its bound should hold for almost every one", settled)
	}
}
