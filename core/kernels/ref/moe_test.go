package ref

import (
	"math"
	"testing"
)

func TestMoETopKSoftmax(t *testing.T) {
	logits := []float32{1, 3, 2, 3} // experts 1 and 3 tie: the lower index wins first
	w, ids := make([]float32, 2), make([]int32, 2)
	if err := MoETopK(w, ids, logits, 1, 4, Routing{TopK: 2, Scoring: ScoreSoftmax}); err != nil {
		t.Fatal(err)
	}
	if ids[0] != 1 || ids[1] != 3 {
		t.Fatalf("ids = %v, want [1 3]", ids)
	}
	e := []float64{math.Exp(1), math.Exp(3), math.Exp(2), math.Exp(3)}
	s := e[0] + e[1] + e[2] + e[3]
	near(t, "softmax weights", w, []float32{float32(e[1] / s), float32(e[3] / s)}, 1e-6)

	if err := MoETopK(w, ids, logits, 1, 4, Routing{TopK: 2, Scoring: ScoreSoftmax, Renormalize: true, Scale: 2}); err != nil {
		t.Fatal(err)
	}
	near(t, "renormalised", w, []float32{1, 1}, 1e-6)
}

func TestMoETopKSigmoidBiasGroups(t *testing.T) {
	sig := func(x float32) float32 { return float32(1 / (1 + math.Exp(-float64(x)))) }
	logits := []float32{0, 1, 2, -1, 0.5, 0.2}
	// The bias makes expert 3 the best choice, but its weight stays its own sigmoid.
	bias := []float32{0, 0, 0, 5, 0, 0}
	w, ids := make([]float32, 2), make([]int32, 2)
	if err := MoETopK(w, ids, logits, 1, 6, Routing{TopK: 2, Scoring: ScoreSigmoid, Bias: bias}); err != nil {
		t.Fatal(err)
	}
	if ids[0] != 3 || ids[1] != 2 {
		t.Fatalf("ids = %v, want [3 2]", ids)
	}
	near(t, "sigmoid weights", w, []float32{sig(-1), sig(2)}, 1e-6)

	// Three groups of two; with one group kept, only the best group's experts can win.
	// Group sums (no bias): g0 = σ0+σ1, g1 = σ2+σ-1, g2 = σ.5+σ.2 → g0 ≈ 1.231 is best.
	if err := MoETopK(w, ids, logits, 1, 6, Routing{TopK: 2, Scoring: ScoreSigmoid, Groups: 3, GroupTopK: 1, Renormalize: true}); err != nil {
		t.Fatal(err)
	}
	if ids[0] != 1 || ids[1] != 0 {
		t.Fatalf("grouped ids = %v, want [1 0]", ids)
	}
	s := sig(1) + sig(0)
	near(t, "grouped weights", w, []float32{sig(1) / s, sig(0) / s}, 1e-6)

	for name, r := range map[string]Routing{
		"topk zero":  {TopK: 0},
		"topk big":   {TopK: 7},
		"bias len":   {TopK: 1, Bias: []float32{1}},
		"bad groups": {TopK: 1, Groups: 4, GroupTopK: 1},
		"scoring":    {TopK: 1, Scoring: 2}, // not silently a sigmoid (the CUDA launcher refuses it too)
	} {
		if err := MoETopK(w, ids, logits, 1, 6, r); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}
