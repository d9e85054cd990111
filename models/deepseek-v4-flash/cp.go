package deepseekv4flash

import (
	"errors"
	"fmt"
	"math"

	"github.com/resin-llm/resin/core/cpurunner"
	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/dist/cp"
	"github.com/resin-llm/resin/core/dist/lockstep"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
)

// Prefill context parallelism (CP) for this model, on the CPU. Rank 0 runs the engine and
// holds the only pool. A plan that is one sequence with more than one new token and no
// drafts is split across the cp group when it is a prompt's first plan, or when it
// continues the prompt the other ranks hold (CPRank.Splits): each rank runs the model's
// layers on its contiguous chunk of the new tokens (cp.Chunk), its own positions.
//
// Unlike a dense model's attention, this model's is not a function of the keys alone: a
// query reads the sliding window's K=V rows and the compressed entries, which the
// compressors pool from every token's projections in order, and (CSA) the indexer's
// compressed keys, so each layer all-gathers the KV side of the chunks' rows (the K=V
// rows and the compressor's and the indexer's kv and gate projections, attnProj), and
// every rank writes all of them into its own copy of the sequence's state, as a single
// rank would, before its queries attend. That state is rank 0's pool (the plan's pages)
// and, on the others, a state in Go memory that they keep for the next chunk of the same
// prompt: a later chunk (the engine splitting a long prompt under --max-batch-tokens)
// splits again, sending nothing but the new chunks' KV side. The query side, the output
// projection and the MoE are each rank's own rows. The ranks' logits rows are
// all-gathered to rank 0.
//
// Every other plan (decode, several sequences, drafts, a prompt resumed from the prefix
// cache, a prompt whose state the other ranks do not hold) runs on rank 0 alone, on its
// pool, which always holds the whole context. The other ranks hold one prompt's state at
// most, dropped with its last chunk (or when a step fails or another prompt starts).

// CPRank is one rank of a cp group: its runner (rank 0's bound to the engine's pool; the
// others' never bound), its data communicator, and the prompt the other ranks hold.
type CPRank struct {
	r *Runner
	c dist.Communicator

	heldReq uint64    // the prompt the other ranks hold the state of (held: one is)
	heldLen int32     // its tokens
	held    bool      //
	state   *SeqState // ranks > 0: that prompt's state
	splits  int       // the split plans this rank has run
}

// NewCPRank makes r rank c.Rank() of a cp group over c. r must be a plain runner (no MTP
// drafts, no DSpark); rank 0's must be bound to the engine's pool.
func NewCPRank(r *Runner, c dist.Communicator) (*CPRank, error) {
	if r.drafts > 0 || r.dspark != nil {
		return nil, fmt.Errorf("%s: prefill CP does not draft (MTP or DSpark)", Name)
	}
	if c.Rank() == 0 && r.kv == nil {
		return nil, fmt.Errorf("%s: cp rank 0 is not bound to a pool", Name)
	}
	return &CPRank{r: r, c: c}, nil
}

// Splits reports whether rank 0 runs p over the group: one sequence with more than one
// new token and no drafts, which starts a prompt (no token computed) or continues the
// prompt the other ranks hold at its length. Rank 0's answer is the one that counts.
func (cr *CPRank) Splits(p *engine.BatchPlan) bool {
	if p.NumSeqs() != 1 || p.NumTokens() < 2 || len(p.Positions) != p.NumTokens() || len(p.Computed) != 1 {
		return false
	}
	if len(p.NumDrafts) > 0 && p.NumDrafts[0] > 0 {
		return false
	}
	return p.Computed[0] == 0 || (cr.held && cr.heldReq == p.ReqIDs[0] && cr.heldLen == p.Computed[0])
}

// Check is rank 0's refusal of a plan before it is broadcast (Runner.CheckPlan).
func (cr *CPRank) Check(p *engine.BatchPlan, logits []float32) error {
	return cr.r.CheckPlan(p, logits)
}

// Step runs p on this rank: its chunk when p splits (every rank calling it with the same
// plan), else, on rank 0, the whole plan on its pool.
func (cr *CPRank) Step(p *engine.BatchPlan, logits []float32) error {
	rank := cr.c.Rank()
	if rank == 0 && !cr.Splits(p) {
		return cr.r.forward(p, logits)
	}
	err := cr.split(p, logits)
	cr.splits++
	end := int(p.Computed[0]) + p.NumTokens()
	last := len(p.LogitsIndices) > 0 // a chunk that samples ends its prompt, unless the plan says where it ends
	if len(p.PromptLen) == 1 {
		last = end >= int(p.PromptLen[0])
	}
	var refused refusedError
	switch {
	case errors.As(err, &refused) && rank > 0:
		// Every rank knows the step failed, and rank 0 reports it: this one follows on.
		cr.held, cr.state = false, nil
		return nil
	case err != nil || last:
		cr.held, cr.state = false, nil
	default:
		cr.held, cr.heldReq, cr.heldLen = true, p.ReqIDs[0], p.Computed[0]+int32(p.NumTokens())
	}
	return err
}

// split runs this rank's chunk of split plan p.
func (cr *CPRank) split(p *engine.BatchPlan, logits []float32) error {
	rank, size := cr.c.Rank(), cr.c.Size()
	n := p.NumTokens()
	lo, hi := cp.Chunk(n, rank, size)
	mine, err := cp.LocalRows(p, lo, hi)
	if err != nil {
		return err
	}
	var st *SeqState
	var ferr error
	switch {
	case rank == 0:
		st, ferr = cr.r.kv.bind(p, 0)
	case p.Computed[0] == 0:
		st = cr.r.Model.NewSeqState()
	case cr.held && cr.heldReq == p.ReqIDs[0] && cr.state != nil && cr.state.Len == int(p.Computed[0]):
		st = cr.state
	default:
		ferr = fmt.Errorf("step %d continues request %d at %d tokens, and this rank holds no state of it", p.Step, p.ReqIDs[0], p.Computed[0])
	}
	// Every rank says whether it can run its chunk before the layers' exchanges, so a rank
	// that cannot fails every rank's step at once, with its reason.
	status, err := cr.c.AllGatherV(errBytes(ferr))
	if err != nil {
		return fmt.Errorf("cp rank %d: step %d: %w", rank, p.Step, err)
	}
	for q, m := range status {
		if len(m) > 0 {
			return refusedError{fmt.Errorf("cp rank %d: step %d: %s", q, p.Step, m)}
		}
	}
	part, ferr := cr.r.Model.forwardCP(cr.c, st, p.Tokens, lo, hi, mine)
	if rank > 0 {
		cr.state = st
	}
	return cp.GatherLogits(cr.c, p, cr.r.Model.Config.VocabSize, part, ferr, logits)
}

// refusedError is a split step that some rank could not start, which every rank knew
// before the layers ran: the group stays whole.
type refusedError struct{ error }

func (e refusedError) Unwrap() error { return e.error }

// errBytes is err's message, or nothing for nil.
func errBytes(err error) []byte {
	if err == nil {
		return nil
	}
	return []byte(err.Error())
}

// LockstepRank is cr as a rank of core/dist/lockstep's group: rank 0 broadcasts the plans
// that split (checked first) and runs the others alone.
func (cr *CPRank) LockstepRank() lockstep.Rank {
	lr := lockstep.Rank{Forward: cr.Step, Vocab: cr.r.Model.Config.VocabSize}
	if cr.c.Rank() == 0 {
		lr.Check, lr.Broadcast = cr.Check, cr.Splits
	}
	return lr
}

// forwardCP runs this rank's tokens [lo, hi) of a split plan's tokens, which continue st
// (a rank's copy of the sequence's state) at st.Len, and returns the logits of its rows
// rows (counted from lo). Every rank of comm calls it with the same tokens, a rank with no
// tokens too: each layer's attention exchanges the KV side (attentionCP).
func (m *Model) forwardCP(comm dist.Communicator, st *SeqState, tokens []int32, lo, hi int, rows []int32) ([]float32, error) {
	c, w := m.Config, m.W
	if st == nil || len(st.Layers) != c.NumHiddenLayers {
		return nil, errors.New("forward: a state not of this model")
	}
	n := len(tokens)
	pos := make([]int32, n)
	for i, t := range tokens {
		if t < 0 || int(t) >= c.VocabSize {
			return nil, fmt.Errorf("forward: token id %d outside the vocabulary [0, %d)", t, c.VocabSize)
		}
		if pos[i] = int32(st.Len + i); int(pos[i]) >= m.maxContext {
			return nil, fmt.Errorf("forward: position %d outside the context of %d tokens", pos[i], m.maxContext)
		}
	}
	own := tokens[lo:hi]
	streams, err := m.embedStreams(own)
	if err != nil {
		return nil, err
	}
	for li := range w.Layers {
		l, kind, ls := &w.Layers[li], c.LayerTypes[li], &st.Layers[li]
		streams, err = m.blockWith(l, c.MLPLayerTypes[li], streams, own, func(x []float32) ([]float32, error) {
			return m.attentionCP(comm, l, kind, x, ls, pos, lo, hi)
		})
		if err != nil {
			return nil, fmt.Errorf("forward: layer %d: %w", li, err)
		}
	}
	st.Len += n
	if len(rows) == 0 {
		return nil, nil
	}
	row := c.HCMult * c.HiddenSize
	picked := make([]float32, len(rows)*row)
	for j, r := range rows {
		if r < 0 || int(r) >= hi-lo {
			return nil, fmt.Errorf("forward: logits row %d outside this rank's %d rows", r, hi-lo)
		}
		copy(picked[j*row:(j+1)*row], streams[int(r)*row:(int(r)+1)*row])
	}
	return m.head(picked, len(rows), w.HCFn, w.HCBase, w.HCScale, w.Norm)
}

// attentionCP is attention for this rank's rows [lo, hi) of one sequence's new tokens at
// positions pos (all of them, every rank's): its own projections, the KV side of every
// rank's rows all-gathered (gatherKVSide) and written into st in token order, then its
// own queries attended and projected out.
func (m *Model) attentionCP(comm dist.Communicator, l *Layer, kind string, x []float32, st *LayerState, pos []int32, lo, hi int) ([]float32, error) {
	c := m.Config
	d, nh := c.HeadDim, m.par.heads
	own := pos[lo:hi]
	a, rot, err := m.attnProject(l, kind, x, own)
	if err != nil {
		return nil, err
	}
	all, err := gatherKVSide(comm, &a, m.kvSideWidths(l), len(pos))
	if err != nil {
		return nil, err
	}
	m.attnStore(l, st, &all, 0, pos)
	out := make([]float32, len(own)*nh*d)
	m.attendSeq(l, kind, st, a.q, own, out, a.iq, a.iw, 0)
	m.forgetWindow(st, pos[len(pos)-1])
	return m.attnOut(l, out, own, rot)
}

// gatherKVSide all-gathers the KV side of every rank's rows of a (kv, ckv, cgate, ikv,
// igate; the layer's widths of a row of each, 0 for those it has not) and returns it for
// all n rows, in rank order (the ranks' chunks are contiguous, in order).
func gatherKVSide(comm dist.Communicator, a *attnProj, widths [5]int, n int) (attnProj, error) {
	mine := []*[]float32{&a.kv, &a.ckv, &a.cgate, &a.ikv, &a.igate}
	row := 0
	for _, w := range widths {
		row += w
	}
	var msg []byte
	for _, f := range mine {
		msg = append(msg, dist.F32Bytes(*f)...)
	}
	got, err := comm.AllGatherV(msg)
	if err != nil {
		return attnProj{}, fmt.Errorf("cp: the KV side: %w", err)
	}
	var all attnProj
	fields := []*[]float32{&all.kv, &all.ckv, &all.cgate, &all.ikv, &all.igate}
	for i, w := range widths {
		*fields[i] = make([]float32, 0, n*w)
	}
	total := 0
	for r, m := range got {
		if len(m)%(4*row) != 0 {
			return attnProj{}, fmt.Errorf("cp: rank %d sent %d bytes of the KV side, not rows of %d floats", r, len(m), row)
		}
		t := len(m) / (4 * row)
		total += t
		if total > n {
			return attnProj{}, fmt.Errorf("cp: the ranks sent the KV side of more than the plan's %d tokens", n)
		}
		at := 0
		for i, w := range widths {
			*fields[i] = append(*fields[i], asF32(m[at:at+4*t*w])...)
			at += 4 * t * w
		}
	}
	if total != n {
		return attnProj{}, fmt.Errorf("cp: the ranks sent the KV side of %d tokens, the plan has %d", total, n)
	}
	return all, nil
}

// kvSideWidths is the width of a row of each of attnProj's KV-side fields on layer l.
func (m *Model) kvSideWidths(l *Layer) [5]int {
	c := m.Config
	w := [5]int{c.HeadDim}
	if l.Compressor != nil {
		cw := compressorWidth(l, c.HiddenSize)
		w[1], w[2] = cw, cw
	}
	if l.Indexer != nil {
		w[3], w[4] = 2*c.IndexHeadDim, 2*c.IndexHeadDim
	}
	return w
}

// sibling is another Model on m's weights, in m's form and part of a layout, with its
// own scratch (a rank of an in-process group).
func (m *Model) sibling() *Model {
	c := m.Config
	return &Model{
		Config: c, W: m.W, maxContext: m.maxContext, par: m.par, dtype: m.dtype, headW: m.headW,
		main: c.NewRotary("main", c.HeadDim), compress: c.NewRotary("compress", c.HeadDim),
		MinTopKMargin: math.Inf(1),
	}
}

// OpenCPInProcess opens the model in dir (Load's directory) with prefill CP over size
// ranks of this process: a Model each (its own scratch) on one set of weights, rank 0's
// runner on a pool of cacheBytes bytes, for the engine. o bounds each collective.
func OpenCPInProcess(dir string, opts Options, size int, cacheBytes int64, o dist.Options) (*Group, *kvslab.Pool, error) {
	if size < 1 {
		return nil, nil, fmt.Errorf("%s: --cp %d: want 1 or more ranks", Name, size)
	}
	if opts.Drafts > 0 {
		return nil, nil, fmt.Errorf("%s: prefill CP does not draft: not with %d speculative tokens", Name, opts.Drafts)
	}
	r0, err := Load(dir, opts)
	if err != nil {
		return nil, nil, err
	}
	pool, err := r0.NewPool(cacheBytes)
	if err != nil {
		return nil, nil, err
	}
	m0 := r0.Model
	var lead *CPRank
	g, err := lockstep.StartInProcess(size, o, func(rank int, data dist.Communicator) (lockstep.Rank, error) {
		r := r0
		if rank > 0 {
			r = NewRunner(m0.sibling(), opts.PageTokens)
		}
		cr, err := NewCPRank(r, data)
		if err != nil {
			return lockstep.Rank{}, err
		}
		if rank == 0 {
			lead = cr
		}
		return cr.LockstepRank(), nil
	})
	if err != nil {
		return nil, nil, err
	}
	return &Group{Runner: cpurunner.New(r0.Info(), g.Leader()), ranks: g, cp: lead}, pool, nil
}
