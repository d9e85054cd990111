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
	"github.com/resin-llm/resin/core/dist/tp"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kernels/ref"
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

// String is the exchange's --ep-dispatch name.
func (d Dispatch) String() string {
	switch d {
	case DispatchGather:
		return "gather"
	case DispatchAllToAll:
		return "all-to-all"
	}
	return fmt.Sprintf("dispatch(%d)", int(d))
}

// Layout is a rank's parallel layout of the text model, on the CPU reference forward:
//
//   - TP ranks split the KDA heads (q/k/v, conv channels, forget and beta gates and
//     their output gate rows, o_proj columns; each rank's recurrent state holds its
//     heads), the MLA heads (q_b and kv_b rows, o_proj columns; the latent, its norm and
//     the DSA indexer replicated, as vLLM and SGLang replicate MLA's latent), the dense
//     MLPs', shared and every routed expert's intermediate columns, and the vocabulary
//     (the embedding's rows, all-reduced lookups; the lm_head's rows, all-gathered
//     logits). Each attention and MLP block ends in one all-reduce. Every rank keeps the
//     cache layout of one rank (its KDA state uses the first heads' room).
//   - EP ranks split the routed experts in contiguous ranges (ep.Layer.Range: the last
//     ranks may hold fewer, or none); everything else is replicated and every rank runs
//     every token, combined per Dispatch.
//
// TP and EP together run over max(TP, EP) ranks, the smaller dividing the larger, in
// dist.NewLayout's groups (tp groups and ep groups of consecutive ranks, tp rank = rank
// mod TP, ep rank = rank mod EP): each tp group splits the attention, the vocabulary and
// the dense and shared MLPs TP ways, and every tp group runs the same tokens (replicated,
// as SGLang's attention DP within the ep group); the routed experts (each whole) split
// over the ep group, and with EP < TP the ep groups hold the same experts (replicated)
// and each reduces its own partials. Equal sizes are SGLang's --tp N --ep N: the same
// ranks split both ways. The MTP layer's attention and MoE are split like a
// layer's (eh_proj and the norms replicated), its head by vocabulary rows like the
// lm_head, so every rank runs the drafts of every step (TextRunner.LockstepRank) and they
// come out equal on every rank.
//
// CP (GPU layouts only, NewGPULayout) makes the ep ranks split prompts too: prefill
// context parallelism over the layout's ranks, each holding its experts alone (see
// gpuCP), as the CPU's CP does over ranks of the whole model.
type Layout struct {
	TP, EP   int
	Dispatch Dispatch
	CP       bool
}

// String names the layout: "tp=T ep=E", then its dispatch when not gather and "cp"
// with CP.
func (l Layout) String() string {
	s := fmt.Sprintf("tp=%d ep=%d", max(l.TP, 1), max(l.EP, 1))
	if l.Dispatch != DispatchGather {
		s += " " + l.Dispatch.String()
	}
	if l.CP {
		s += " cp"
	}
	return s
}

// Size returns the ranks of the layout.
func (l Layout) Size() int {
	if l.TP > 1 && l.EP > 1 {
		return max(l.TP, l.EP) // the smaller's groups within the larger's
	}
	return max(l.TP, 1) * max(l.EP, 1)
}

// Check refuses a layout the model does not run.
func (l Layout) Check(c *TextConfig) error {
	tpn := max(l.TP, 1)
	switch {
	case l.TP < 0 || l.EP < 0:
		return fmt.Errorf("%s: layout tp=%d ep=%d", Name, l.TP, l.EP)
	case l.TP > 1 && l.EP > 1 && max(l.TP, l.EP)%min(l.TP, l.EP) != 0:
		return fmt.Errorf("%s: tp=%d with ep=%d: the smaller must divide the larger (they run over max(tp, ep) ranks, the smaller's groups within the larger's)", Name, l.TP, l.EP)
	case l.EP > c.NRoutedExperts:
		return fmt.Errorf("%s: ep=%d for %d routed experts", Name, l.EP, c.NRoutedExperts)
	case c.NumAttentionHeads%tpn != 0 || c.LinearNumHeads%tpn != 0 || c.IntermediateSize%tpn != 0 || c.MoEIntermediateSize%tpn != 0:
		return fmt.Errorf("%s: %d MLA heads, %d KDA heads, intermediate sizes %d and %d do not all divide by tp=%d",
			Name, c.NumAttentionHeads, c.LinearNumHeads, c.IntermediateSize, c.MoEIntermediateSize, tpn)
	case l.Dispatch != DispatchGather && l.Dispatch != DispatchAllToAll:
		return fmt.Errorf("%s: dispatch %d", Name, l.Dispatch)
	case l.CP && (l.EP < 2 || tpn > 1):
		return fmt.Errorf("%s: prefill CP over a layout splits the ep ranks' prompts: ep 2 or more, tp 1 (not tp=%d ep=%d)", Name, tpn, max(l.EP, 1))
	}
	return nil
}

// parallel is what a TextModel holds of its layout; the zero value is the whole model on
// one rank (comm nil).
type parallel struct {
	comm         dist.Communicator // every rank of the layout
	rank, tp, ep int               // rank in comm, group sizes
	// The tp and ep groups (NewRankModel: comm itself where one spans every rank; nil
	// where comm was set alone, as the GPU layout's equal sizes do: tpGroup, epGroup) and
	// this rank's place in them.
	tpComm, epComm     dist.Communicator
	tpRank, epRank     int
	dispatch           Dispatch
	expLo, expHi       int // routed experts held
	mlaHeads, kdaHeads int // held under TP
	moeInter           int // intermediate columns held of each routed expert
	vocabLo, vocabHi   int // embedding and lm_head rows held

	// DP-attention (dp.go): the ep group's ranks bring their own tokens, each padding its
	// MoE rows to dpPad (0: none) with rows routed to no expert.
	dp    bool
	dpPad int
	// dpExchanges counts the MoE exchanges run under DP-attention (DPDraft evens out a
	// step's draft rounds across the ranks by it).
	dpExchanges int
}

// experts returns the routed experts m holds.
func (m *TextModel) experts() (lo, hi int) {
	if m.par.comm == nil {
		return 0, m.Config.NRoutedExperts
	}
	return m.par.expLo, m.par.expHi
}

// tensorParallel reports whether m is a rank of a TP group.
func (m *TextModel) tensorParallel() bool { return m.par.comm != nil && m.par.tp > 1 }

// expertParallel reports whether m is a rank of an EP group.
func (m *TextModel) expertParallel() bool { return m.par.comm != nil && m.par.ep > 1 }

// heads returns the MLA and KDA heads m holds.
func (m *TextModel) heads() (mla, kda int) {
	if m.tensorParallel() {
		return m.par.mlaHeads, m.par.kdaHeads
	}
	return m.Config.NumAttentionHeads, m.Config.LinearNumHeads
}

// moeInter returns the intermediate columns m holds of each routed expert.
func (m *TextModel) moeInter() int {
	if m.par.comm != nil {
		return m.par.moeInter
	}
	return m.Config.MoEIntermediateSize
}

// allReduce sums x over the TP group (nothing otherwise).
func (m *TextModel) allReduce(x []float32, what string) error {
	if !m.tensorParallel() {
		return nil
	}
	if err := dist.AllReduceF32(m.par.tpGroup(), x); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

func rankPart(c *TextConfig, l Layout, rank int) parallel {
	p := parallel{rank: rank, tp: max(l.TP, 1), ep: max(l.EP, 1), dispatch: l.Dispatch, expHi: c.NRoutedExperts,
		mlaHeads: c.NumAttentionHeads, kdaHeads: c.LinearNumHeads, moeInter: c.MoEIntermediateSize, vocabHi: c.VocabSize}
	p.tpRank, p.epRank = rank%p.tp, rank%p.ep // dist.NewLayout's
	if p.ep > 1 {
		p.expLo, p.expHi = ep.Layer{Experts: c.NRoutedExperts}.Range(p.epRank, p.ep)
	}
	if p.tp > 1 {
		p.mlaHeads, p.kdaHeads = c.NumAttentionHeads/p.tp, c.LinearNumHeads/p.tp
		if p.ep == 1 {
			p.moeInter = c.MoEIntermediateSize / p.tp // without EP every expert is split too
		}
		p.vocabLo, p.vocabHi = tp.VocabRange(c.VocabSize, p.tpRank, p.tp)
	}
	return p
}

// tpGroup returns the communicator of p's tp group.
func (p *parallel) tpGroup() dist.Communicator {
	if p.tpComm == nil {
		return p.comm
	}
	return p.tpComm
}

// epGroup returns the communicator of p's ep group.
func (p *parallel) epGroup() dist.Communicator {
	if p.epComm == nil {
		return p.comm
	}
	return p.epComm
}

// join sets p's tp and ep groups on comm (every rank of the layout): comm itself where
// a group spans every rank, else dist.NewLayout's split (every rank must call it).
func (p *parallel) join(comm dist.Communicator) error {
	p.comm, p.tpComm, p.epComm = comm, comm, comm
	if p.tp == 1 || p.ep == 1 || p.tp == p.ep {
		return nil
	}
	l, err := dist.NewLayout(comm, p.tp, 1, p.ep)
	if err != nil {
		return fmt.Errorf("%s: rank %d: %w", Name, p.rank, err)
	}
	p.tpComm, p.epComm = l.TP, l.EP
	return nil
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
	if l.CP {
		return nil, fmt.Errorf("%s: prefill CP over the ep ranks runs on the GPU (NewGPULayout); the CPU's CP runs the whole model on each rank (NewCPRank)", Name)
	}
	p := rankPart(c, l, comm.Rank())
	if err := p.join(comm); err != nil { // first: every rank splits comm, even one whose weights are refused
		return nil, err
	}
	per := 2 * p.moeInter * c.HiddenSize
	if len(w.embed) != (p.vocabHi-p.vocabLo)*c.HiddenSize {
		return nil, fmt.Errorf("%s: rank %d: embedding of %d values, want vocabulary rows [%d, %d)", Name, p.rank, len(w.embed), p.vocabLo, p.vocabHi)
	}
	for i, ly := range w.layers {
		if ly.moe != nil && len(ly.moe.gateUp) != (p.expHi-p.expLo)*per {
			return nil, fmt.Errorf("%s: rank %d: layer %d holds %d experts, want [%d, %d)", Name, p.rank, i, len(ly.moe.gateUp)/per, p.expLo, p.expHi)
		}
	}
	if w.mtp != nil && w.mtp.moe != nil && len(w.mtp.moe.gateUp) != (p.expHi-p.expLo)*per {
		return nil, fmt.Errorf("%s: rank %d: the MTP layer holds %d experts, want [%d, %d)", Name, p.rank, len(w.mtp.moe.gateUp)/per, p.expLo, p.expHi)
	}
	return &TextModel{Config: c, W: w, par: p}, nil
}

// ShardTextWeights cuts rank's part of the whole model's weights w for layout l (copies:
// w may be dropped afterwards), the MTP layer's when w has one.
func ShardTextWeights(c *TextConfig, w *TextWeights, l Layout, rank int) (*TextWeights, error) {
	if err := l.Check(c); err != nil {
		return nil, err
	}
	if rank < 0 || rank >= l.Size() {
		return nil, fmt.Errorf("%s: rank %d of a layout of %d", Name, rank, l.Size())
	}
	p := rankPart(c, l, rank)
	return p.cut(c, w, 0, false), nil
}

// cut returns p's slices of w, whose routed experts start at the model's expert lo.
func (p *parallel) cut(c *TextConfig, w *TextWeights, lo int, read bool) *TextWeights {
	D, F := c.HiddenSize, c.MoEIntermediateSize
	out := &TextWeights{embed: w.embed, norm: w.norm, lmHead: w.lmHead, layers: slices.Clone(w.layers)}
	if p.tp > 1 && !read {
		out.embed = slices.Clone(w.embed[p.vocabLo*D : p.vocabHi*D])
		out.lmHead = out.embed
		if !c.TieWordEmbeddings {
			out.lmHead = slices.Clone(w.lmHead[p.vocabLo*D : p.vocabHi*D])
		}
	}
	// rows and cols cut a row-major [r, c] matrix to this rank's share of its rows (in
	// blocks of n) or columns.
	share := func(n int) (int, int) { return p.tpRank * n / p.tp, (p.tpRank + 1) * n / p.tp }
	rows := func(m []float32, r, cols int) []float32 {
		a, b := share(r)
		return slices.Clone(m[a*cols : b*cols])
	}
	colsOf := func(m []float32, r, cols int) []float32 {
		a, b := share(cols)
		o := make([]float32, 0, r*(b-a))
		for i := range r {
			o = append(o, m[i*cols+a:i*cols+b]...)
		}
		return o
	}
	mlpCut := func(m mlpWeights) mlpWeights {
		if p.tp == 1 {
			return m
		}
		if read {
			return mlpWeights{gate: m.gate, up: m.up, down: m.down, width: m.width / p.tp}
		}
		return mlpWeights{gate: rows(m.gate, m.width, D), up: rows(m.up, m.width, D), down: colsOf(m.down, D, m.width), width: m.width / p.tp}
	}
	cutLayer := func(ly *textLayer) {
		if p.tp > 1 && ly.kda != nil {
			H, Dh, K := c.LinearNumHeads, c.LinearHeadDim, c.LinearConvKernelDim
			L := H * Dh
			k := *ly.kda
			k.conv = slices.Concat(rows(k.conv[:L*K], L, K), rows(k.conv[L*K:2*L*K], L, K), rows(k.conv[2*L*K:], L, K))
			if !read {
				k.q, k.k, k.v = rows(k.q, L, D), rows(k.k, L, D), rows(k.v, L, D)
				k.dtBias, k.aLog = rows(k.dtBias, L, 1), rows(k.aLog, H, 1)
				k.fb, k.b, k.gb = rows(k.fb, L, Dh), rows(k.b, H, D), rows(k.gb, L, Dh)
				k.o = colsOf(k.o, D, L)
			}
			ly.kda = &k
		}
		if p.tp > 1 && ly.mla != nil && !read {
			H := c.NumAttentionHeads
			a := *ly.mla
			a.qb = rows(a.qb, H*c.QKHeadDim, c.QLoraRank)
			a.kvb = rows(a.kvb, H*(c.QKNopeHeadDim+c.VHeadDim), c.KVLoraRank)
			a.o = colsOf(a.o, D, H*c.VHeadDim)
			ly.mla = &a
		}
		if ly.dense != nil {
			d := mlpCut(*ly.dense)
			ly.dense = &d
		}
		if ly.moe == nil {
			return
		}
		mw := *ly.moe
		mw.shared = mlpCut(mw.shared)
		mw.perExpert = "" // a rank's share is not the checkpoint's every expert
		if read && p.tp > 1 && p.ep == 1 {
			ly.moe = &mw // the loader read each expert's rows and columns alone
			return
		}
		var gu, down []float32
		for e := p.expLo; e < p.expHi; e++ {
			ge := mw.gateUp[(e-lo)*2*F*D : (e-lo+1)*2*F*D]
			de := mw.down[(e-lo)*D*F : (e-lo+1)*D*F]
			if p.tp == 1 || p.ep > 1 {
				gu, down = append(gu, ge...), append(down, de...)
				continue
			}
			gu = append(gu, rows(ge[:F*D], F, D)...)
			gu = append(gu, rows(ge[F*D:], F, D)...)
			down = append(down, colsOf(de, D, F)...)
		}
		mw.gateUp, mw.down = gu, down
		ly.moe = &mw
	}
	for i := range out.layers {
		cutLayer(&out.layers[i])
	}
	if w.mtp != nil {
		mt := *w.mtp // eh_proj and the norms replicated
		ly := textLayer{mla: mt.mla, moe: mt.moe}
		cutLayer(&ly)
		mt.mla, mt.moe = ly.mla, ly.moe
		if p.tp > 1 && len(mt.head) == c.VocabSize*D { // whole: not the loader's rows of lm_head
			mt.head = slices.Clone(mt.head[p.vocabLo*D : p.vocabHi*D])
		}
		out.mtp = &mt
	}
	return out
}

// embed looks up ids into x ([T, D]): under TP this rank's vocabulary rows, zeros for the
// others', summed over the group.
func (m *TextModel) embed(x []float32, ids []int32) error {
	D := m.Config.HiddenSize
	if !m.tensorParallel() {
		return ref.Embedding(x, m.W.embed, ids, D)
	}
	p := &m.par
	for i, t := range ids {
		if t < 0 || int(t) >= m.Config.VocabSize {
			return fmt.Errorf("token id %d outside the vocabulary [0, %d)", t, m.Config.VocabSize)
		}
		if int(t) >= p.vocabLo && int(t) < p.vocabHi {
			copy(x[i*D:(i+1)*D], m.W.embed[(int(t)-p.vocabLo)*D:])
		}
	}
	return m.allReduce(x, "embedding")
}

// lmHead returns the logits of the n rows of y: under TP each rank's vocabulary rows,
// all-gathered.
func (m *TextModel) lmHead(y []float32, n int) ([]float32, error) {
	c := m.Config
	if !m.tensorParallel() {
		return m.dense(y, &m.W.lmHead, n, c.HiddenSize, c.VocabSize), nil
	}
	return m.vocabParallel(y, m.W.lmHead, n)
}

// vocabParallel returns the logits of the n rows of y under TP: this rank's vocabulary
// rows of head ([vocabHi−vocabLo, hidden]), all-gathered.
func (m *TextModel) vocabParallel(y, head []float32, n int) ([]float32, error) {
	c, p := m.Config, &m.par
	part := dense(y, head, n, c.HiddenSize, p.vocabHi-p.vocabLo)
	parts, err := p.tpGroup().AllGatherV(dist.F32Bytes(part))
	if err != nil {
		return nil, fmt.Errorf("lm_head: %w", err)
	}
	v := c.VocabSize
	logits := make([]float32, n*v)
	for q, b := range parts {
		lo, hi := tp.VocabRange(v, q, p.tp)
		if len(b) != 4*n*(hi-lo) {
			return nil, fmt.Errorf("lm_head: rank %d sent %d bytes of logits, want %d", q, len(b), 4*n*(hi-lo))
		}
		src := make([]float32, n*(hi-lo))
		copy(dist.F32Bytes(src), b)
		for r := range n {
			copy(logits[r*v+lo:r*v+hi], src[r*(hi-lo):(r+1)*(hi-lo)])
		}
	}
	return logits, nil
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
	w, err := loadPartWeights(dir, c, seed, rankPart(c, l, rank), whole)
	return c, w, err
}

// loadPartWeights reads layout part p's weights of the model of config c in dir, as
// loadRankWeights.
func loadPartWeights(dir string, c *TextConfig, seed uint64, p parallel, whole *TextWeights) (*TextWeights, error) {
	ck, err := weights.Open(dir)
	switch {
	case err == nil:
		defer ck.Close()
		var src tensorSource = ck
		if c.Quant != nil {
			src = dequantSource{ck, c.Quant}
		}
		w, err := loadTextShard(src, c, &[2]int{p.expLo, p.expHi}, &p)
		if err != nil {
			return nil, fmt.Errorf("load %s: %w", dir, err)
		}
		return p.cut(c, w, p.expLo, true), nil
	case !errors.Is(err, weights.ErrNotFound):
		return nil, fmt.Errorf("load %s: %w", dir, err)
	}
	if whole == nil {
		if whole, err = randomWeights(dir, c, seed); err != nil {
			return nil, err
		}
	}
	return p.cut(c, whole, 0, false), nil
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
	// Drafts > 0: every rank drafts that many tokens per step from its part of the MTP
	// layer (NewMTPTextRunner); 0 = off.
	Drafts int
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
	if o.Drafts == 0 {
		w.mtp = nil // not drafting: the layer is not needed
	}
	m, err := NewRankModel(c, w, l, comm)
	if err != nil {
		return nil, nil, err
	}
	r := NewTextRunner(m, o.PageTokens, o.MaxContext)
	if o.Drafts > 0 {
		if r, err = NewMTPTextRunner(m, o.PageTokens, o.MaxContext, o.Drafts); err != nil {
			return nil, nil, err
		}
	}
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
// before it is broadcast, the others execute its CacheOps on their own pool first. A
// runner that drafts (NewMTPTextRunner) drafts on every rank: rank 0 broadcasts each
// step's result after sampling, every rank puts back its own KDA heads' states for the
// rejected drafts and runs its part of the MTP layer, whose logits (all-gathered) and so
// whose drafts are the same on every rank.
func (r *TextRunner) LockstepRank(rank int, pool *kvslab.Pool) lockstep.Rank {
	lr := lockstep.Rank{Forward: r.RankForward, Vocab: r.Model.Config.VocabSize}
	if rank == 0 {
		lr.Check = r.CheckPlan
	} else {
		lr.Forward = lockstep.WithCacheOps(pool, r.RankForward)
	}
	if r.drafts > 0 {
		lr.Draft, lr.MaxDrafts = r.draft, r.drafts
	}
	return lr
}

// Group is the ranks of a parallel layout as goroutines of this process; its Runner is
// rank 0's, which serves the engine and broadcasts each plan to the others.
type Group struct {
	*cpurunner.Runner
	ranks *lockstep.InProcess
	cp    *CPRank // rank 0's, under prefill CP (OpenCPInProcess)
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
	return &Group{Runner: cpurunner.New(r0.Info(), g.Leader()), ranks: g}, pool0, nil
}

// moeExperts adds into out ([T, D], rank 0's holding the shared experts' output) the
// routed experts' weighted outputs of every token (ids, wts: [T, K]) with the experts
// spread over the ep group, per the layout's Dispatch (the tp group's shared experts
// already summed, or held by ranks whose sum over the ep group is them once: moe). run computes one held expert.
func (m *TextModel) moeExperts(x, out []float32, ids []int32, wts []float32, T int, run ep.ExpertFunc) error {
	c, p := m.Config, &m.par
	D, K := c.HiddenSize, c.NumExpertsPerTok
	if p.dispatch == DispatchAllToAll {
		lo, hi := ep.RowShare(T, p.epRank, p.ep)
		layer := ep.Layer{Experts: c.NRoutedExperts, Hidden: D, TopK: K}
		mine := make([]float32, (hi-lo)*D)
		if err := ep.AllToAll(p.epGroup(), layer, ep.Routes{X: x[lo*D : hi*D], IDs: ids[lo*K : hi*K], Weights: wts[lo*K : hi*K]}, run, mine); err != nil {
			return err
		}
		all, err := p.epGroup().AllGatherV(dist.F32Bytes(mine))
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
	return ep.CombineReplicated(p.epGroup(), out, T, D)
}
