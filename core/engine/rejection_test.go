package engine_test

import (
	"math"
	"slices"
	"testing"

	"github.com/resin-llm/resin/core/engine"
)

// chiSquareBound is the failure threshold of the chi-square tests below: with 5 degrees
// of freedom (6 tokens) a correct sampler exceeds it with probability about 1e-6. The
// seeds are fixed, so a test that passes keeps passing; the deliberately wrong variants
// land far above it (hundreds to thousands), which is what shows the bound can fail.
const chiSquareBound = 36

// chiSquare is Pearson's statistic of counts against probabilities p over n draws; a
// count where p is 0 makes it +inf.
func chiSquare(counts []int, p []float32, n int) float64 {
	var x float64
	for t, c := range counts {
		e := float64(p[t]) * float64(n)
		if e == 0 {
			if c != 0 {
				return math.Inf(1)
			}
			continue
		}
		d := float64(c) - e
		x += d * d / e
	}
	return x
}

// inverseCDF returns the token where the running sum of p first passes u.
func inverseCDF(p []float32, u float64) int32 {
	var acc float64
	for t, pt := range p {
		acc += float64(pt)
		if u < acc {
			return int32(t)
		}
	}
	return int32(len(p) - 1)
}

// TestVerifyDraftReproducesP: a draft drawn from q (with DraftUniform) and verified
// against p by VerifyDraft gives a token distributed as p, over 10^5 seeded draws, for
// several (p, q) including q with no weight where p has some and the reverse; three
// deliberately wrong verifiers on the same draws (resampling from p, verifying against
// another q, drawing the draft and testing it with one number, accepting whatever p allows) fail the same bound.
func TestVerifyDraftReproducesP(t *testing.T) {
	const n = 100_000
	const pos = 17
	cases := []struct{ p, q []float32 }{
		{[]float32{0.4, 0.25, 0.15, 0.1, 0.06, 0.04}, []float32{0.1, 0.1, 0.2, 0.3, 0.2, 0.1}},
		{[]float32{0.3, 0.3, 0.2, 0.1, 0.1, 0}, []float32{0.05, 0.05, 0.1, 0.1, 0.2, 0.5}},
		{[]float32{0.1, 0.1, 0.1, 0.1, 0.3, 0.3}, []float32{0.5, 0.5, 0, 0, 0, 0}},
	}
	uniformQ := []float32{1. / 6, 1. / 6, 1. / 6, 1. / 6, 1. / 6, 1. / 6}
	type verifier func(p, q []float32, seed uint64) int32
	right := func(p, q []float32, seed uint64) int32 {
		d := inverseCDF(q, engine.DraftUniform(seed, pos))
		tok, _ := engine.VerifyDraft(p, q, d, seed, pos)
		return tok
	}
	wrong := map[string]verifier{
		// Resamples a rejected draft from p instead of the residual.
		"resample from p": func(p, q []float32, seed uint64) int32 {
			d := inverseCDF(q, engine.DraftUniform(seed, pos))
			tok, ok := engine.VerifyDraft(p, q, d, seed, pos)
			if !ok {
				tok = inverseCDF(p, engine.DraftUniform(seed+1<<40, pos))
			}
			return tok
		},
		// Verifies against a q other than the one the draft was drawn from.
		"wrong q": func(p, q []float32, seed uint64) int32 {
			d := inverseCDF(q, engine.DraftUniform(seed, pos))
			tok, _ := engine.VerifyDraft(p, uniformQ, d, seed, pos)
			return tok
		},
		// Rejection sampling done right but for its accept test, which reuses the number
		// that drew the draft (one stream for both).
		"shared stream": func(p, q []float32, seed uint64) int32 {
			u := engine.DraftUniform(seed, pos)
			d := inverseCDF(q, u)
			if u*float64(q[d]) < float64(p[d]) {
				return d
			}
			r := make([]float32, len(p))
			var sum float32
			for t := range p {
				r[t] = max(0, p[t]-q[t])
				sum += r[t]
			}
			for t := range r {
				r[t] /= sum
			}
			return inverseCDF(r, engine.DraftUniform(seed+1<<40, pos))
		},
		// Accepts every draft the target allows (MTP's compare, misapplied to q).
		"accept if allowed": func(p, q []float32, seed uint64) int32 {
			d := inverseCDF(q, engine.DraftUniform(seed, pos))
			if p[d] > 0 {
				return d
			}
			tok, _ := engine.VerifyDraft(p, q, d, seed, pos)
			return tok
		},
	}
	run := func(v verifier, p, q []float32) float64 {
		counts := make([]int, len(p))
		for s := range n {
			counts[v(p, q, uint64(s)*0x9E3779B97F4A7C15+1)]++
		}
		return chiSquare(counts, p, n)
	}
	for c, tc := range cases {
		x := run(right, tc.p, tc.q)
		if !(x < chiSquareBound) {
			t.Errorf("case %d: chi-square %.1f over %d draws, want below %d", c, x, n, chiSquareBound)
		}
		t.Logf("case %d: chi-square %.1f", c, x)
		for name, v := range wrong {
			x := run(v, tc.p, tc.q)
			t.Logf("case %d: %q: chi-square %.1f", c, name, x)
			if x < chiSquareBound {
				t.Errorf("case %d: the %q verifier gives chi-square %.1f, below the bound %d that should catch it", c, name, x, chiSquareBound)
			}
		}
	}
}

// TestDistributionIsWhatSampleDraws: for rows with temperature, top-k, top-p, min-p, a
// bias, penalties and a grammar mask, Sample's tokens over 10^5 seeds are distributed as
// Distribution says (chi-square, the bound above), and a greedy row's distribution is
// its argmax with probability 1.
func TestDistributionIsWhatSampleDraws(t *testing.T) {
	const n = 100_000
	logits := []float32{1.2, 0.3, 2.0, -0.5, 1.9, 0.8}
	rows := []engine.SamplingRow{
		{Temperature: 1},
		{Temperature: 0.7, TopK: 4},
		{Temperature: 1.3, TopP: 0.8},
		{Temperature: 1, MinP: 0.3},
		{Temperature: 0.9, BiasTokens: []int32{3}, BiasValues: []float32{2}, PresencePenalty: 0.8, History: []int32{2, 4, 4}, PromptLen: 1},
		{Temperature: 1, Mask: []uint32{0b101011}},
	}
	var s engine.Sampler
	for r, row := range rows {
		p := s.Distribution(logits, row, 9, nil)
		p = append([]float32(nil), p...)
		var sum float64
		for _, v := range p {
			sum += float64(v)
		}
		if math.Abs(sum-1) > 1e-5 {
			t.Fatalf("row %d: distribution %v sums to %v", r, p, sum)
		}
		counts := make([]int, len(logits))
		for k := range n {
			row.Seed = uint64(k)*0x9E3779B97F4A7C15 + 3
			tok, _, _ := s.Sample(logits, row, 9, nil)
			counts[tok]++
		}
		if x := chiSquare(counts, p, n); !(x < chiSquareBound) {
			t.Errorf("row %d: Sample's counts %v against Distribution %v: chi-square %.1f, want below %d", r, counts, p, x, chiSquareBound)
		}
	}
	p := s.Distribution(logits, engine.SamplingRow{Mask: []uint32{0b111011}}, 0, nil)
	if want := []float32{0, 0, 0, 0, 1, 0}; !slices.Equal(p, want) {
		t.Errorf("greedy masked row: distribution %v, want %v", p, want)
	}
}
