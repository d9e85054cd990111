package glm5flash

import (
	"testing"

	"github.com/resin-llm/resin/core/runnertest"
)

// TestMoEGroupedEqualsRowByRow checks that the grouped MoE gives each row what it gives
// that row alone (rows routed to an expert with others, or by themselves), on hash and
// learned routing, and that it allocates nothing once its buffers have grown.
func TestMoEGroupedEqualsRowByRow(t *testing.T) {
	m := tinyModel(t)
	c := m.Config
	n, h := 40, c.HiddenSize
	x := make([]float32, n*h)
	tokens := make([]int32, n)
	for i := range x {
		x[i] = float32((i*37)%101)/50 - 1
	}
	for i := range tokens {
		tokens[i] = int32((i * 13) % c.VocabSize)
	}
	for li, kind := range c.MLPLayerTypes[:2] {
		l := &m.W.Layers[li]
		all, err := m.moe(l, kind, x, tokens)
		if err != nil {
			t.Fatal(err)
		}
		all = append([]float32(nil), all...)
		for r := range n {
			one, err := m.moe(l, kind, x[r*h:(r+1)*h], tokens[r:r+1])
			if err != nil {
				t.Fatal(err)
			}
			if d, at := runnertest.MaxAbsDiff(one, all[r*h:(r+1)*h]); d > 1e-6 {
				t.Errorf("%s: row %d alone differs from the batch by %g at %d", kind, r, d, at)
			}
		}
		if a := testing.AllocsPerRun(5, func() { _, _ = m.moe(l, kind, x, tokens) }); a != 0 {
			t.Errorf("%s: %v allocations per call in steady state", kind, a)
		}
	}
}
