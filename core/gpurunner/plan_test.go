package gpurunner

import (
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
)

// seqSpec is one sequence of a hand-built plan.
type seqSpec struct {
	computed, promptLen int32
	tokens              []int32
	pages               []kvslab.PageID
	rows                int // logits rows: the last rows of the sequence's tokens
	temp, topP, minP    float32
	topK                int32
	seed                uint64
}

// buildPlan builds a valid one-group plan of seqs with page size pageTokens.
func buildPlan(pageTokens int, seqs ...seqSpec) *engine.BatchPlan {
	p := &engine.BatchPlan{QueryStart: []int32{0}, LogitsStart: []int32{0}, Groups: make([]engine.GroupPlan, 1)}
	g := &p.Groups[0]
	g.PageTableStart = []int32{0}
	for i, s := range seqs {
		p.ReqIDs = append(p.ReqIDs, uint64(100+i))
		p.Computed = append(p.Computed, s.computed)
		p.Scheduled = append(p.Scheduled, int32(len(s.tokens)))
		pl := s.promptLen
		if pl == 0 {
			pl = s.computed + int32(len(s.tokens))
		}
		p.PromptLen = append(p.PromptLen, pl)
		p.NumDrafts = append(p.NumDrafts, 0)
		p.Temperature = append(p.Temperature, s.temp)
		topP := s.topP
		if topP == 0 {
			topP = 1
		}
		p.TopP = append(p.TopP, topP)
		p.TopK = append(p.TopK, s.topK)
		p.MinP = append(p.MinP, s.minP)
		p.Seed = append(p.Seed, s.seed)
		p.Logprobs = append(p.Logprobs, -1)
		start := len(p.Tokens)
		for j, t := range s.tokens {
			pos := s.computed + int32(j)
			p.Tokens = append(p.Tokens, t)
			p.Positions = append(p.Positions, pos)
			page := s.pages[int(pos)/pageTokens]
			g.SlotMapping = append(g.SlotMapping, int64(page)*int64(pageTokens)+int64(int(pos)%pageTokens))
		}
		for j := len(s.tokens) - s.rows; j < len(s.tokens); j++ {
			p.LogitsIndices = append(p.LogitsIndices, int32(start+j))
		}
		p.QueryStart = append(p.QueryStart, int32(len(p.Tokens)))
		p.LogitsStart = append(p.LogitsStart, int32(len(p.LogitsIndices)))
		g.PageTable = append(g.PageTable, s.pages...)
		g.PageTableStart = append(g.PageTableStart, int32(len(g.PageTable)))
	}
	return p
}

// decodePlan is a plan of n sequences decoding one token each at position ctx-1.
func decodePlan(n, ctx, pageTokens int) *engine.BatchPlan {
	seqs := make([]seqSpec, n)
	for i := range seqs {
		pages := make([]kvslab.PageID, (ctx+pageTokens-1)/pageTokens)
		for j := range pages {
			pages[j] = kvslab.PageID(i*len(pages) + j + 1)
		}
		seqs[i] = seqSpec{computed: int32(ctx - 1), promptLen: 1, tokens: []int32{int32(10 + i)}, pages: pages, rows: 1}
	}
	return buildPlan(pageTokens, seqs...)
}
