package gpurunner

import (
	"math"
	"testing"
)

// TestReferencePrefillEqualsDecode checks the CPU reference the GPU tests compare with:
// a prompt fed at once and the same prompt fed in chunks and then token by token give
// the same logits at the same positions.
func TestReferencePrefillEqualsDecode(t *testing.T) {
	for _, v := range []struct {
		name                   string
		qkvBias, oBias, qkNorm bool
	}{{"llama", false, false, false}, {"qwen2", true, false, false}, {"qwen3", false, false, true}, {"o bias", false, true, false}} {
		t.Run(v.name, func(t *testing.T) {
			c, w := randomDense(97, 32, 2, 4, 2, 8, 48, 64, 3)
			withVariants(c, w, v.qkvBias, v.oBias, v.qkNorm, 4)
			referencePrefillEqualsDecode(t, c, w)
		})
	}
}

// TestReferenceVariantsChangeLogits checks that each Qwen option reaches the reference's
// logits (a parity test against a reference that ignored one would prove nothing).
func TestReferenceVariantsChangeLogits(t *testing.T) {
	prompt := []int32{5, 17, 3, 88, 41, 9}
	logits := func(qkvBias, oBias, qkNorm bool) []float32 {
		c, w := randomDense(97, 32, 2, 4, 2, 8, 48, 64, 3)
		withVariants(c, w, qkvBias, oBias, qkNorm, 4)
		d := &driver{pageTokens: c.PageTokens, slots: 1 << 16}
		d.add(len(prompt))
		out, err := newRefDense(c, w, 8).forward(d.plan([]int{0}, [][]int32{prompt}, 0))
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	base := logits(false, false, false)
	for name, got := range map[string][]float32{"qkv bias": logits(true, false, false), "o bias": logits(false, true, false), "qk norm": logits(false, false, true)} {
		diff := 0.0
		for i := range base {
			diff = max(diff, math.Abs(float64(got[i]-base[i])))
		}
		if diff < 1e-3 {
			t.Errorf("%s: logits moved by at most %g: the reference does not apply it", name, diff)
		}
	}
}

func referencePrefillEqualsDecode(t *testing.T, c *DenseConfig, w *DenseWeights) {
	prompt := []int32{5, 17, 3, 88, 41, 9, 60, 2, 33, 71}

	whole := &driver{pageTokens: c.PageTokens, slots: 1 << 16}
	a := newRefDense(c, w, 8)
	whole.add(len(prompt))
	want, err := a.forward(whole.plan([]int{0}, [][]int32{prompt}, 0))
	if err != nil {
		t.Fatal(err)
	}

	parts := &driver{pageTokens: c.PageTokens, slots: 1 << 16}
	b := newRefDense(c, w, 8)
	parts.add(len(prompt))
	if _, err := b.forward(parts.plan([]int{0}, [][]int32{prompt[:6]}, 0)); err != nil {
		t.Fatal(err)
	}
	var got []float32
	for _, tok := range prompt[6:] {
		if got, err = b.forward(parts.plan([]int{0}, [][]int32{{tok}}, 0)); err != nil {
			t.Fatal(err)
		}
	}
	if len(got) != len(want) {
		t.Fatalf("%d logits, want %d", len(got), len(want))
	}
	for i := range want {
		if d := math.Abs(float64(got[i] - want[i])); d > 1e-4 {
			t.Fatalf("logit %d: token by token %g, whole prompt %g", i, got[i], want[i])
		}
	}
}
