package cp

import (
	"math"
	"sync"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/dist"
)

// TestCPPrefillMatchesSingle: a 37-token prompt split over 2 and 3 ranks (one chunk
// empty, one of a single token) gives each rank the rows a single rank computes for those
// tokens, within 1e-5 (the kernels tile different query counts differently), with and
// without a sliding window; Start gives each rank its first position.
func TestCPPrefillMatchesSingle(t *testing.T) {
	const T = 37
	for _, s := range []Shape{{Heads: 4, KVHeads: 2, HeadDim: 8}, {Heads: 4, KVHeads: 2, HeadDim: 8, Window: 5}} {
		qd, kvd := s.Heads*s.HeadDim, s.KVHeads*s.HeadDim
		val := func(salt, i int) float32 { return float32(math.Sin(float64(salt*1000 + i))) }
		q, k, v := make([]float32, T*qd), make([]float32, T*kvd), make([]float32, T*kvd)
		for i := range q {
			q[i] = val(1, i)
		}
		for i := range k {
			k[i], v[i] = val(2, i), val(3, i)
		}
		single, _ := dist.NewInProcess(1, dist.Options{})
		want := make([]float32, T*qd)
		if err := Attention(single[0], s, q, k, v, want); err != nil {
			t.Fatal(err)
		}
		for _, split := range [][]int{{20, 17}, {1, 0, 36}, {12, 13, 12}} {
			cs, _ := dist.NewInProcess(len(split), dist.Options{Timeout: 10 * time.Second})
			got := make([]float32, T*qd)
			errs := make([]error, len(split))
			var wg sync.WaitGroup
			lo := 0
			for r, n := range split {
				a, b := lo, lo+n
				lo = b
				wg.Add(1)
				go func() {
					defer wg.Done()
					start, err := Start(cs[r], n)
					if err == nil && start != a {
						t.Errorf("split %v rank %d: start %d, want %d", split, r, start, a)
					}
					if err == nil {
						err = Attention(cs[r], s, q[a*qd:b*qd], k[a*kvd:b*kvd], v[a*kvd:b*kvd], got[a*qd:b*qd])
					}
					errs[r] = err
				}()
			}
			wg.Wait()
			for r, err := range errs {
				if err != nil {
					t.Fatalf("split %v rank %d: %v", split, r, err)
				}
			}
			for i := range want {
				if d := math.Abs(float64(got[i] - want[i])); d > 1e-5*(1+math.Abs(float64(want[i]))) {
					t.Fatalf("window %d split %v: [%d] = %g, single rank %g", s.Window, split, i, got[i], want[i])
				}
			}
		}
	}
}
