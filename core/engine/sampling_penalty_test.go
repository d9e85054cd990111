package engine

import (
	"math"
	"testing"
)

// TestPenaltiesFollowTheFormulas checks the adjusted logits against values worked by
// hand: repetition (vLLM/HF: divide positive logits, multiply negative ones, over prompt
// and output), then frequency and presence (OpenAI: over the output only).
func TestPenaltiesFollowTheFormulas(t *testing.T) {
	logits := []float32{2, 1, -1, 0.4, 3, -0.5}
	row := SamplingRow{
		PresencePenalty: 0.25, FrequencyPenalty: 0.5, RepetitionPenalty: 2,
		PromptLen: 2, History: []int32{1, 2, 0, 0, 5, PendingToken},
	}
	var s Sampler
	got := s.adjust(logits, &row, 6)
	want := []float32{
		2.0/2 - 0.5*2 - 0.25, // output twice: repetition, then frequency x2 and presence
		1.0 / 2,              // prompt only: repetition alone
		-1 * 2,               // prompt only, negative: multiplied
		0.4,                  // never seen
		3,                    // never seen
		-0.5*2 - 0.5 - 0.25,  // output once, negative
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("logit %d: got %v, want %v (all %v)", i, got[i], want[i], got)
		}
	}
	if logits[0] != 2 {
		t.Fatal("adjust modified the model's logits")
	}
	for i, c := range s.count {
		if c != 0 {
			t.Fatalf("count[%d] = %d left behind", i, c)
		}
	}
	// Only presence and frequency: prompt tokens are untouched.
	row = SamplingRow{PresencePenalty: -1, FrequencyPenalty: 1, PromptLen: 1, History: []int32{3, 3, 3}}
	got = s.adjust(logits, &row, 3)
	if got[3] != 0.4-2*1-(-1) || got[0] != 2 {
		t.Fatalf("presence/frequency: %v", got)
	}
}

func TestLogitBiasAndMinTokens(t *testing.T) {
	logits := []float32{0, 1, 2, 3}
	var s Sampler
	greedyRow := SamplingRow{Logprobs: -1}

	row := greedyRow
	row.BiasTokens, row.BiasValues = []int32{0}, []float32{100}
	row.Logprobs = 0 // the token's logprob, no alternatives
	tok, lp, _ := s.Sample(logits, row, 0, nil)
	if tok != 0 {
		t.Fatalf("a +100 bias did not force token 0: got %d", tok)
	}
	// The logprob is the model's, before the bias.
	if want := float32(0 - math.Log(1+math.E+math.Exp(2)+math.Exp(3))); math.Abs(float64(lp-want)) > 1e-5 {
		t.Fatalf("logprob %v, want the raw %v", lp, want)
	}
	row.BiasTokens, row.BiasValues = []int32{3}, []float32{-100}
	if tok, _, _ := s.Sample(logits, row, 0, nil); tok != 2 {
		t.Fatalf("a -100 bias did not forbid token 3: got %d", tok)
	}

	row = greedyRow
	row.PromptLen, row.MinTokens, row.StopIDs = 5, 2, []int32{3, 2}
	for pos, want := range map[int]int32{5: 1, 6: 1, 7: 3} {
		if tok, _, _ := s.Sample(logits, row, pos, nil); tok != want {
			t.Fatalf("position %d (min_tokens 2 after a prompt of 5): got %d, want %d", pos, tok, want)
		}
	}
	// Sampled, not greedy: a masked token is never drawn.
	row.Temperature = 1
	for seed := uint64(0); seed < 200; seed++ {
		row.Seed = seed
		if tok, _, _ := s.Sample(logits, row, 5, nil); tok == 3 || tok == 2 {
			t.Fatalf("seed %d drew masked token %d", seed, tok)
		}
	}
}

// TestPlainRowCostsNothing: a row without bias, penalty or active gate samples from the
// logits directly (no copy, no allocation), as before these features.
func TestPlainRowCostsNothing(t *testing.T) {
	logits := make([]float32, 1000)
	for i := range logits {
		logits[i] = float32(i%37) * 0.1
	}
	var s Sampler
	row := SamplingRow{Temperature: 0.8, TopK: 50, Logprobs: -1, PromptLen: 3, MinTokens: 1, StopIDs: []int32{5}}
	s.Sample(logits, row, 10, nil) // warm the scratch buffers
	if n := testing.AllocsPerRun(100, func() { s.Sample(logits, row, 10, nil) }); n != 0 {
		t.Fatalf("%v allocations per sample", n)
	}
	if s.adj != nil {
		t.Fatal("a plain row was copied")
	}
}
