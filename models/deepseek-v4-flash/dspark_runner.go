package deepseekv4flash

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"

	"github.com/resin-llm/resin/core/cpurunner"
	"github.com/resin-llm/resin/core/dspark"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
)

// DSparkGroupName names the drafter's context group in the pool.
const DSparkGroupName = "dspark"

// DSparkCacheGroup is the kvslab group of the drafter's context: sliding-window, one layer
// per stage, a token's entry its context row (head_dim float32) for that stage, the window
// the main layers'. A token's row depends on the tokens up to it only, so the prefix cache
// keeps and restores it with the target's state.
func DSparkCacheGroup(c *Config, d *DSparkConfig, pageTokens int) kvslab.GroupSpec {
	return kvslab.GroupSpec{
		Name: DSparkGroupName, Kind: kvslab.SlidingWindow, Layers: d.Stages,
		BytesPerToken: c.HeadDim * 4, PageTokens: pageTokens, Window: max(c.SlidingWindow, pageTokens),
	}
}

// dsparkSampler is a runner's forward with a DSpark drafter as core/cpurunner's
// DraftSampler: each step taps the features of every row, stores the context rows of the
// rows the step kept in the pool's drafter group, and proposes the next block of every
// sequence that got a token. The main model's state is undone for rejected drafts by the
// undo log, recorded as the forward writes (recordDrafts), so a block may hold more drafts
// than a compression ratio.
type dsparkSampler struct {
	r         *Runner
	d         *DSpark
	maxDrafts int
	threshold float32
	trace     func(dspark.TraceEntry)
	tap       dspark.FeatureTap
	props     map[uint64]*dsparkProposal
}

// dsparkProposal is a request's last proposal and its anchor's position.
type dsparkProposal struct {
	p      *dspark.Proposal
	anchor int
}

var _ cpurunner.DraftSampler = (*dsparkSampler)(nil)

// UseDSpark makes the runner draft with d, at most maxDrafts drafts per block (≤ 0 or
// more than the block: the block size), cut by confidence at threshold (0: full blocks). Its
// pool then ends with the drafter's group (DSparkCacheGroup): call it before NewPool or
// Bind. trace, when set, is called once per verification per sequence.
func (r *Runner) UseDSpark(d *DSpark, maxDrafts int, threshold float32, trace func(dspark.TraceEntry)) error {
	switch {
	case r.kv != nil || r.dspark != nil:
		return fmt.Errorf("%s: UseDSpark after Bind or a first UseDSpark: the pool would lack the drafter's group", Name)
	case r.drafts > 0:
		return fmt.Errorf("%s: UseDSpark on a runner that drafts with the MTP head", Name)
	case d.m != r.Model:
		return fmt.Errorf("%s: UseDSpark with a drafter built for another model", Name)
	case threshold < 0 || threshold > 1 || math.IsNaN(float64(threshold)):
		return fmt.Errorf("%s: DSpark confidence threshold %g is not in [0, 1]", Name, threshold)
	}
	if maxDrafts <= 0 || maxDrafts > d.Config.BlockSize {
		maxDrafts = d.Config.BlockSize
	}
	s := &dsparkSampler{r: r, d: d, maxDrafts: maxDrafts, threshold: threshold, trace: trace, props: map[uint64]*dsparkProposal{}}
	r.dspark = s
	r.Runner = cpurunner.New(r.info(), s)
	return nil
}

// DSparkMaxDrafts is the most drafts a block proposes (0 without UseDSpark).
func (r *Runner) DSparkMaxDrafts() int {
	if r.dspark == nil {
		return 0
	}
	return r.dspark.maxDrafts
}

func (s *dsparkSampler) MaxDrafts() int { return s.maxDrafts }

// Forward runs the target over p, tapping the features of every row.
func (s *dsparkSampler) Forward(p *engine.BatchPlan, logits []float32) error {
	for _, rel := range p.Released {
		delete(s.props, rel.ReqID)
	}
	n := len(p.Tokens)
	s.tap.LayerIDs, s.tap.Hidden = s.d.Config.TargetLayerIDs, s.r.Model.Config.HiddenSize
	s.tap.Rows = s.tap.Rows[:0]
	for i := range n {
		s.tap.Rows = append(s.tap.Rows, int32(i))
	}
	s.tap.Features = grow(s.tap.Features, n*s.d.FeatureDim())
	return s.r.forwardTap(p, logits, &s.tap)
}

// contextRows is sequence i's draft context in the pool: per stage, its rows by position.
func (s *dsparkSampler) contextRows(p *engine.BatchPlan, i int) []Rows {
	kv, g := s.r.kv, s.r.dsparkGroup
	spec := kv.pool.Groups()[g]
	pages := p.PageTableOf(g, i)
	per := int(spec.PageBytes() / int64(spec.Layers) / 4)
	hd := s.r.Model.Config.HeadDim
	rows := make([]Rows, spec.Layers)
	for l := range rows {
		rows[l] = &pagedRows{kv: kv, g: g, pages: pages, perPage: kv.pt, layerOff: l * per, stride: hd, dim: hd}
	}
	return rows
}

// Draft undoes the rejected drafts' writes to the main model's state, stores the context
// rows of the positions each sequence kept, and proposes the next blocks.
func (s *dsparkSampler) Draft(p *engine.BatchPlan, res *engine.StepResult) error {
	r, d := s.r, s.d
	F, hd := d.FeatureDim(), r.Model.Config.HeadDim
	var seqs []BlockInput
	var drafting, limit []int
	tok := 0
	for i, id := range p.ReqIDs {
		at, q0 := int(p.Computed[i]), int(p.QueryStart[i])
		n, k, a := int(p.Scheduled[i]), int(p.NumDrafts[i]), int(res.Accepted[i])
		end := at + n // the sequence's length after the step
		if a > 0 {
			end = at + n - k + a - 1
			if a-1 < k {
				r.undo.restore(i, end)
			}
		}
		prev := s.props[id]
		delete(s.props, id)
		if prev != nil && a > 0 && s.trace != nil && n > 0 && at == prev.anchor {
			s.trace(dspark.TraceEntry{Request: id, AnchorPosition: prev.anchor, Drafts: slices.Clone(p.Tokens[q0+n-k : q0+n]),
				Accepted: a - 1, Next: res.Tokens[tok+a-1]})
		}
		ctx := s.contextRows(p, i)
		if end > at {
			rows, err := d.ContextRows(s.tap.Features[q0*F:(q0+end-at)*F], p.Positions[q0:q0+end-at])
			if err != nil {
				return fmt.Errorf("request %d: %w", id, err)
			}
			for st, kv := range rows {
				for t := range end - at {
					copy(ctx[st].Row(at+t), kv[t*hd:(t+1)*hd])
				}
			}
		}
		tok += a
		// Drafts at positions end+1.. are verified at rows end..: all inside the context.
		if nd := min(s.maxDrafts, r.Model.MaxContext()-1-end); a > 0 && nd > 0 {
			seqs = append(seqs, BlockInput{Anchor: res.Tokens[tok-1], Position: end, Context: ctx})
			drafting, limit = append(drafting, i), append(limit, nd)
		}
	}
	if len(seqs) == 0 {
		return nil
	}
	blks, err := d.Blocks(seqs)
	if err != nil {
		return err
	}
	for n, i := range drafting {
		blk, id := blks[n], p.ReqIDs[i]
		row := p.SamplingOf(i)
		smp := dspark.Sampling{Threshold: s.threshold, MaxDrafts: limit[n]}
		if row.Temperature > 0 && row.TopK != 1 {
			smp.Temperature = row.Temperature
			smp.Uniforms = make([]float64, d.Config.BlockSize)
			for j := range smp.Uniforms { // slot j drafts position P+1+j
				smp.Uniforms[j] = engine.DraftUniform(row.Seed, blk.Position+1+j)
			}
		}
		prop, err := d.Propose(blk, smp)
		if err != nil {
			return fmt.Errorf("request %d: %w", id, err)
		}
		if r.forceDraft != nil && smp.Temperature == 0 { // tests: drafts chosen for them
			v := r.Model.Config.VocabSize
			for j := range prop.Drafts {
				prop.Drafts[j] = r.forceDraft(int(p.PromptLen[i]), blk.Position+1+j, blk.Logits[j*v:(j+1)*v])
			}
		}
		s.props[id] = &dsparkProposal{p: prop, anchor: blk.Position}
		res.NumNextDrafts[i] = int32(len(prop.Drafts))
		res.Drafts = append(res.Drafts, prop.Drafts...)
	}
	return nil
}

// DraftDistribution returns q of draft j of p's sequence i, from its last proposal.
func (s *dsparkSampler) DraftDistribution(p *engine.BatchPlan, i, j int) ([]float32, error) {
	pr := s.props[p.ReqIDs[i]]
	if pr == nil || j >= len(pr.p.Drafts) {
		return nil, fmt.Errorf("dspark: no draft %d proposed for request %d", j, p.ReqIDs[i])
	}
	fed := p.Tokens[int(p.QueryStart[i+1])-int(p.NumDrafts[i])+j]
	if fed != pr.p.Drafts[j] {
		return nil, fmt.Errorf("dspark: request %d feeds draft %d as token %d, proposed %d", p.ReqIDs[i], j, fed, pr.p.Drafts[j])
	}
	v := s.r.Model.Config.VocabSize
	return pr.p.Q[j*v : (j+1)*v], nil
}

// RandomDSparkStages returns seeded random drafter stages for c and d, initialised as
// RandomWeights initialises the main model's tensors of the same kinds.
func RandomDSparkStages(c *Config, d *DSparkConfig, seed uint64) *DSparkStages {
	st := &DSparkStages{Blocks: make([]Layer, d.Stages)}
	rng := rand.New(rand.NewPCG(seed, 0x5851f42d4c957f2d))
	for _, p := range dsparkParams(c, d, st) {
		n := 1
		for _, k := range p.shape {
			n *= k
		}
		*p.dst = randomValues(rng, p, n)
	}
	return st
}

// OpenDSpark is Open for a DeepSeek-V4-Flash-DSpark checkpoint drafting with its own
// stages (UseDSpark: drafts per block, the confidence cut, trace): the model binary's
// cli.DSparkOpener. More drafts than a block holds are refused.
func OpenDSpark(dir string, cacheBytes int64, drafts int, confidence float32, trace func(dspark.TraceEntry)) (engine.Runner, *kvslab.Pool, error) {
	r, err := Load(dir, Options{DSpark: &DSparkOptions{MaxDrafts: drafts, Confidence: confidence, Trace: trace}})
	if err != nil {
		return nil, nil, err
	}
	if n := r.DSparkMaxDrafts(); drafts > n {
		return nil, nil, fmt.Errorf("%d drafts per block: the DSpark drafter in %s proposes at most its block size, %d", drafts, dir, n)
	}
	pool, err := r.NewPool(cacheBytes)
	if err != nil {
		return nil, nil, err
	}
	return r, pool, nil
}

// recordDrafts is saveDrafts for any number of draft positions [from, to) of plan
// sequence seq: the window rows are saved now (one per position), the compressors'
// buffers and entries as the forward overwrites them (CompressorState.BeforeWrite), so
// that restoring the rejected positions newest first is exact even when several of them
// share a window slot or close windows (more drafts than a compression ratio less one).
func (u *undoLog) recordDrafts(seq int, st *SeqState, from, to int) {
	for q := from; q < to; q++ {
		for li := range st.Layers {
			u.save(seq, q, st.Layers[li].Window.Row(q))
		}
	}
	hook := func(pos int, dst []float32) {
		if pos >= from {
			u.save(seq, pos, dst)
		}
	}
	for li := range st.Layers {
		for _, cs := range []*CompressorState{st.Layers[li].Compressor, st.Layers[li].Indexer} {
			if cs != nil {
				cs.BeforeWrite = hook
			}
		}
	}
}
