package gpurunner

import (
	"math"
	"testing"
)

// TestReferencePrefillEqualsDecode checks the CPU reference the GPU tests compare with:
// a prompt fed at once and the same prompt fed in chunks and then token by token give
// the same logits at the same positions.
func TestReferencePrefillEqualsDecode(t *testing.T) {
	c, w := randomDense(97, 32, 2, 4, 2, 8, 48, 64, 3)
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
