package engine_test

import (
	"slices"
	"testing"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/engine/enginetest"
)

// A prompt prefilled in chunks, each planned while the one before runs (Config.Async),
// leaves the same recurrent checkpoints in the prefix cache as without Async: the hit of
// a later prompt that shares the first chunk is as long.
func TestAsyncChunkedPrefillKeepsCheckpointHits(t *testing.T) {
	var hits [2]uint64
	for k, async := range []bool{false, true} {
		d := newDirect(t, enginetest.Config{Async: async, Recurrent: true, BlockTokens: 8, Pages: 128},
			engine.Config{Async: async, MaxBatchTokens: 48})
		a := prompt(1, 100)
		d.add("a", a, engine.SamplingParams{MaxTokens: 2}, 0)
		ahead := 0
		for p := d.s.Schedule(); p != nil; {
			next := d.s.Schedule() // built while p "runs" (nil without Async)
			if next != nil {
				ahead++
			}
			d.run(p)
			if p = next; p == nil {
				p = d.s.Schedule()
			}
		}
		if async && ahead == 0 {
			t.Fatal("no chunk was planned ahead")
		}
		b := append(slices.Clone(a[:48]), prompt(2, 5)...)
		d.add("b", b, engine.SamplingParams{MaxTokens: 2}, 0)
		d.runAll()
		hits[k] = d.s.Counters().PrefixHits
		d.checkWhole()
	}
	if hits[0] != 48 || hits[1] != hits[0] {
		t.Fatalf("prefix hits: %d without Async, %d with; want 48 both", hits[0], hits[1])
	}
}
