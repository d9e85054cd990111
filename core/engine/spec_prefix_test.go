package engine_test

import (
	"slices"
	"testing"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/engine/enginetest"
)

// Accepted drafts that cross a block boundary must commit the block with the tokens it
// really holds: the block is keyed by them, so that a later prompt with the same text
// hits it, and a prompt with other tokens at those positions does not.
func TestAcceptedDraftsCommitTheRightBlock(t *testing.T) {
	h := start(t, enginetest.Config{BlockTokens: 16, MaxDrafts: 3}, engine.Config{})
	// Prompt of 13: the first decode step feeds position 13 and drafts for 14..16, all
	// accepted, so block 0 (positions 0..15) fills while tokens 14 and 15 are still
	// being appended.
	p := prompt(1, 13)
	a, _ := h.generate(engine.Request{Prompt: p, Sampling: engine.SamplingParams{MaxTokens: 8}})
	if want := enginetest.Reference(256, p, 8, greedy()); !slices.Equal(a, want) {
		t.Fatalf("speculative output %v, reference %v", a, want)
	}
	// The same text again hits block 0.
	again := append(slices.Clone(p), a...)
	toks, ev := h.generate(engine.Request{Prompt: again, Sampling: engine.SamplingParams{MaxTokens: 4}})
	if ev.Usage.CachedTokens < 16 {
		t.Errorf("prompt + output again: %d cached tokens, want at least 16", ev.Usage.CachedTokens)
	}
	if want := enginetest.Reference(256, again, 4, greedy()); !slices.Equal(toks, want) {
		t.Errorf("prompt + output again: %v, reference %v", toks, want)
	}
	// Other tokens at 14 and 15 (zeros, what lay beyond the output's length) must miss.
	other := append(append(slices.Clone(p), a[0], 0, 0), 5, 6, 7)
	toks, ev = h.generate(engine.Request{Prompt: other, Sampling: engine.SamplingParams{MaxTokens: 4}})
	if want := enginetest.Reference(256, other, 4, greedy()); !slices.Equal(toks, want) {
		t.Errorf("different tokens at 14..15: %v, reference %v (%d cached)", toks, want, ev.Usage.CachedTokens)
	}
	h.checkWhole()
}
