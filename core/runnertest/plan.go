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
	// Drafts, when set, are draft tokens the next Plan feeds after the sequence's n
	// tokens, which must then reach the end of Tokens, with a logits row for the last of
	// them and for each draft (as the engine schedules a decode token and the drafts the
	// runner proposed). Settle applies the runner's verdict on them.
	Drafts []int32
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

// Plan reserves pages for, and builds, the plan that feeds n[i] more tokens of seqs[i]
// (then its Drafts, if any), with logits for every row when all is set, else for each
// sequence's last row (and its draft rows). It advances each sequence's Computed by n[i].
//
// Every kind of cache group is mapped as core/engine maps it: a full-attention or
// sliding-window token's slot is page*BlockTokens + position%BlockTokens, a compressed
// group's page*(BlockTokens/Ratio) + (position%BlockTokens)/Ratio (the Ratio tokens of one
// entry share its slot), and a recurrent group has no per-token slot (NoSlot) but the
// sequence's live StatePage, its page table holding the block-end checkpoints.
func Plan(t testing.TB, pool *kvslab.Pool, seqs []*Seq, n []int, all bool) *engine.BatchPlan {
	t.Helper()
	specs := pool.Groups()
	p := &engine.BatchPlan{QueryStart: []int32{0}, LogitsStart: []int32{0}, Groups: make([]engine.GroupPlan, len(specs))}
	for g := range specs {
		p.Groups[g].PageTableStart = []int32{0}
	}
	bt := pool.BlockTokens()
	for i, s := range seqs {
		k := len(s.Drafts)
		if k > 0 && s.Computed+n[i] != len(s.Tokens) {
			t.Fatalf("runnertest.Plan: sequence %d has drafts but feeds %d of its %d tokens", i, s.Computed+n[i], len(s.Tokens))
		}
		if err := pool.Reserve(s.ID, n[i]+k); err != nil {
			t.Fatal(err)
		}
		p.ReqIDs = append(p.ReqIDs, uint64(i+1))
		p.Computed = append(p.Computed, int32(s.Computed))
		p.Scheduled = append(p.Scheduled, int32(n[i]+k))
		p.PromptLen = append(p.PromptLen, int32(len(s.Tokens)))
		p.NumDrafts = append(p.NumDrafts, int32(k))
		p.Temperature = append(p.Temperature, 0)
		p.TopP = append(p.TopP, 0)
		p.TopK = append(p.TopK, 0)
		p.MinP = append(p.MinP, 0)
		p.Seed = append(p.Seed, 0)
		p.Logprobs = append(p.Logprobs, -1)
		for j := 0; j < n[i]+k; j++ {
			pos := s.Computed + j
			if j < n[i] {
				p.Tokens = append(p.Tokens, s.Tokens[pos])
			} else {
				p.Tokens = append(p.Tokens, s.Drafts[j-n[i]])
			}
			p.Positions = append(p.Positions, int32(pos))
			if all || j >= n[i]-1 {
				p.LogitsIndices = append(p.LogitsIndices, int32(len(p.Tokens)-1))
			}
		}
		for g, spec := range specs {
			gp := &p.Groups[g]
			table := pool.PageTable(s.ID, g)
			for j := 0; j < n[i]+k; j++ {
				gp.SlotMapping = append(gp.SlotMapping, slot(spec, table, bt, s.Computed+j))
			}
			gp.PageTable = append(gp.PageTable, table...)
			gp.PageTableStart = append(gp.PageTableStart, int32(len(gp.PageTable)))
			if spec.Kind == kvslab.Recurrent {
				gp.StatePage = append(gp.StatePage, pool.StatePage(s.ID, g))
			}
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

// slot is the cache slot of the token at pos in a group (see Plan).
func slot(spec kvslab.GroupSpec, table []kvslab.PageID, bt, pos int) int64 {
	page := int64(table[pos/bt])
	switch spec.Kind {
	case kvslab.Compressed:
		return page*int64(bt/spec.Ratio) + int64(pos%bt/spec.Ratio)
	case kvslab.Recurrent:
		return engine.NoSlot
	}
	return page*int64(bt) + int64(pos%bt)
}

// Settle applies a runner's verdict on the drafts the last Plan fed for s, as the engine
// does: accepted are the tokens the runner returned for s (the drafts it verified, then
// the token it sampled after them). The accepted drafts join s's computed tokens, the
// rejected ones are truncated from the pool, and every accepted token is appended to
// s.Tokens. It clears s.Drafts.
func Settle(t testing.TB, pool *kvslab.Pool, s *Seq, accepted []int32) {
	t.Helper()
	k := len(s.Drafts)
	if len(accepted) < 1 || len(accepted) > k+1 {
		t.Fatalf("runnertest.Settle: %d accepted tokens for %d drafts", len(accepted), k)
	}
	for j, tok := range accepted[:len(accepted)-1] {
		if tok != s.Drafts[j] {
			t.Fatalf("runnertest.Settle: accepted token %d is %d, the draft was %d", j, tok, s.Drafts[j])
		}
	}
	a := len(accepted)
	s.Computed += a - 1
	if reject := k - (a - 1); reject > 0 {
		if err := pool.Truncate(s.ID, reject); err != nil {
			t.Fatal(err)
		}
	}
	s.Tokens = append(s.Tokens, accepted...)
	s.Drafts = nil
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

// MaxAbsDiff returns the largest |got[i] − want[i]| and its index; NaN counts as infinite,
// and slices of different lengths as infinitely apart.
func MaxAbsDiff(got, want []float32) (float64, int) {
	if len(got) != len(want) {
		return math.Inf(1), 0
	}
	worst, at := 0.0, 0
	for i := range got {
		d := math.Abs(float64(got[i]) - float64(want[i]))
		if math.IsNaN(d) {
			d = math.Inf(1)
		}
		if d > worst {
			worst, at = d, i
		}
	}
	return worst, at
}
