package engine

import (
	"math"
	"testing"
)

// TestSamplerNaNAndInf: rows a broken model can produce are sampled as sampling.cu does:
// greedy skips NaN (it returned 0 whenever the first logit was NaN), a draw never picks a
// NaN logit and gives a +inf maximum weight 1 (it returned the last candidate, any of
// them), and a row of NaN lists its alternatives as ids 0.. in order (it put the last id
// last).
func TestSamplerNaNAndInf(t *testing.T) {
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	var s Sampler
	greedy := SamplingRow{}
	if tok, _, _ := s.Sample([]float32{nan, 1, 2, nan}, greedy, 0, nil); tok != 2 {
		t.Errorf("greedy over {NaN, 1, 2, NaN}: token %d, want 2", tok)
	}
	if tok, _, _ := s.Sample([]float32{nan, nan, nan}, greedy, 0, nil); tok != 0 {
		t.Errorf("greedy over a row of NaN: token %d, want 0", tok)
	}
	for seed := range uint64(50) {
		for _, row := range []SamplingRow{
			{Temperature: 1, Seed: seed},
			{Temperature: 0.7, TopK: 3, Seed: seed},
			{Temperature: 1, TopP: 0.9, Seed: seed},
		} {
			tok, _, _ := s.Sample([]float32{nan, 0, 0.5, nan, 0.25}, row, 5, nil)
			if tok != 1 && tok != 2 && tok != 4 {
				t.Fatalf("%+v over {NaN, 0, 0.5, NaN, 0.25}: token %d, a NaN logit", row, tok)
			}
			if tok, _, _ := s.Sample([]float32{1, inf, 0, nan}, row, 5, nil); tok != 1 {
				t.Fatalf("%+v over {1, +inf, 0, NaN}: token %d, want the +inf one", row, tok)
			}
		}
	}
	_, _, top := s.Sample([]float32{nan, nan, nan, nan, nan}, SamplingRow{Logprobs: 3}, 0, nil)
	if len(top) != 3 || top[0].Token != 0 || top[1].Token != 1 || top[2].Token != 2 {
		t.Errorf("alternatives of a row of NaN: %+v, want ids 0, 1, 2", top)
	}
}

// TestSampledRowOfNaN: a sampled row (temperature > 0, with top-k, top-p or neither) of
// NaN logits gives token 0, the argmax greedy takes and the token Distribution gives
// probability 1; it indexed the row at -1 and panicked.
func TestSampledRowOfNaN(t *testing.T) {
	nan := float32(math.NaN())
	var s Sampler
	for _, row := range []SamplingRow{
		{Temperature: 1, Seed: 3},
		{Temperature: 0.7, TopK: 2, Seed: 3},
		{Temperature: 1, TopP: 0.9, MinP: 0.1, Seed: 3},
	} {
		logits := []float32{nan, nan, nan}
		tok, _, _ := s.Sample(logits, row, 4, nil)
		if tok != 0 {
			t.Errorf("%+v over a row of NaN: token %d, want 0", row, tok)
		}
		if d := s.Distribution(logits, row, 4, nil); d[0] != 1 {
			t.Errorf("%+v: distribution %v, want token 0 certain", row, d)
		}
	}
}

// TestMaskWithoutUsableLogits: when every token the grammar allows has a -inf or NaN
// logit, greedy and sampled rows still choose an allowed token, and Distribution spreads
// over the allowed ones only; a draw chose any token of the vocabulary (the masked -inf
// weighed as the maximum).
func TestMaskWithoutUsableLogits(t *testing.T) {
	nan, ninf := float32(math.NaN()), float32(math.Inf(-1))
	var s Sampler
	for _, logits := range [][]float32{{0, ninf, ninf, 3, 1}, {0, nan, ninf, 3, 1}, {0, nan, nan, 3, 1}} {
		for seed := range uint64(40) {
			for _, row := range []SamplingRow{{Seed: seed}, {Temperature: 1, Seed: seed}, {Temperature: 0.8, TopK: 3, TopP: 0.9, Seed: seed}} {
				row.Mask = []uint32{0b0110} // tokens 1 and 2
				if tok, _, _ := s.Sample(logits, row, 2, nil); tok != 1 && tok != 2 {
					t.Fatalf("%v, %+v: token %d outside the mask", logits, row, tok)
				}
				d := s.Distribution(logits, row, 2, nil)
				if d[0] != 0 || d[3] != 0 || d[4] != 0 || d[1]+d[2] != 1 {
					t.Fatalf("%v, %+v: distribution %v outside the mask", logits, row, d)
				}
			}
		}
	}
}
