package ep

import (
	"math"
	"sync"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/dist"
)

const hidden = 6

// expert is a row-independent toy expert: y = tanh(W_e x) with W_e seeded by e.
func expert(calls map[int]int, mu *sync.Mutex) ExpertFunc {
	return func(e int, x []float32, n int, y []float32) error {
		if mu != nil {
			mu.Lock()
			calls[e] += n
			mu.Unlock()
		}
		for r := range n {
			for d := range hidden {
				var s float32
				for c := range hidden {
					s += float32(math.Sin(float64(e*31+d*7+c))) * x[r*hidden+c]
				}
				y[r*hidden+d] = float32(math.Tanh(float64(s)))
			}
		}
		return nil
	}
}

// routes gives rank r its tokens: counts 3, 0 (an idle rank), 5, 1; expert 3 is never
// picked (an empty expert) and expert 1 by almost every token.
func routes(l Layer, r int) Routes {
	n := []int{3, 0, 5, 1}[r%4]
	rt := Routes{X: make([]float32, n*l.Hidden)}
	for i := range rt.X {
		rt.X[i] = float32(math.Cos(float64(r*101 + i)))
	}
	for i := range n {
		first := int32(1)
		if (r+i)%4 == 0 {
			first = 0
		}
		second := []int32{4, 2, 0, 4}[(r*3+i)%4]
		rt.IDs = append(rt.IDs, first, second)
		rt.Weights = append(rt.Weights, 0.25+0.1*float32(i), 0.75-0.05*float32(r))
	}
	return rt
}

// TestEPMatchesSerial: over 1 to 4 in-process ranks (5 experts: with 4 ranks the last
// owns none), with uneven token counts, an idle rank and an expert no token picks,
// AllToAll gives every rank the serial reference's outputs bit for bit and Gather within
// 1e-6; each expert runs on exactly the rows routed to it.
func TestEPMatchesSerial(t *testing.T) {
	l := Layer{Experts: 5, Hidden: hidden, TopK: 2}
	for size := 1; size <= 4; size++ {
		want := make([][]float32, size)
		for r := range size {
			rt := routes(l, r)
			want[r] = make([]float32, len(rt.X))
			if err := Serial(l, rt, expert(nil, nil), want[r]); err != nil {
				t.Fatal(err)
			}
		}
		for _, variant := range []struct {
			name string
			f    func(dist.Communicator, Layer, Routes, ExpertFunc, []float32) error
			tol  float64
		}{{"all-to-all", AllToAll, 0}, {"gather", Gather, 1e-6}} {
			cs, _ := dist.NewInProcess(size, dist.Options{Timeout: 10 * time.Second})
			got := make([][]float32, size)
			errs := make([]error, size)
			calls := map[int]int{}
			var mu sync.Mutex
			var wg sync.WaitGroup
			for r := range size {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rt := routes(l, r)
					got[r] = make([]float32, len(rt.X))
					errs[r] = variant.f(cs[r], l, rt, expert(calls, &mu), got[r])
				}()
			}
			wg.Wait()
			routed := map[int]int{}
			for r := range size {
				if errs[r] != nil {
					t.Fatalf("%s over %d ranks, rank %d: %v", variant.name, size, r, errs[r])
				}
				for _, e := range routes(l, r).IDs {
					routed[int(e)]++
				}
				for i := range want[r] {
					d := math.Abs(float64(got[r][i] - want[r][i]))
					if (variant.tol == 0 && got[r][i] != want[r][i]) || d > variant.tol*(1+math.Abs(float64(want[r][i]))) {
						t.Fatalf("%s over %d ranks, rank %d [%d] = %g, serial %g", variant.name, size, r, i, got[r][i], want[r][i])
					}
				}
			}
			for e := range l.Experts {
				if calls[e] != routed[e] {
					t.Fatalf("%s over %d ranks: expert %d ran on %d rows, %d routed to it", variant.name, size, e, calls[e], routed[e])
				}
			}
		}
	}
}

// TestEPBadRoutes: a route to an expert outside the layer, or weights short of the ids,
// is an error before any exchange.
func TestEPBadRoutes(t *testing.T) {
	l := Layer{Experts: 2, Hidden: 2, TopK: 1}
	cs, _ := dist.NewInProcess(1, dist.Options{})
	out := make([]float32, 2)
	if err := AllToAll(cs[0], l, Routes{X: []float32{1, 2}, IDs: []int32{2}, Weights: []float32{1}}, expert(nil, nil), out); err == nil {
		t.Fatal("expert 2 of 2 accepted")
	}
	if err := Gather(cs[0], l, Routes{X: []float32{1, 2}, IDs: []int32{1}}, expert(nil, nil), out); err == nil {
		t.Fatal("missing weights accepted")
	}
}

// TestEPMaskedRoutes: routes to Masked are sent nowhere and add nothing, and dummy rows
// whose routes are all masked (a DP-attention rank's padding) come back as zeros; both
// exchanges agree with the serial reference, and no expert runs on a masked route.
func TestEPMaskedRoutes(t *testing.T) {
	l := Layer{Experts: 5, Hidden: hidden, TopK: 2}
	masked := func(r int) Routes {
		rt := routes(l, r)
		for i := range rt.IDs {
			if i%3 == 1 {
				rt.IDs[i] = Masked
			}
		}
		for range 2 { // dummy rows
			rt.X = append(rt.X, make([]float32, l.Hidden)...)
			rt.IDs = append(rt.IDs, Masked, Masked)
			rt.Weights = append(rt.Weights, 0, 0)
		}
		return rt
	}
	const size = 3
	for _, variant := range []struct {
		name string
		f    func(dist.Communicator, Layer, Routes, ExpertFunc, []float32) error
		tol  float64
	}{{"all-to-all", AllToAll, 0}, {"gather", Gather, 1e-6}} {
		cs, _ := dist.NewInProcess(size, dist.Options{Timeout: 10 * time.Second})
		calls := map[int]int{}
		var mu sync.Mutex
		got := make([][]float32, size)
		errs := make([]error, size)
		var wg sync.WaitGroup
		for r := range size {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rt := masked(r)
				got[r] = make([]float32, len(rt.X))
				errs[r] = variant.f(cs[r], l, rt, expert(calls, &mu), got[r])
			}()
		}
		wg.Wait()
		routed := map[int]int{}
		for r := range size {
			if errs[r] != nil {
				t.Fatalf("%s rank %d: %v", variant.name, r, errs[r])
			}
			rt := masked(r)
			for _, e := range rt.IDs {
				routed[int(e)]++
			}
			want := make([]float32, len(rt.X))
			if err := Serial(l, rt, expert(nil, nil), want); err != nil {
				t.Fatal(err)
			}
			for i := range want {
				if d := math.Abs(float64(got[r][i] - want[i])); d > variant.tol*(1+math.Abs(float64(want[i]))) {
					t.Fatalf("%s rank %d [%d] = %g, serial %g", variant.name, r, i, got[r][i], want[i])
				}
			}
			for i := len(want) - 2*l.Hidden; i < len(want); i++ {
				if got[r][i] != 0 {
					t.Fatalf("%s rank %d: a dummy row's output %g, want 0", variant.name, r, got[r][i])
				}
			}
		}
		if calls[int(Masked)] != 0 {
			t.Fatalf("%s: an expert ran on a masked route", variant.name)
		}
		for e := range l.Experts {
			if calls[e] != routed[e] {
				t.Fatalf("%s: expert %d ran on %d rows, %d routed to it", variant.name, e, calls[e], routed[e])
			}
		}
	}
}
