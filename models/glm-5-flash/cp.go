package glm5flash

import (
	"errors"
	"fmt"

	"github.com/resin-llm/resin/core/cpurunner"
	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/dist/cp"
	"github.com/resin-llm/resin/core/dist/lockstep"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kernels/ref"
	"github.com/resin-llm/resin/core/kvslab"
)

// Prefill context parallelism (CP) for the text model, on the CPU, by core/dist/cp's
// Stateful protocol: rank 0 runs the engine and holds the only pool; a plan that is one
// sequence's prompt (its first plan, or a later chunk of a prompt the other ranks hold)
// is split across the cp group in contiguous chunks (cp.Chunk), each rank running the
// model's layers on its own tokens; every other plan runs on rank 0 alone.
//
// The layers exchange what their attention reads of the other ranks' tokens:
//
//   - MLA (DSA) layers all-gather the chunks' normed latents and, on layers with their own
//     indexer, the indexer's keys and gate scores. Every rank writes all of them into its
//     copy of the sequence's state (rank 0's pool; the others' a state in Go memory, kept
//     for the prompt's next chunk) and closes the pools they complete, then selects and
//     attends its own queries: exactly what one rank computes.
//   - KDA layers are a recurrence over the tokens in order, with a conv history and a
//     state checkpointed at every block end for prefix reuse (BlockEnd), both in rank 0's
//     pool. Each rank projects its own rows (q, k, v, the decay and beta); the projections
//     are all-gathered, rank 0 runs the conv and the recurrence over every token on its
//     pool's state, exactly as one rank does (the checkpoints included), and broadcasts
//     the recurrence's output, of which each rank takes its rows for the gated norm and
//     o_proj. The recurrence itself therefore does not split; the layers' projections,
//     the MoE and the MLA attention do. (Splitting it too takes each rank's chunk from a
//     zero state and a scan of the chunks' affine maps: docs/parallelism.md.)

// CPRank is one rank of a cp group (core/dist/cp.Stateful over the text model's state).
type CPRank = cp.Stateful[*TextState]

// NewCPRank makes m rank c.Rank() of a cp group over c: rank 0 through r, a plain runner
// (no MTP drafts) bound to the engine's pool; the others need only the model (r nil).
func NewCPRank(m *TextModel, r *TextRunner, c dist.Communicator) (*CPRank, error) {
	if m.par.comm != nil {
		return nil, fmt.Errorf("%s: prefill CP runs the whole model on each rank, not a tensor- or expert-parallel part", Name)
	}
	s := &CPRank{
		C: c, Vocab: m.Config.VocabSize,
		New: m.NewTextState,
		Len: func(st *TextState) int { return st.Len },
		Forward: func(st *TextState, tokens []int32, lo, hi int, rows []int32) ([]float32, error) {
			return m.forwardCP(c, st, tokens, lo, hi, rows)
		},
	}
	if c.Rank() == 0 {
		switch {
		case r == nil || r.kv == nil:
			return nil, fmt.Errorf("%s: cp rank 0 is not bound to a pool", Name)
		case r.drafts > 0:
			return nil, fmt.Errorf("%s: prefill CP does not draft (MTP)", Name)
		}
		s.Bind = func(p *engine.BatchPlan) (*TextState, error) { return r.kv.bind(p, 0) }
		s.Whole, s.Check = r.forward, r.CheckPlan
	}
	return s, nil
}

// forwardCP runs this rank's tokens [lo, hi) of a split plan's tokens, which continue st
// (this rank's copy of the sequence's state) at st.Len, and returns the logits of its
// rows (counted from lo). Every rank of comm calls it with the same tokens, a rank with
// none too: the layers exchange their attention's inputs (kdaCP, mlaCP).
func (m *TextModel) forwardCP(comm dist.Communicator, st *TextState, tokens []int32, lo, hi int, rows []int32) ([]float32, error) {
	c := m.Config
	D, hc := c.HiddenSize, c.HCMult
	if st == nil || len(st.Layers) != c.NumHiddenLayers {
		return nil, errors.New("forward: a state not of this model")
	}
	for _, t := range tokens {
		if t < 0 || int(t) >= c.VocabSize {
			return nil, fmt.Errorf("forward: token id %d outside the vocabulary [0, %d)", t, c.VocabSize)
		}
	}
	own, T, n, pos0 := tokens[lo:hi], hi-lo, len(tokens), st.Len
	x := make([]float32, T*D)
	if err := m.embed(x, own); err != nil {
		return nil, err
	}
	streams := make([]float32, T*hc*D)
	for t := range T {
		for k := range hc {
			copy(streams[(t*hc+k)*D:], x[t*D:(t+1)*D])
		}
	}
	var sel [][]int32 // the previous layer's DSA selection of this rank's queries
	for i := range m.W.layers {
		ly, ls := &m.W.layers[i], &st.Layers[i]
		var err error
		streams, err = m.hcBlock(streams, T, &ly.attnHC, ly.inNorm, func(h []float32) ([]float32, error) {
			if ly.kind == LinearAttention {
				sel = nil
				return m.kdaCP(comm, ly.kda, ls, h, n, pos0, lo, hi, st.BlockTokens)
			}
			var y []float32
			var err error
			y, sel, err = m.mlaCP(comm, ly.mla, ls, h, n, pos0, lo, hi, sel)
			return y, err
		})
		if err != nil {
			return nil, fmt.Errorf("layer %d attention: %w", i, err)
		}
		streams, err = m.hcBlock(streams, T, &ly.ffnHC, ly.postNorm, func(h []float32) ([]float32, error) {
			if ly.dense != nil {
				return m.mlp(ly.dense, h, T, D, float32(c.SwigluLimit)), nil
			}
			return m.moe(ly.moe, h, T)
		})
		if err != nil {
			return nil, fmt.Errorf("layer %d mlp: %w", i, err)
		}
	}
	st.Len += n
	if len(rows) == 0 {
		return nil, nil
	}
	// hc_head on the rows asked: the mean of the streams, the final norm, lm_head.
	hidden := make([]float32, len(rows)*D)
	for j, r := range rows {
		if r < 0 || int(r) >= T {
			return nil, fmt.Errorf("forward: logits row %d outside this rank's %d rows", r, T)
		}
		o := hidden[j*D : (j+1)*D]
		for k := range hc {
			for d := range D {
				o[d] += streams[(int(r)*hc+k)*D+d]
			}
		}
		for d := range D {
			o[d] /= float32(hc)
		}
	}
	if err := ref.RMSNorm(hidden, hidden, m.W.norm, len(rows), D, float32(c.RMSNormEps)); err != nil {
		return nil, err
	}
	return m.lmHead(hidden, len(rows))
}

// kdaCP is a KDA layer of this rank's rows [lo, hi) (x: [hi−lo, hidden]) of a split
// sequence's n new tokens at positions pos0..: the recurrence's inputs of every rank's
// rows all-gathered, the conv and the recurrence run over all of them on rank 0's state,
// its output broadcast and this rank's rows of it normed, gated and projected.
func (m *TextModel) kdaCP(comm dist.Communicator, w *kdaWeights, ls *TextLayerState, x []float32, n, pos0, lo, hi, blockTokens int) ([]float32, error) {
	c := m.Config
	_, H := m.heads()
	L := H * c.LinearHeadDim
	T := hi - lo
	mixed, g, beta := m.kdaInputs(w, x, T)
	all, err := cp.GatherRows(comm, []int{3 * L, L, H}, n, mixed, g, beta)
	if err != nil {
		return nil, fmt.Errorf("the KDA inputs: %w", err)
	}
	var o []float32
	var cerr error
	if comm.Rank() == 0 {
		o, cerr = m.kdaCore(w, ls, all[0], all[1], all[2], n, pos0, blockTokens)
	}
	// Rank 0 sends the output of every token, or nothing when its recurrence failed, so
	// the others fail on the count instead of waiting.
	got, err := comm.Broadcast(dist.F32Bytes(o), 0)
	switch {
	case cerr != nil:
		return nil, cerr
	case err != nil:
		return nil, fmt.Errorf("the KDA output: %w", err)
	case len(got) != 4*n*L:
		return nil, fmt.Errorf("the KDA output: rank 0 sent %d bytes for %d tokens of %d", len(got), n, L)
	}
	mine := make([]float32, T*L)
	copy(dist.F32Bytes(mine), got[4*lo*L:4*hi*L])
	return m.kdaOut(w, x, mine, T)
}

// mlaCP is an MLA layer of this rank's rows [lo, hi) of a split sequence's n new tokens
// at positions pos0..: the latents (and the indexer's keys and gate scores) of every
// rank's rows all-gathered and written into ls, then this rank's queries selected (or,
// on a layer sharing its indexer, prev: the previous layer's selection of them) and
// attended.
func (m *TextModel) mlaCP(comm dist.Communicator, w *mlaWeights, ls *TextLayerState, x []float32, n, pos0, lo, hi int, prev [][]int32) ([]float32, [][]int32, error) {
	c := m.Config
	T := hi - lo
	qr, q, lat, err := m.mlaProject(w, x, T)
	if err != nil {
		return nil, nil, err
	}
	widths := []int{c.KVLoraRank, 0, 0}
	var k, gs []float32
	if w.idx != nil {
		k, gs = m.indexKeys(w.idx, x, T)
		widths[1], widths[2] = c.IndexHeadDim, c.IndexHeadDim
	}
	all, err := cp.GatherRows(comm, widths, n, lat, k, gs)
	if err != nil {
		return nil, nil, fmt.Errorf("the latents: %w", err)
	}
	m.storeLatents(ls, all[0], pos0, n)
	sel := prev
	if w.idx != nil {
		m.storeIndexKeys(w.idx, ls, all[1], all[2], pos0, n)
		sel = m.indexSelect(w.idx, ls, x, qr, T, pos0+lo)
	} else if len(prev) != T {
		return nil, nil, fmt.Errorf("shared DSA layer without a preceding full indexer layer")
	}
	return m.mlaAttend(w, ls, q, sel, T), sel, nil
}

// OpenCPInProcess opens the text model in dir (LoadText's directory) with prefill CP over
// size ranks of this process, all on one model; rank 0's runner on a pool of cacheBytes
// bytes, for the engine. do bounds each collective.
func OpenCPInProcess(dir string, o RankOptions, size int, do dist.Options) (*Group, *kvslab.Pool, error) {
	if size < 1 {
		return nil, nil, fmt.Errorf("%s: --cp %d: want 1 or more ranks", Name, size)
	}
	if o.Drafts > 0 {
		return nil, nil, fmt.Errorf("%s: prefill CP does not draft: not with %d speculative tokens", Name, o.Drafts)
	}
	r0, err := LoadText(dir, o.PageTokens, o.Seed)
	if err != nil {
		return nil, nil, err
	}
	if o.MaxContext > 0 {
		r0 = NewTextRunner(r0.Model, o.PageTokens, o.MaxContext)
	}
	pool, err := r0.NewPool(o.CacheBytes)
	if err != nil {
		return nil, nil, err
	}
	var lead *CPRank
	g, err := lockstep.StartInProcess(size, do, func(rank int, data dist.Communicator) (lockstep.Rank, error) {
		cr, err := NewCPRank(r0.Model, r0, data)
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
