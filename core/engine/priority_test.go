package engine_test

import (
	"slices"
	"testing"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/engine/enginetest"
)

// Under PolicyPriority the request preempted when pages run out is the lowest-priority
// running one, even when it is ahead of the request that needs the pages in the running
// list (it was admitted first, before the high-priority request arrived).
func TestPriorityPreemptsLowestPriorityAdmittedFirst(t *testing.T) {
	const highHandle = 2 // handles count from 1 in submission order
	var highComputed []int32
	rc := enginetest.Config{BlockTokens: 16, Pages: 7, OnPlan: func(p *engine.BatchPlan) {
		for i, id := range p.ReqIDs {
			if id == highHandle {
				highComputed = append(highComputed, p.Computed[i])
			}
		}
	}}
	d := newDirect(t, rc, engine.Config{Policy: engine.PolicyPriority})
	low := d.add("low", prompt(1, 60), engine.SamplingParams{MaxTokens: 30}, 9)
	d.step()
	// 7 pages of 16 tokens hold one of the two at its full length, not both: the high one
	// needs a new page first, while the low one, ahead of it, has room in its last page.
	high := d.add("high", prompt(2, 46), engine.SamplingParams{MaxTokens: 30}, 0)
	d.runAll()
	if d.s.Counters().Preemptions == 0 {
		t.Fatal("no preemption: the pool should not hold both requests")
	}
	for k := 1; k < len(highComputed); k++ {
		if highComputed[k] < highComputed[k-1] {
			t.Fatalf("the high-priority request was preempted (computed %v) while the low-priority one ran", highComputed)
		}
	}
	if want := enginetest.Reference(256, prompt(2, 46), 30, greedy()); !slices.Equal(high.tokens, want) {
		t.Fatal("high-priority tokens differ from the reference")
	}
	if want := enginetest.Reference(256, prompt(1, 60), 30, greedy()); !slices.Equal(low.tokens, want) {
		t.Fatal("low-priority tokens differ from the reference")
	}
	d.checkWhole()
}
