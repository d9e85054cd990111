package dspark

import (
	"fmt"
	"slices"

	"github.com/resin-llm/resin/core/cpurunner"
	"github.com/resin-llm/resin/core/engine"
)

// TapForwarder is a target forward that can also hand over the hidden states of some of
// its rows at the drafter's tapped layers: the optional interface a target implements to
// be drafted for by DSpark. A nil tap must behave as the plain forward.
type TapForwarder interface {
	cpurunner.Forwarder
	ForwardTap(plan *engine.BatchPlan, logits []float32, tap *FeatureTap) error
}

// Speculator runs a target with a DSpark drafter on core/cpurunner: a cpurunner.Forwarder
// that is also a DraftSampler. Each step it taps the target's features for every row,
// grows each sequence's draft context by the rows the step committed (prompt tokens, the
// anchor and the accepted drafts), and proposes the next block from the token the step
// emitted. Greedy rows draft greedily; sampled rows draw their drafts at the request's
// temperature with engine.DraftUniform(seed, position) and keep q for exact verification.
//
// Bound to a pool's drafter group (Bind, CacheGroup; BindDevice for a device's pool), the
// draft context lives in the pool: the engine keeps, rolls back and restores it with the
// target's cache, so a request that starts from a prefix-cache hit or comes back after a
// preemption drafts from its first step. Unbound, it lives in the Speculator (one Context
// per request): such a request has no features for the positions it did not compute and
// proposes no drafts (its output is unchanged; it only goes without speculation).
type Speculator struct {
	Target    TapForwarder
	Drafter   *Drafter
	Threshold float32 // the confidence cut (0: full blocks)
	// Trace, when set, is called once per verification per sequence, in plan order.
	Trace func(TraceEntry)
	// BlockForward, when set, runs the blocks instead of Drafter.Blocks (a device's block
	// forward: core/gpurunner's DSparkBlocks); it must return what Drafter.Blocks does.
	BlockForward func(ctxs []*Context, anchors []int32) ([]*Block, error)
	// ProposeBlocks, when set, draws the drafts of the blocks BlockForward (or the
	// device's PagedDevice) just returned, all at once, instead of Drafter.Propose on
	// each (a device's Markov head and confidence cut: core/gpurunner's
	// DSparkBlocks.Propose); it must return what Drafter.Propose does for each block
	// under smps[i], the Proposals' Logits aside.
	ProposeBlocks func(blks []*Block, smps []Sampling) ([]*Proposal, error)
	// Released, when set, is told of each draft context the Speculator drops (its request
	// finished), so that a copy kept elsewhere (BlockForward's) can be freed.
	Released  func(*Context)
	maxDrafts int
	cache     *pagedContext // nil: the host contexts of seqState

	seqs     map[uint64]*seqState
	tap      FeatureTap
	rows     []int32 // the plan rows tapped
	firstRow []int   // per sequence, the tap's row of its first plan row; −1: not tapped

	draft   []int // the sequences proposing this step, with their contexts and anchors
	ctxs    []*Context
	anchors []int32
}

// TraceEntry is one verification of one sequence: the drafts of the block anchored at
// AnchorPosition that the target verified (those the engine fed: a prefix of the
// proposal), how many it accepted, and the token it emitted after them. Its JSON is
// `{"request": i, "anchor_position": P, "drafts": [...], "accepted": a, "next": t}`.
type TraceEntry struct {
	Request        uint64  `json:"request"`
	AnchorPosition int     `json:"anchor_position"`
	Drafts         []int32 `json:"drafts"`
	Accepted       int     `json:"accepted"`
	Next           int32   `json:"next"`
}

type seqState struct {
	ctx     *Context
	prop    *Proposal
	anchor  int  // the position of prop's anchor
	noDraft bool // features are missing for some position: this request is not drafted
}

var _ cpurunner.DraftSampler = (*Speculator)(nil)

// NewSpeculator returns a Speculator proposing at most maxDrafts drafts per block (≤ 0 or
// more than the block: the block size).
func NewSpeculator(target TapForwarder, d *Drafter, maxDrafts int, threshold float32) *Speculator {
	if maxDrafts <= 0 || maxDrafts > d.Config.BlockSize {
		maxDrafts = d.Config.BlockSize
	}
	return &Speculator{Target: target, Drafter: d, Threshold: threshold, maxDrafts: maxDrafts, seqs: map[uint64]*seqState{}}
}

// MaxDrafts is the most drafts a block proposes.
func (s *Speculator) MaxDrafts() int { return s.maxDrafts }

// Forward runs the target over plan, tapping the features of the rows of every sequence
// that drafts (not those of a request without features for its earlier positions).
func (s *Speculator) Forward(plan *engine.BatchPlan, logits []float32) error {
	for _, r := range plan.Released {
		if st := s.seqs[r.ReqID]; st != nil && s.Released != nil {
			s.Released(st.ctx)
		}
		delete(s.seqs, r.ReqID)
	}
	s.rows, s.firstRow = s.rows[:0], s.firstRow[:0]
	for i, id := range plan.ReqIDs {
		lo, hi := int(plan.QueryStart[i]), int(plan.QueryStart[i+1])
		known := 0
		if st := s.seqs[id]; s.cache != nil {
			known = int(^uint(0) >> 1) // every row: the pool holds the earlier positions
		} else if st != nil {
			if st.noDraft {
				known = -1
			} else {
				known = st.ctx.Len()
			}
		}
		if lo == hi || known < 0 || int(plan.Positions[lo]) > known {
			s.firstRow = append(s.firstRow, -1)
			continue
		}
		s.firstRow = append(s.firstRow, len(s.rows))
		for r := lo; r < hi; r++ {
			s.rows = append(s.rows, int32(r))
		}
	}
	c := s.Drafter.Config
	s.tap.LayerIDs, s.tap.Rows, s.tap.Hidden = c.TargetLayerIDs, s.rows, c.Base.HiddenSize
	s.tap.Features = grow(&s.tap.Features, len(s.rows)*c.FeatureDim())
	return s.Target.ForwardTap(plan, logits, &s.tap)
}

// Draft grows every sequence's draft context by the rows this step committed and proposes
// the next blocks, all sequences' in one Drafter.Blocks.
func (s *Speculator) Draft(plan *engine.BatchPlan, res *engine.StepResult) error {
	if s.cache != nil {
		return s.draftPaged(plan, res)
	}
	d := s.Drafter
	F := d.Config.FeatureDim()
	tok := 0
	s.draft, s.ctxs, s.anchors = s.draft[:0], s.ctxs[:0], s.anchors[:0]
	for i, id := range plan.ReqIDs {
		a := int(res.Accepted[i])
		tok += a
		st := s.seqs[id]
		if st == nil {
			st = &seqState{ctx: d.NewContext()}
			s.seqs[id] = st
		}
		lo, hi := int(plan.QueryStart[i]), int(plan.QueryStart[i+1])
		s.trace(plan, res, i, st, a, tok)
		st.prop = nil
		if a > 0 { // the rows up to the last logits row used: the anchor and accepted drafts
			hi = int(plan.LogitsIndices[int(plan.LogitsStart[i])+a-1]) + 1
		}
		if st.noDraft || lo == hi {
			continue
		}
		p0 := int(plan.Positions[lo])
		switch {
		case p0 > st.ctx.Len() || s.firstRow[i] < 0:
			st.noDraft = true // a prefix hit or a resumed request: positions without features
			continue
		case p0 < st.ctx.Len():
			if err := st.ctx.Truncate(p0); err != nil {
				return err
			}
		}
		at := s.firstRow[i] // the tap's row of the sequence's row lo
		if err := d.Extend(st.ctx, s.tap.Features[at*F:(at+hi-lo)*F], hi-lo); err != nil {
			return fmt.Errorf("request %d: %w", id, err)
		}
		if a == 0 || st.ctx.Len()+d.Config.BlockSize > d.rope.MaxPos {
			continue
		}
		s.draft = append(s.draft, i)
		s.ctxs = append(s.ctxs, st.ctx)
		s.anchors = append(s.anchors, res.Tokens[tok-1])
	}
	return s.propose(plan, res)
}

// trace reports sequence i's verification of its last proposal, if it had one (a
// accepted rows, tok the step's tokens up to its last).
func (s *Speculator) trace(plan *engine.BatchPlan, res *engine.StepResult, i int, st *seqState, a, tok int) {
	lo, hi := int(plan.QueryStart[i]), int(plan.QueryStart[i+1])
	if st.prop != nil && a > 0 && s.Trace != nil && lo < hi && int(plan.Positions[lo]) == st.anchor {
		k := int(plan.NumDrafts[i])
		s.Trace(TraceEntry{Request: plan.ReqIDs[i], AnchorPosition: st.anchor, Drafts: slices.Clone(plan.Tokens[hi-k : hi]), Accepted: a - 1, Next: res.Tokens[tok-1]})
	}
}

// propose runs the blocks of the sequences in s.draft (contexts s.ctxs, anchors
// s.anchors) together and fills their next drafts.
func (s *Speculator) propose(plan *engine.BatchPlan, res *engine.StepResult) error {
	d := s.Drafter
	if len(s.draft) == 0 {
		return nil
	}
	blocks := d.Blocks
	if s.BlockForward != nil {
		blocks = s.BlockForward
	}
	blks, err := blocks(s.ctxs, s.anchors)
	if err != nil {
		return err
	}
	return s.fill(plan, res, blks)
}

// fill draws the drafts of the sequences in s.draft from their blocks blks (in order)
// with the Markov head and the confidence cut, and fills their next drafts.
func (s *Speculator) fill(plan *engine.BatchPlan, res *engine.StepResult, blks []*Block) error {
	d := s.Drafter
	if len(blks) != len(s.draft) {
		return fmt.Errorf("dspark: %d blocks for %d drafting sequences", len(blks), len(s.draft))
	}
	smps := make([]Sampling, len(s.draft))
	for n, i := range s.draft {
		row := plan.SamplingOf(i)
		smps[n] = Sampling{Threshold: s.Threshold, MaxDrafts: s.maxDrafts}
		if row.Temperature > 0 && row.TopK != 1 {
			smps[n].Temperature = row.Temperature
			smps[n].Uniforms = make([]float64, d.Config.BlockSize)
			for j := range smps[n].Uniforms { // slot j drafts position P+1+j
				smps[n].Uniforms[j] = engine.DraftUniform(row.Seed, blks[n].Position+1+j)
			}
		}
	}
	var props []*Proposal
	if s.ProposeBlocks != nil {
		var err error
		if props, err = s.ProposeBlocks(blks, smps); err != nil {
			return err
		}
		if len(props) != len(blks) {
			return fmt.Errorf("dspark: %d proposals for %d blocks", len(props), len(blks))
		}
	}
	for n, i := range s.draft {
		blk, id := blks[n], plan.ReqIDs[i]
		var p *Proposal
		if props != nil {
			p = props[n]
		} else {
			var err error
			if p, err = d.Propose(blk, smps[n]); err != nil {
				return fmt.Errorf("request %d: %w", id, err)
			}
		}
		st := s.seqs[id]
		st.prop, st.anchor = p, blk.Position
		res.NumNextDrafts[i] = int32(len(p.Drafts))
		res.Drafts = append(res.Drafts, p.Drafts...)
	}
	return nil
}

// DraftDistribution returns q of draft j of plan's sequence i, from its last proposal.
func (s *Speculator) DraftDistribution(plan *engine.BatchPlan, i, j int) ([]float32, error) {
	st := s.seqs[plan.ReqIDs[i]]
	if st == nil || st.prop == nil || j >= len(st.prop.Drafts) {
		return nil, fmt.Errorf("dspark: no draft %d proposed for request %d", j, plan.ReqIDs[i])
	}
	fed := plan.Tokens[int(plan.QueryStart[i+1])-int(plan.NumDrafts[i])+j]
	if fed != st.prop.Drafts[j] {
		return nil, fmt.Errorf("dspark: request %d feeds draft %d as token %d, proposed %d", plan.ReqIDs[i], j, fed, st.prop.Drafts[j])
	}
	V := s.Drafter.Config.Base.VocabSize
	return st.prop.Q[j*V : (j+1)*V], nil
}
