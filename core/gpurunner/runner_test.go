package gpurunner

import (
	"slices"
	"testing"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
)

func TestDeviceSamples(t *testing.T) {
	base := func() *engine.BatchPlan {
		return buildPlan(16,
			seqSpec{computed: 3, promptLen: 2, tokens: []int32{5}, pages: []kvslab.PageID{1}, rows: 1, temp: 0.7, topP: 0.9, topK: 20, seed: 4},
			seqSpec{tokens: []int32{1, 2, 3}, pages: []kvslab.PageID{2}, rows: 1})
	}
	if p := base(); !deviceSamples(p) {
		t.Error("temperature, top-p and top-k rows: not sampled on the device")
	}
	cases := map[string]func(p *engine.BatchPlan){
		"drafts":         func(p *engine.BatchPlan) { p.NumDrafts[1] = 1 },
		"too many top":   func(p *engine.BatchPlan) { p.Logprobs[0] = MaxTop + 1 },
		"logit bias":     func(p *engine.BatchPlan) { p.LogitBiasStart = []int32{0, 0, 0} },
		"min tokens":     func(p *engine.BatchPlan) { p.StopIDsStart = []int32{0, 0, 0} },
		"history":        func(p *engine.BatchPlan) { p.HistoryStart = []int32{0, 0, 0} },
		"prompt logprob": func(p *engine.BatchPlan) { p.PromptLogprobs, p.PromptNext = []int32{-1, 2}, []int32{-1, 7} },
		"penalty": func(p *engine.BatchPlan) {
			p.PresencePenalty, p.FrequencyPenalty, p.RepetitionPenalty = []float32{0, 0.5}, []float32{0, 0}, []float32{1, 1}
		},
	}
	for name, mod := range cases {
		p := base()
		mod(p)
		if deviceSamples(p) {
			t.Errorf("%s: sampled on the device, which the sampling kernel does not cover", name)
		}
	}
	p := base()
	p.Logprobs[0] = MaxTop
	p.PresencePenalty, p.FrequencyPenalty, p.RepetitionPenalty = []float32{0, 0}, []float32{0, 0}, []float32{1, 1}
	if !deviceSamples(p) {
		t.Error("32 alternatives and penalties that are off: not sampled on the device")
	}
}

func TestFillResult(t *testing.T) {
	// Sequence 0 decodes asking 2 alternatives, 1 is a mid-prompt chunk (no row), 2
	// completes its prompt asking only the sampled token's logprob.
	p := buildPlan(16,
		seqSpec{computed: 3, promptLen: 2, tokens: []int32{5}, pages: []kvslab.PageID{1}, rows: 1},
		seqSpec{tokens: []int32{1, 2}, promptLen: 9, pages: []kvslab.PageID{2}},
		seqSpec{tokens: []int32{4, 4}, pages: []kvslab.PageID{3}, rows: 1})
	p.Logprobs = []int32{2, -1, 0}
	ids := []int32{11, 22}
	lps := []float32{-0.5, -1.5}
	topIDs := make([]int32, 2*MaxTop)
	topLPs := make([]float32, 2*MaxTop)
	for i := range topIDs {
		topIDs[i], topLPs[i] = int32(100+i), -float32(i)
	}
	var res engine.StepResult
	fillResult(&res, p, anyLP(p), ids, lps, topIDs, topLPs)
	if !slices.Equal(res.Accepted, []int32{1, 0, 1}) || !slices.Equal(res.Tokens, []int32{11, 22}) || !slices.Equal(res.NumNextDrafts, []int32{0, 0, 0}) {
		t.Errorf("accepted %v tokens %v drafts %v", res.Accepted, res.Tokens, res.NumNextDrafts)
	}
	if !slices.Equal(res.Logprobs, []float32{-0.5, -1.5}) || !slices.Equal(res.TopTokens, []int32{100, 101}) || !slices.Equal(res.TopLogprobs, []float32{0, -1}) {
		t.Errorf("logprobs %v, top %v %v", res.Logprobs, res.TopTokens, res.TopLogprobs)
	}
	// Without logprobs asked, none are returned.
	p.Logprobs = []int32{-1, -1, -1}
	fillResult(&res, p, anyLP(p), ids, lps, topIDs, topLPs)
	if len(res.Logprobs) != 0 || len(res.TopTokens) != 0 || !slices.Equal(res.Tokens, []int32{11, 22}) {
		t.Errorf("no logprobs asked: %+v", res)
	}
}

func anyLP(p *engine.BatchPlan) bool { lp, _ := logprobsWanted(p); return lp }
