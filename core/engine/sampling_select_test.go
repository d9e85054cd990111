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
