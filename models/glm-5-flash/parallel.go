package glm5flash

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"

	"github.com/resin-llm/resin/core/cpurunner"
	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/dist/ep"
	"github.com/resin-llm/resin/core/dist/lockstep"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/core/weights"
)

// Dispatch is how expert parallelism moves a layer's tokens to the experts' ranks and
// their outputs back.
type Dispatch int

const (
	// DispatchGather: every rank holds every token already (the attention is replicated),
	// runs its experts on the tokens routed to them, and the partial sums (rank 0's with
	// the shared experts) are combined by a reduce-scatter-v and an all-gather-v
	// (ep.CombineReplicated).
	DispatchGather Dispatch = iota
	// DispatchAllToAll: each rank sends its share of the (token, route) rows to the
	// experts' ranks and gets their outputs back (ep.AllToAll, all-to-all-v both ways),
	// then the shares are all-gathered.
	DispatchAllToAll
)

// Layout is a rank's parallel layout of the text model, on the CPU reference forward.
// EP ranks split the routed experts in contiguous ranges (ep.Layer.Range: the last ranks
// may hold fewer, or none); everything else is replicated and every rank runs every
// token. TP is not implemented for this model yet (Check refuses it). The MTP layer is
// not split (a parallel runner does not draft).
type Layout struct {
	TP, EP   int
	Dispatch Dispatch
}

// Size returns the ranks of the layout.
func (l Layout) Size() int { return max(l.TP, 1) * max(l.EP, 1) }

// Check refuses a layout the model does not run.
func (l Layout) Check(c *TextConfig) error {
	switch {
	case l.TP < 0 || l.EP < 0:
		return fmt.Errorf("%s: layout tp=%d ep=%d", Name, l.TP, l.EP)
	case l.TP > 1:
		return fmt.Errorf("%s: tp=%d: tensor parallelism is not implemented for this model yet", Name, l.TP)
	case l.EP > c.NRoutedExperts:
		return fmt.Errorf("%s: ep=%d for %d routed experts", Name, l.EP, c.NRoutedExperts)
	case l.Dispatch != DispatchGather && l.Dispatch != DispatchAllToAll:
		return fmt.Errorf("%s: dispatch %d", Name, l.Dispatch)
	}
	return nil
}

// parallel is what a TextModel holds of its layout; the zero value is the whole model on
// one rank (comm nil).
type parallel struct {
	comm         dist.Communicator
	rank, ep     int
	dispatch     Dispatch
	expLo, expHi int // routed experts held
}

// experts returns the routed experts m holds.
func (m *TextModel) experts() (lo, hi int) {
	if m.par.comm == nil {
		return 0, m.Config.NRoutedExperts
	}
	return m.par.expLo, m.par.expHi
}

func rankPart(c *TextConfig, l Layout, rank int) parallel {
	p := parallel{rank: rank, ep: max(l.EP, 1), dispatch: l.Dispatch, expHi: c.NRoutedExperts}
	if p.ep > 1 {
		p.expLo, p.expHi = ep.Layer{Experts: c.NRoutedExperts}.Range(rank, p.ep)
	}
	return p
}

// NewRankModel returns rank comm.Rank() of layout l: w must be that rank's weights
// (ShardTextWeights), and every collective of its forward runs on comm, whose ranks run
// the same plans.
func NewRankModel(c *TextConfig, w *TextWeights, l Layout, comm dist.Communicator) (*TextModel, error) {
	if err := l.Check(c); err != nil {
		return nil, err
	}
	if comm.Size() != l.Size() {
		return nil, fmt.Errorf("%s: layout of %d ranks on a group of %d", Name, l.Size(), comm.Size())
	}
	p := rankPart(c, l, comm.Rank())
	p.comm = comm
	per := 2 * c.MoEIntermediateSize * c.HiddenSize
	for i, ly := range w.layers {
		if ly.moe != nil && len(ly.moe.gateUp) != (p.expHi-p.expLo)*per {
			return nil, fmt.Errorf("%s: rank %d: layer %d holds %d experts, want [%d, %d)", Name, p.rank, i, len(ly.moe.gateUp)/per, p.expLo, p.expHi)
		}
	}
	return &TextModel{Config: c, W: w, par: p}, nil
}

// ShardTextWeights cuts rank's part of the whole model's weights w for layout l (the
// routed experts copied: w may be dropped afterwards). The MTP layer is left out.
func ShardTextWeights(c *TextConfig, w *TextWeights, l Layout, rank int) (*TextWeights, error) {
	if err := l.Check(c); err != nil {
		return nil, err
	}
	if rank < 0 || rank >= l.Size() {
		return nil, fmt.Errorf("%s: rank %d of a layout of %d", Name, rank, l.Size())
	}
	p := rankPart(c, l, rank)
	return p.cut(c, w, 0), nil
}

// cut returns p's slices of w, whose routed experts start at the model's expert lo.
func (p *parallel) cut(c *TextConfig, w *TextWeights, lo int) *TextWeights {
	D, F := c.HiddenSize, c.MoEIntermediateSize
	out := &TextWeights{embed: w.embed, norm: w.norm, lmHead: w.lmHead, layers: slices.Clone(w.layers)}
	for i := range out.layers {
		ly := &out.layers[i]
		if ly.moe == nil {
			continue
		}
		mw := *ly.moe
		mw.gateUp = slices.Clone(mw.gateUp[(p.expLo-lo)*2*F*D : (p.expHi-lo)*2*F*D])
		mw.down = slices.Clone(mw.down[(p.expLo-lo)*D*F : (p.expHi-lo)*D*F])
		ly.moe = &mw
	}
	return out
}

// loadRankWeights reads the config in dir and rank's weights of layout l: its shard of
// the safetensors there (only its experts' per-expert tensors read), or of the seeded
// random weights of the config (whole, when set: built once for an in-process group).
func loadRankWeights(dir string, seed uint64, l Layout, rank int, whole *TextWeights) (*TextConfig, *TextWeights, error) {
	c, err := LoadTextConfig(dir)
	if err != nil {
		return nil, nil, err
	}
	if err := l.Check(c); err != nil {
		return nil, nil, err
	}
	p := rankPart(c, l, rank)
	ck, err := weights.Open(dir)
	switch {
	case err == nil:
		defer ck.Close()
		var src tensorSource = ck
		if c.Quant != nil {
			src = dequantSource{ck, c.Quant}
		}
		w, err := loadTextShard(src, c, &[2]int{p.expLo, p.expHi})
		if err != nil {
			return nil, nil, fmt.Errorf("load %s: %w", dir, err)
		}
		return c, p.cut(c, w, p.expLo), nil
	case !errors.Is(err, weights.ErrNotFound):
		return nil, nil, fmt.Errorf("load %s: %w", dir, err)
	}
	if whole == nil {
		if whole, err = randomWeights(dir, c, seed); err != nil {
			return nil, nil, err
		}
	}
	return c, p.cut(c, whole, 0), nil
}

// randomWeights builds the seeded random weights of c (LoadText's), its memory checked.
func randomWeights(dir string, c *TextConfig, seed uint64) (*TextWeights, error) {
	if err := weights.CheckMemory(TextWeightBytes(c), "seeded random weights of "+filepath.Join(dir, "config.json")); err != nil {
		return nil, fmt.Errorf("load %s: %w (put the checkpoint's safetensors there, or shrink the config)", dir, err)
	}
	if seed == 0 {
		seed = 1
	}
	w, _, err := loadTextWeights(randomSource{rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}, c)
	return w, err
}

// RankOptions are what OpenRank and OpenInProcess take besides the layout.
type RankOptions struct {
	PageTokens, MaxContext int
	Seed                   uint64 // of the random weights (0 = 1, as LoadText)
	CacheBytes             int64  // each rank's pool (0 = 256 MiB)
}

// OpenRank opens rank comm.Rank() of layout l of the model in dir (LoadText's directory)
// with a host cache pool of its own: every rank keeps the whole cache (the attention
// state is replicated), at the page ids of rank 0's plans. Every rank of comm must run
// every plan (core/dist/lockstep; LockstepRank).
func OpenRank(dir string, o RankOptions, l Layout, comm dist.Communicator) (*TextRunner, *kvslab.Pool, error) {
	return openRank(dir, o, l, comm, nil)
}

func openRank(dir string, o RankOptions, l Layout, comm dist.Communicator, whole *TextWeights) (*TextRunner, *kvslab.Pool, error) {
	c, w, err := loadRankWeights(dir, o.Seed, l, comm.Rank(), whole)
	if err != nil {
		return nil, nil, err
	}
	m, err := NewRankModel(c, w, l, comm)
	if err != nil {
		return nil, nil, err
	}
	r := NewTextRunner(m, o.PageTokens, o.MaxContext)
	pool, err := r.NewPool(o.CacheBytes)
	if err != nil {
		return nil, nil, err
	}
	return r, pool, nil
}

// RankForward is the forward of one rank of a parallel layout, for core/dist/lockstep.
func (r *TextRunner) RankForward(p *engine.BatchPlan, logits []float32) error {
	return r.forward(p, logits)
}

// CheckPlan refuses, before any collective, what the forward would refuse of p: rank 0
// of a parallel group calls it before broadcasting p, so that no rank fails alone.
func (r *TextRunner) CheckPlan(p *engine.BatchPlan, logits []float32) error {
	if r.kv == nil {
		return cpurunner.ErrNotBound
	}
	c := r.Model.Config
	n := p.NumTokens()
	if len(p.QueryStart) != p.NumSeqs()+1 || len(p.LogitsStart) != p.NumSeqs()+1 {
		return fmt.Errorf("%s: a plan of %d sequences with %d query and %d logits starts", Name, p.NumSeqs(), len(p.QueryStart), len(p.LogitsStart))
	}
	for _, t := range p.Tokens {
		if t < 0 || int(t) >= c.VocabSize {
			return fmt.Errorf("token id %d outside the vocabulary [0, %d)", t, c.VocabSize)
		}
	}
	for i := range p.NumSeqs() {
		if _, err := r.kv.bind(p, i); err != nil {
			return err
		}
		q0, q1 := p.QueryStart[i], p.QueryStart[i+1]
		for _, row := range p.LogitsIndices[p.LogitsStart[i]:p.LogitsStart[i+1]] {
			if row < q0 || row >= q1 {
				return fmt.Errorf("logits row %d outside sequence %d's rows [%d, %d)", row, i, q0, q1)
			}
		}
	}
	if len(logits) != len(p.LogitsIndices)*c.VocabSize || n != len(p.Positions) {
		return fmt.Errorf("%s: logits of %d values for %d rows", Name, len(logits), len(p.LogitsIndices))
	}
	return nil
}

// LockstepRank is r as a rank of core/dist/lockstep's group: rank 0 checks each plan
// before it is broadcast, the others execute its CacheOps on their own pool first.
func (r *TextRunner) LockstepRank(rank int, pool *kvslab.Pool) lockstep.Rank {
	v := r.Model.Config.VocabSize
	if rank == 0 {
		return lockstep.Rank{Forward: r.RankForward, Check: r.CheckPlan, Vocab: v}
	}
	return lockstep.Rank{Forward: lockstep.WithCacheOps(pool, r.RankForward), Vocab: v}
}

// Group is the ranks of a parallel layout as goroutines of this process; its Runner is
// rank 0's, which serves the engine and broadcasts each plan to the others.
type Group struct {
	*cpurunner.Runner
	ranks *lockstep.InProcess
}

var _ engine.Runner = (*Group)(nil)

// StopRanks stops the other ranks (core/cli calls it when the engine stops).
func (g *Group) StopRanks() error { return g.ranks.Close() }

// Forward runs one plan on every rank, rank 0's logits into logits.
func (g *Group) Forward(p *engine.BatchPlan, logits []float32) error {
	return g.ranks.Forward(p, logits)
}

// OpenInProcess opens the model in dir in layout l over l.Size() ranks of this process
// (random weights built once and cut per rank; a checkpoint read per rank, each its
// shard); it returns rank 0's runner and pool, for the engine. do bounds each collective.
func OpenInProcess(dir string, o RankOptions, l Layout, do dist.Options) (*Group, *kvslab.Pool, error) {
	c, err := LoadTextConfig(dir)
	if err != nil {
		return nil, nil, err
	}
	if err := l.Check(c); err != nil {
		return nil, nil, err
	}
	var whole *TextWeights
	if ck, err := weights.Open(dir); err == nil {
		ck.Close() // each rank reads its shard
	} else if errors.Is(err, weights.ErrNotFound) {
		if whole, err = randomWeights(dir, c, o.Seed); err != nil {
			return nil, nil, err
		}
	}
	var r0 *TextRunner
	var pool0 *kvslab.Pool
	g, err := lockstep.StartInProcess(l.Size(), do, func(rank int, data dist.Communicator) (lockstep.Rank, error) {
		r, pool, err := openRank(dir, o, l, data, whole)
		if err != nil {
			return lockstep.Rank{}, err
		}
		if rank == 0 {
			r0, pool0 = r, pool
		}
		return r.LockstepRank(rank, pool), nil
	})
	if err != nil {
		return nil, nil, err
	}
	return &Group{Runner: cpurunner.New(r0.Info(), cpurunner.ForwardFunc(g.Forward)), ranks: g}, pool0, nil
}

// moeExperts adds into out ([T, D], rank 0's holding the shared experts' output) the
// routed experts' weighted outputs of every token (ids, wts: [T, K]) with the experts
// spread over the ep group, per the layout's Dispatch. run computes one held expert.
func (m *TextModel) moeExperts(x, out []float32, ids []int32, wts []float32, T int, run ep.ExpertFunc) error {
	c, p := m.Config, &m.par
	D, K := c.HiddenSize, c.NumExpertsPerTok
	if p.dispatch == DispatchAllToAll {
		lo, hi := ep.RowShare(T, p.rank, p.ep)
		layer := ep.Layer{Experts: c.NRoutedExperts, Hidden: D, TopK: K}
		mine := make([]float32, (hi-lo)*D)
		if err := ep.AllToAll(p.comm, layer, ep.Routes{X: x[lo*D : hi*D], IDs: ids[lo*K : hi*K], Weights: wts[lo*K : hi*K]}, run, mine); err != nil {
			return err
		}
		all, err := p.comm.AllGatherV(dist.F32Bytes(mine))
		if err != nil {
			return fmt.Errorf("ep: gather the shares: %w", err)
		}
		var sum []float32
		for q, b := range all {
			ql, qh := ep.RowShare(T, q, p.ep)
			if len(b) != 4*(qh-ql)*D {
				return fmt.Errorf("ep: rank %d sent %d bytes of its share, want %d", q, len(b), 4*(qh-ql)*D)
			}
			sum = append(sum, make([]float32, len(b)/4)...)
			copy(dist.F32Bytes(sum[ql*D:]), b)
		}
		for i := range out {
			out[i] += sum[i]
		}
		return nil
	}
	return ep.CombineReplicated(p.comm, out, T, D)
}
