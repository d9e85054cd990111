package cuda

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/resin-llm/resin/core/engine"
)

// sampleModelMasked is sampling.cu's algorithm in Go, step for step: the same keys (logit
// order then id, or id alone), fixed-point weights in units of 2^-40, and selections of
// "the smallest key whose running sum reaches a target" (the kernel finds them by radix
// select; here by sorting). It lets a test check the kernel's semantics against
// engine.Sampler without a GPU; TestGPUSample checks the kernel itself. Under a token mask
// (nil: none) the choice reads the logits with the refused tokens at -inf (resin_masked),
// lse and the alternatives the raw ones.
func sampleModelMasked(row []float32, p SampleParams, mask []uint32) (int32, float32, []engine.TopLogprob) {
	argmax := func(vals []float32) int32 {
		best := int32(-1)
		for i, v := range vals {
			if !math.IsNaN(float64(v)) && (best < 0 || v > vals[best]) {
				best = int32(i)
			}
		}
		return best
	}
	best := argmax(row)
	mx := row[best]
	vals := row // what the choice reads
	if mask != nil {
		vals = make([]float32, len(row))
		for i, v := range row {
			vals[i] = float32(math.Inf(-1))
			if i/32 < len(mask) && mask[i/32]&(1<<(i%32)) != 0 {
				vals[i] = v
			}
		}
	}
	cbest := argmax(vals)
	cmx := vals[cbest]
	var sum float32
	for _, v := range row {
		if !math.IsNaN(float64(v)) {
			sum += float32(math.Exp(float64(v - mx)))
		}
	}
	lse := mx + float32(math.Log(float64(sum)))

	sorted := p.TopK > 0 || (p.TopP > 0 && p.TopP < 1)
	key := func(i int) uint64 {
		if !sorted {
			return uint64(i)
		}
		u := math.Float32bits(vals[i])
		if vals[i] == 0 { // -0 and +0 are one logit
			u = 0
		}
		asc := u | 0x80000000
		if u&0x80000000 != 0 {
			asc = ^u
		}
		return uint64(^asc)<<32 | uint64(i)
	}
	invT := float32(0)
	if p.Temperature > 0 { // 1/T in float64, capped at the largest float32
		invT = float32(min(1/float64(p.Temperature), math.MaxFloat32))
	}
	weight := func(i int) uint64 {
		w := float32(1)
		if vals[i] != cmx {
			w = float32(math.Exp(float64((vals[i] - cmx) * invT)))
		}
		if w < p.MinP {
			return 0
		}
		return uint64(w * (1 << 40))
	}
	order := make([]int, len(row))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int {
		if key(a) < key(b) {
			return -1
		}
		return 1
	})
	// sel returns the smallest key <= bound whose running sum of val reaches target, and
	// that sum; the bound itself and the total when none does.
	sel := func(bound, target uint64, val func(int) uint64) (uint64, uint64) {
		var acc uint64
		for _, i := range order {
			if key(i) > bound {
				break
			}
			acc += val(i)
			if acc >= target {
				return key(i), acc
			}
		}
		return ^uint64(0), acc
	}
	one := func(int) uint64 { return 1 }

	tok := cbest
	if p.Temperature != 0 && p.TopK != 1 {
		bound := ^uint64(0)
		if p.TopK > 0 && int(p.TopK) < len(row) {
			bound, _ = sel(bound, uint64(p.TopK), one)
		}
		_, kept := sel(bound, ^uint64(0), weight)
		if p.TopP > 0 && p.TopP < 1 && kept > 0 {
			x := float64(p.TopP) * float64(kept)
			need := uint64(x)
			if float64(need) < x {
				need++
			}
			bound, kept = sel(bound, max(need, 1), weight)
		}
		if kept > 0 {
			u := uint64(engineUniform(p.Seed, int(p.Pos)) * float64(kept))
			u = min(u, kept-1)
			k, _ := sel(bound, u+1, weight)
			tok = int32(uint32(k))
		}
	}
	var top []engine.TopLogprob
	if n := min(int(p.Logprobs), MaxSampleTop, len(row)); n > 0 {
		sorted, vals = true, row
		slices.SortFunc(order, func(a, b int) int {
			if key(a) < key(b) {
				return -1
			}
			return 1
		})
		for _, i := range order[:n] {
			top = append(top, engine.TopLogprob{Token: int32(i), Logprob: row[i] - lse})
		}
	}
	return tok, row[tok] - lse, top
}

// engineUniform is sampling.cu's resin_uniform (engine's uniform(seed, pos)).
func engineUniform(seed uint64, pos int) float64 {
	mix := func(x uint64) uint64 {
		x += 0x9E3779B97F4A7C15
		x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9
		x = (x ^ (x >> 27)) * 0x94D049BB133111EB
		return x ^ (x >> 31)
	}
	return float64(mix(seed^mix(uint64(pos)))>>11) / (1 << 53)
}

// TestSampleModelMatchesEngine checks that the device sampler's algorithm (sampleModelMasked)
// chooses what engine.Sampler chooses, with the same logprobs and alternatives, over
// greedy, temperature-only (unsorted walk), top-k, top-p, min-p and their mixes, a third
// of the rows under random token masks.
func TestSampleModelMatchesEngine(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	var s engine.Sampler
	var n, draws, masked int
	for trial := range 400 {
		vocab := 1 + r.IntN(3000)
		row := make([]float32, vocab)
		scale := float32(1 + r.IntN(12))
		for i := range row {
			row[i] = (r.Float32()*2 - 1) * scale
		}
		if trial%5 == 0 { // ties
			for i := range row {
				row[i] = float32(int(row[i]))
			}
		}
		for _, p := range []SampleParams{
			{Temperature: 0, Logprobs: 5},
			{Temperature: 0.8, TopK: 1},
			{Temperature: 0.3 + r.Float32()*1.5},
			{Temperature: 1, TopK: int32(1 + r.IntN(100)), Logprobs: 3},
			{Temperature: 0.7, TopP: r.Float32()},
			{Temperature: 1.3, MinP: r.Float32() * 0.3},
			{Temperature: 0.9, TopK: int32(1 + r.IntN(vocab+10)), TopP: 0.5 + r.Float32()/2, MinP: r.Float32() * 0.1, Logprobs: 32},
		} {
			p.Seed, p.Pos = r.Uint64(), int32(r.IntN(100000))
			er := engine.SamplingRow{Temperature: p.Temperature, TopP: p.TopP, TopK: int(p.TopK), MinP: p.MinP, Seed: p.Seed, Logprobs: int(p.Logprobs)}
			if trial%3 == 1 { // a grammar's token mask: a random share of the tokens, at least one
				er.Mask = make([]uint32, (vocab+31)/32)
				keep := 1 + r.IntN(8)
				for i := range vocab {
					if r.IntN(keep) == 0 || i == trial%vocab {
						er.Mask[i/32] |= 1 << (i % 32)
					}
				}
				masked++
			}
			want, wantLP, wantTop := s.Sample(row, er, int(p.Pos), nil)
			got, gotLP, gotTop := sampleModelMasked(row, p, er.Mask)
			n++
			if p.Temperature != 0 && p.TopK != 1 {
				draws++
			}
			if got != want {
				t.Errorf("trial %d vocab %d %+v: token %d, engine %d", trial, vocab, p, got, want)
			}
			if math.Abs(float64(gotLP-wantLP)) > 1e-4 {
				t.Errorf("trial %d: logprob %g, engine %g", trial, gotLP, wantLP)
			}
			if len(gotTop) != len(wantTop) {
				t.Fatalf("trial %d: %d alternatives, engine %d", trial, len(gotTop), len(wantTop))
			}
			for i := range wantTop {
				if gotTop[i].Token != wantTop[i].Token {
					t.Errorf("trial %d: alternative %d is %d, engine %d", trial, i, gotTop[i].Token, wantTop[i].Token)
				}
			}
		}
	}
	t.Logf("%d rows, %d of them seeded draws, %d under token masks, all equal to engine.Sampler", n, draws, masked)
}
