package runnertest

import (
	"slices"
	"testing"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
)

// discard is an engine.Output that drops what it is given.
type discard struct{}

func (discard) Token(int32, *engine.TokenLogprob)               {}
func (discard) Finish(engine.FinishReason, error, engine.Usage) {}

// everyKind is a pool layout with one group of each kind, as DeepSeek-V4 uses them.
func everyKind() []kvslab.GroupSpec {
	return []kvslab.GroupSpec{
		{Name: "full", Kind: kvslab.Full, Layers: 2, BytesPerToken: 8, PageTokens: 8},
		{Name: "swa", Kind: kvslab.SlidingWindow, Layers: 1, BytesPerToken: 8, PageTokens: 8, Window: 8},
		{Name: "csa", Kind: kvslab.Compressed, Layers: 2, BytesPerToken: 16, PageTokens: 8, Ratio: 4},
		{Name: "hca", Kind: kvslab.Compressed, Layers: 1, BytesPerToken: 16, PageTokens: 8, Ratio: 8},
		{Name: "state", Kind: kvslab.Recurrent, Layers: 1, BytesPerToken: 64, PageTokens: 8, Checkpoints: 2},
	}
}

// TestPlanMatchesScheduler drives one request through core/engine's scheduler and the same
// sequence through Plan/Settle on a twin pool (prompt chunks crossing blocks, a decode, a
// draft rejected, a draft accepted) and checks that the two plans agree on everything a
// runner reads about tokens and cache groups: slots of every group kind, page tables,
// state pages, logits rows, drafts.
func TestPlanMatchesScheduler(t *testing.T) {
	groups := everyKind()
	const vocab = 50
	info := engine.RunnerInfo{Name: "plan", VocabSize: vocab, MaxContext: 128, CacheGroups: groups, MaxDrafts: 1}
	ePool, err := engine.NewHostPool(groups, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := engine.NewHostPool(groups, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	s, err := engine.NewScheduler(info, engine.Config{Pool: ePool, MaxBatchTokens: 11})
	if err != nil {
		t.Fatal(err)
	}
	prompt := Prompt(21, vocab, 1)
	if err := s.Add(engine.Request{ID: "r", Prompt: prompt, Sampling: engine.SamplingParams{MaxTokens: 20, IgnoreEOS: true}}, discard{}); err != nil {
		t.Fatal(err)
	}
	seq := OpenSeq(t, pool, slices.Clone(prompt))

	// Each step: the scheduler's plan, ours for the same tokens, and the runner's answer
	// (accepted tokens, next drafts) given to both.
	steps := []struct {
		n        int     // tokens Plan feeds from Tokens
		accepted []int32 // nil: a mid-prompt chunk
		drafts   []int32 // proposed for the next step
	}{
		{n: 11},
		{n: 10, accepted: []int32{7}},
		{n: 1, accepted: []int32{8}, drafts: []int32{9}},    // a decode; then a draft
		{n: 1, accepted: []int32{3}, drafts: []int32{4}},    // draft 9, at block 2's last position, rejected
		{n: 1, accepted: []int32{4, 5}, drafts: []int32{6}}, // draft 4 accepted
		{n: 1, accepted: []int32{1}},
		{n: 1, accepted: []int32{2}},
	}
	for k, st := range steps {
		want := s.Schedule()
		if want == nil {
			t.Fatalf("step %d: the scheduler planned nothing", k)
		}
		got := Plan(t, pool, []*Seq{seq}, []int{st.n}, false)
		comparePlans(t, k, got, want, st.accepted != nil)
		res := engine.StepResult{Accepted: []int32{int32(len(st.accepted))}, Tokens: st.accepted,
			NumNextDrafts: []int32{int32(len(st.drafts))}, Drafts: st.drafts}
		if err := s.Update(want, res, nil); err != nil {
			t.Fatal(err)
		}
		if st.accepted != nil {
			Settle(t, pool, seq, st.accepted)
		}
		seq.Drafts = st.drafts
		// The engine registers full blocks in the prefix cache, which keeps the pages a
		// sliding window lets go of: do the same so that both pools allocate alike.
		if err := pool.Commit(seq.ID, seq.Tokens[:min(seq.Computed, len(seq.Tokens))]); err != nil {
			t.Fatal(err)
		}
	}
	if err := pool.Check(); err != nil {
		t.Fatal(err)
	}
}

// comparePlans compares what a runner reads of two plans; logits rows only when sampled
// is set (Plan asks for a mid-prompt chunk's last row, which the scheduler does not).
func comparePlans(t *testing.T, step int, got, want *engine.BatchPlan, sampled bool) {
	t.Helper()
	fields := []struct {
		name      string
		got, want []int32
	}{
		{"Computed", got.Computed, want.Computed}, {"Scheduled", got.Scheduled, want.Scheduled},
		{"NumDrafts", got.NumDrafts, want.NumDrafts}, {"Tokens", got.Tokens, want.Tokens},
		{"Positions", got.Positions, want.Positions}, {"QueryStart", got.QueryStart, want.QueryStart},
	}
	if sampled {
		fields = append(fields, []struct {
			name      string
			got, want []int32
		}{{"LogitsStart", got.LogitsStart, want.LogitsStart}, {"LogitsIndices", got.LogitsIndices, want.LogitsIndices}}...)
	}
	for _, f := range fields {
		if !slices.Equal(f.got, f.want) {
			t.Fatalf("step %d: %s %v, the scheduler's %v", step, f.name, f.got, f.want)
		}
	}
	if len(got.Groups) != len(want.Groups) {
		t.Fatalf("step %d: %d groups, the scheduler's %d", step, len(got.Groups), len(want.Groups))
	}
	for g := range got.Groups {
		a, b := &got.Groups[g], &want.Groups[g]
		if !slices.Equal(a.SlotMapping, b.SlotMapping) || !slices.Equal(a.PageTableStart, b.PageTableStart) ||
			!slices.Equal(a.PageTable, b.PageTable) || !slices.Equal(a.StatePage, b.StatePage) {
			t.Fatalf("step %d, group %d: slots %v pages %v state %v; the scheduler's slots %v pages %v state %v",
				step, g, a.SlotMapping, a.PageTable, a.StatePage, b.SlotMapping, b.PageTable, b.StatePage)
		}
	}
}
