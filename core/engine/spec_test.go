package engine_test

import (
	"slices"
	"testing"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/engine/enginetest"
)

func TestSpeculativeGreedyEqualsPlain(t *testing.T) {
	t.Run("full", func(t *testing.T) { testSpeculative(t, 0) })
	t.Run("sliding-window", func(t *testing.T) { testSpeculative(t, 20) })
}

func testSpeculative(t *testing.T, window int) {
	// Drafts are right except where (pos+j)%3 == 0, so some steps accept all drafts,
	// some a part and some none.
	wrong := func(pos, j int) bool { return (pos+j)%3 == 0 }
	prompts := [][]int32{prompt(1, 5), prompt(2, 33), prompt(3, 64), prompt(4, 1)}
	run := func(drafts int) ([][]int32, engine.Counters, uint64) {
		d := newDirect(t, enginetest.Config{BlockTokens: 16, MaxDrafts: drafts, WrongDraft: wrong, Window: window}, engine.Config{MaxBatchTokens: 40})
		var outs []*recorder
		for i, p := range prompts {
			outs = append(outs, d.add(string(rune('a'+i)), p, engine.SamplingParams{MaxTokens: 50}, 0))
		}
		d.runAll()
		d.checkWhole()
		var toks [][]int32
		for _, o := range outs {
			toks = append(toks, o.tokens)
		}
		steps, _ := d.r.Steps()
		return toks, d.s.Counters(), steps
	}
	plain, _, plainSteps := run(0)
	for i, p := range prompts {
		if want := enginetest.Reference(256, p, 50, greedy()); !slices.Equal(plain[i], want) {
			t.Fatalf("plain request %d differs from the reference", i)
		}
	}
	for _, k := range []int{1, 3} {
		spec, c, steps := run(k)
		for i := range prompts {
			if !slices.Equal(spec[i], plain[i]) {
				t.Fatalf("%d drafts, request %d: %v, want %v", k, i, spec[i], plain[i])
			}
		}
		if c.DraftsProposed == 0 || c.DraftsAccepted == 0 || c.DraftsAccepted == c.DraftsProposed {
			t.Fatalf("%d drafts: proposed %d accepted %d: the pattern should accept some, not all", k, c.DraftsProposed, c.DraftsAccepted)
		}
		if steps >= plainSteps {
			t.Fatalf("%d drafts took %d steps, plain %d", k, steps, plainSteps)
		}
	}
}

func TestSpeculativeSeededSamplingEqualsPlain(t *testing.T) {
	// With per-position seeded sampling, accepting a draft only when it equals the
	// sampled token keeps the output identical too.
	sp := engine.SamplingParams{MaxTokens: 40, Temperature: 0.7, TopK: 20, Seed: 42, HasSeed: true}
	var got [2][]int32
	for k, drafts := range []int{0, 2} {
		d := newDirect(t, enginetest.Config{MaxDrafts: drafts}, engine.Config{})
		o := d.add("s", prompt(9, 20), sp, 0)
		d.runAll()
		d.checkWhole()
		got[k] = o.tokens
	}
	if !slices.Equal(got[0], got[1]) {
		t.Fatalf("speculation changed seeded output: %v vs %v", got[0], got[1])
	}
	row := engine.SamplingRow{Temperature: 0.7, TopK: 20, Seed: 42, Logprobs: -1}
	if want := enginetest.Reference(256, prompt(9, 20), 40, row); !slices.Equal(got[0], want) {
		t.Fatalf("seeded output %v, reference %v", got[0], want)
	}
}
