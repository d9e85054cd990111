package engine_test

import (
	"math"
	"reflect"
	"testing"

	"github.com/resin-llm/resin/core/engine"
)

// TestTokenMaskPlanRoundTrip: a plan's token masks survive the binary encoding (X&32) and
// TokenMaskOf finds each logits row's mask; inconsistent masks are refused.
func TestTokenMaskPlanRoundTrip(t *testing.T) {
	p := recurrentPlan()
	p.TokenMaskStart = []int32{0, 0, 2}
	p.TokenMask = []uint32{0b1010, 1 << 31}
	b, err := p.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	var q engine.BatchPlan
	if err := q.UnmarshalBinary(b); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(q.TokenMaskStart, p.TokenMaskStart) || !reflect.DeepEqual(q.TokenMask, p.TokenMask) {
		t.Fatalf("decoded masks %v %v", q.TokenMaskStart, q.TokenMask)
	}
	if m := q.TokenMaskOf(0, 0); m != nil {
		t.Fatalf("unconstrained row has mask %v", m)
	}
	if m := q.SamplingOf(1).Mask; !reflect.DeepEqual(m, []uint32{0b1010, 1 << 31}) {
		t.Fatalf("row 1 mask %v", m)
	}
	// Without masks the encoding is what it was.
	plain, _ := recurrentPlan().MarshalBinary()
	if len(plain) != len(b)-4*3-4*2 {
		t.Fatalf("encoding with masks %d bytes, without %d", len(b), len(plain))
	}
	for _, bad := range []struct {
		start []int32
		mask  []uint32
	}{
		{[]int32{0, 1}, []uint32{1}},          // not B+1 offsets
		{[]int32{0, 1, 3}, []uint32{1, 2, 3}}, // different widths
		{nil, []uint32{1}},                    // words without offsets
		{[]int32{0, 0, 2}, []uint32{1}},       // offsets past the words
	} {
		p := recurrentPlan()
		p.TokenMaskStart, p.TokenMask = bad.start, bad.mask
		if err := p.Validate(); err == nil {
			t.Errorf("masks %v %v validated", bad.start, bad.mask)
		}
	}
}

// TestSamplerAppliesMask: greedy and sampled choices stay inside the mask, ids past it
// are not allowed, logprobs stay the model's, and when min_tokens masks every token the
// grammar allows (it can only end), the grammar's tokens are still sampled.
func TestSamplerAppliesMask(t *testing.T) {
	logits := make([]float32, 40)
	for i := range logits {
		logits[i] = float32(i) / 4
	}
	mask := []uint32{1<<3 | 1<<17 | 1<<20}
	var s engine.Sampler
	tok, lp, _ := s.Sample(logits, engine.SamplingRow{Mask: mask}, 5, nil)
	if tok != 20 {
		t.Fatalf("greedy under the mask chose %d, want 20", tok)
	}
	_, raw, _ := s.Sample(logits, engine.SamplingRow{}, 5, nil)
	if d := lp - (logits[20] - (logits[39] - raw)); math.Abs(float64(d)) > 1e-5 {
		t.Fatalf("logprob %v is not the model's", lp)
	}
	for pos := 0; pos < 200; pos++ {
		tok, _, _ := s.Sample(logits, engine.SamplingRow{Mask: mask, Temperature: 5, Seed: 7}, pos, nil)
		if tok != 3 && tok != 17 && tok != 20 {
			t.Fatalf("sampled %d outside the mask", tok)
		}
	}
	// min_tokens masks 20 (a stop id) and the mask allows only 20: 20 it is.
	row := engine.SamplingRow{Mask: []uint32{1 << 20}, StopIDs: []int32{20}, MinTokens: 3, PromptLen: 2}
	if tok, _, _ := s.Sample(logits, row, 2, nil); tok != 20 {
		t.Fatalf("got %d, want the grammar's only token 20", tok)
	}
	// min_tokens masks 20 but the grammar allows 3 as well: 3.
	row.Mask = []uint32{1<<20 | 1<<3}
	if tok, _, _ := s.Sample(logits, row, 2, nil); tok != 3 {
		t.Fatalf("got %d, want 3", tok)
	}
}
