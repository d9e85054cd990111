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

// CPRank is one rank of a cp group (core/dist/cp.Stateful over this model's state).
type CPRank = cp.Stateful[*SeqState]

// NewCPRank makes r rank c.Rank() of a cp group over c. r must be a plain runner (no MTP
// drafts, no DSpark); rank 0's must be bound to the engine's pool.
func NewCPRank(r *Runner, c dist.Communicator) (*CPRank, error) {
	if r.drafts > 0 || r.dspark != nil {
		return nil, fmt.Errorf("%s: prefill CP does not draft (MTP or DSpark)", Name)
	}
	if c.Rank() == 0 && r.kv == nil {
		return nil, fmt.Errorf("%s: cp rank 0 is not bound to a pool", Name)
	}
	m := r.Model
	return &CPRank{
		C: c, Vocab: m.Config.VocabSize,
		Bind:  func(p *engine.BatchPlan) (*SeqState, error) { return r.kv.bind(p, 0) },
		New:   m.NewSeqState,
		Len:   func(st *SeqState) int { return st.Len },
		Whole: r.forward, Check: r.CheckPlan,
		Forward: func(st *SeqState, tokens []int32, lo, hi int, rows []int32) ([]float32, error) {
			return m.forwardCP(c, st, tokens, lo, hi, rows)
		},
	}, nil
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
// all n rows, in rank order.
func gatherKVSide(comm dist.Communicator, a *attnProj, widths [5]int, n int) (attnProj, error) {
	all, err := cp.GatherRows(comm, widths[:], n, a.kv, a.ckv, a.cgate, a.ikv, a.igate)
	if err != nil {
		return attnProj{}, fmt.Errorf("the KV side: %w", err)
	}
	return attnProj{kv: all[0], ckv: all[1], cgate: all[2], ikv: all[3], igate: all[4]}, nil
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
