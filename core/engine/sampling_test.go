package engine_test

import (
	"math"
	"testing"

	"github.com/resin-llm/resin/core/engine"
)

func TestSamplerGreedyAndFilters(t *testing.T) {
	logits := []float32{1, 3, 2, 0.5, 2.9}
	var s engine.Sampler
	tok, lp, _ := s.Sample(logits, engine.SamplingRow{Logprobs: -1}, 0, nil)
	if tok != 1 || lp != 0 {
		t.Fatalf("greedy without logprobs: token %d logprob %v, want 1 and 0 (not computed)", tok, lp)
	}
	tok, lp, _ = s.Sample(logits, engine.SamplingRow{Logprobs: 0}, 0, nil)
	if tok != 1 {
		t.Fatalf("greedy picked %d", tok)
	}
	var z float64
	for _, l := range logits {
		z += math.Exp(float64(l))
	}
	if want := 3 - math.Log(z); math.Abs(float64(lp)-want) > 1e-5 {
		t.Fatalf("logprob %v, want %v", lp, want)
	}
	for seed := uint64(0); seed < 200; seed++ {
		// top-k 2 keeps tokens 1 and 4 only.
		if tok, _, _ := s.Sample(logits, engine.SamplingRow{Temperature: 1, TopK: 2, Seed: seed}, 3, nil); tok != 1 && tok != 4 {
			t.Fatalf("top-k 2 picked %d", tok)
		}
		// min-p 0.8: only tokens within 80% of the best probability (1 and 4).
		if tok, _, _ := s.Sample(logits, engine.SamplingRow{Temperature: 1, MinP: 0.8, Seed: seed}, 3, nil); tok != 1 && tok != 4 {
			t.Fatalf("min-p picked %d", tok)
		}
		// top-p 0.3: the best token alone reaches 30%.
		if tok, _, _ := s.Sample(logits, engine.SamplingRow{Temperature: 1, TopP: 0.3, Seed: seed}, 3, nil); tok != 1 {
			t.Fatalf("top-p 0.3 picked %d", tok)
		}
	}
}

func TestSamplerSeedsAndDistribution(t *testing.T) {
	logits := []float32{0, float32(math.Log(2)), float32(math.Log(3)), float32(math.Log(4))} // probabilities 1:2:3:4
	var s engine.Sampler
	row := engine.SamplingRow{Temperature: 1, Seed: 11}
	a, _, _ := s.Sample(logits, row, 5, nil)
	b, _, _ := s.Sample(logits, row, 5, nil)
	if a != b {
		t.Fatal("same seed and position gave different tokens")
	}
	counts := make([]int, 4)
	const n = 20000
	for pos := 0; pos < n; pos++ {
		tok, _, _ := s.Sample(logits, row, pos, nil)
		counts[tok]++
	}
	for i, c := range counts {
		want := float64(n) * float64(i+1) / 10
		if math.Abs(float64(c)-want) > 0.05*float64(n) {
			t.Fatalf("token %d drawn %d times, expected about %.0f (counts %v)", i, c, want, counts)
		}
	}
	// A low temperature sharpens the distribution toward the best token.
	cold := 0
	for pos := 0; pos < 2000; pos++ {
		if tok, _, _ := s.Sample(logits, engine.SamplingRow{Temperature: 0.1, Seed: 3}, pos, nil); tok == 3 {
			cold++
		}
	}
	if cold < 1800 { // p(best) is about 0.945 at this temperature
		t.Fatalf("temperature 0.1 picked the best token %d/2000 times", cold)
	}
}

func TestSamplerTopLogprobs(t *testing.T) {
	logits := []float32{0.1, 5, -2, 4, 3}
	var s engine.Sampler
	_, _, top := s.Sample(logits, engine.SamplingRow{Logprobs: 3}, 0, nil)
	if len(top) != 3 || top[0].Token != 1 || top[1].Token != 3 || top[2].Token != 4 {
		t.Fatalf("top %+v", top)
	}
	_, _, top = s.Sample(logits, engine.SamplingRow{Logprobs: 9}, 0, top[:0])
	if len(top) != 5 {
		t.Fatalf("asked 9 of 5: %d", len(top))
	}
	if n := testing.AllocsPerRun(10, func() { s.Sample(logits, engine.SamplingRow{Temperature: 1, TopK: 3, TopP: 0.9}, 1, nil) }); n != 0 {
		t.Fatalf("sampling allocates %v times", n)
	}
}
