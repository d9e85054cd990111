package runnertest

import (
	"math"
	"testing"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
)

// Seq is one sequence driven by hand through a pool, as the engine would drive it.
type Seq struct {
	ID       kvslab.SeqID
	Tokens   []int32 // the whole sequence: what Plan feeds comes from here
	Computed int     // tokens fed so far
}

// OpenSeq opens a sequence of tokens in pool, with no prefix-cache lookup.
func OpenSeq(t testing.TB, pool *kvslab.Pool, tokens []int32) *Seq {
	t.Helper()
	id, _, err := pool.Open(nil)
	if err != nil {
		t.Fatal(err)
	}
	return &Seq{ID: id, Tokens: tokens}
}

// Plan reserves pages for, and builds, the plan that feeds n[i] more tokens of seqs[i],
// with logits for every row when all is set, else for each sequence's last row. It
// advances each sequence's Computed. Plan handles full-attention and sliding-window
// groups; drive runners with other cache kinds through the engine.
func Plan(t testing.TB, pool *kvslab.Pool, seqs []*Seq, n []int, all bool) *engine.BatchPlan {
	t.Helper()
	specs := pool.Groups()
	p := &engine.BatchPlan{QueryStart: []int32{0}, LogitsStart: []int32{0}, Groups: make([]engine.GroupPlan, len(specs))}
	for g, spec := range specs {
		if spec.Kind != kvslab.Full && spec.Kind != kvslab.SlidingWindow {
			t.Fatalf("runnertest.Plan: cache group %q is %s; only full and sliding-window groups are supported", spec.Name, spec.Kind)
		}
		p.Groups[g].PageTableStart = []int32{0}
	}
	bt := pool.BlockTokens()
	for i, s := range seqs {
		if err := pool.Reserve(s.ID, n[i]); err != nil {
			t.Fatal(err)
		}
		p.ReqIDs = append(p.ReqIDs, uint64(i+1))
		p.Computed = append(p.Computed, int32(s.Computed))
		p.Scheduled = append(p.Scheduled, int32(n[i]))
		p.PromptLen = append(p.PromptLen, int32(len(s.Tokens)))
		p.NumDrafts = append(p.NumDrafts, 0)
		p.Temperature = append(p.Temperature, 0)
		p.TopP = append(p.TopP, 0)
		p.TopK = append(p.TopK, 0)
		p.MinP = append(p.MinP, 0)
		p.Seed = append(p.Seed, 0)
		p.Logprobs = append(p.Logprobs, -1)
		for j := 0; j < n[i]; j++ {
			pos := s.Computed + j
			p.Tokens = append(p.Tokens, s.Tokens[pos])
			p.Positions = append(p.Positions, int32(pos))
			if all || j == n[i]-1 {
				p.LogitsIndices = append(p.LogitsIndices, int32(len(p.Tokens)-1))
			}
		}
		for g := range specs {
			gp := &p.Groups[g]
			table := pool.PageTable(s.ID, g)
			for j := 0; j < n[i]; j++ {
				pos := s.Computed + j
				gp.SlotMapping = append(gp.SlotMapping, int64(table[pos/bt])*int64(bt)+int64(pos%bt))
			}
			gp.PageTable = append(gp.PageTable, table...)
			gp.PageTableStart = append(gp.PageTableStart, int32(len(gp.PageTable)))
		}
		p.QueryStart = append(p.QueryStart, int32(len(p.Tokens)))
		p.LogitsStart = append(p.LogitsStart, int32(len(p.LogitsIndices)))
		s.Computed += n[i]
	}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	return p
}

// CloseTo fails t unless got and want agree element by element within
// tol*(1+|want|), and logs the largest difference.
func CloseTo(t testing.TB, what string, got, want []float32, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	worst := 0.0
	for i := range got {
		d := math.Abs(float64(got[i] - want[i]))
		if math.IsNaN(d) || d > tol*(1+math.Abs(float64(want[i]))) {
			t.Fatalf("%s: element %d = %g, want %g (tolerance %g)", what, i, got[i], want[i], tol)
		}
		worst = max(worst, d)
	}
	t.Logf("%s: max |diff| %.3g", what, worst)
}
