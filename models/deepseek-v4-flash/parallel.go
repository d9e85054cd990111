package deepseekv4flash

import (
	"cmp"
	"errors"
	"fmt"
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
	// runs its experts on the tokens routed to them and the partial sums are combined by
	// a reduce-scatter-v and an all-gather-v (ep.CombineReplicated).
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

// Layout is a rank's parallel layout of the model, on the CPU reference forward:
//
//   - TP ranks split the attention heads (q_b rows, sinks) and the o_groups of the
//     grouped output projection (o_a rows, o_b columns, then an all-reduce), every routed
//     and the shared expert's intermediate columns (gate/up rows, down columns, one
//     all-reduce of the MoE output), and the vocabulary (the embedding's rows, all-reduced
//     lookups; the lm_head's rows, all-gathered logits). The single K=V head, the
//     compressors, the indexer, q_a, the router and the hyper-connections are replicated,
//     as vLLM and SGLang replicate V4's single latent, so every rank keeps the whole
//     cache.
//   - EP ranks split the routed experts in contiguous ranges (ep.Layer.Range: the last
//     ranks may hold fewer, or none); everything else is replicated and every rank runs
//     every token, combined per Dispatch.
//
// TP and EP together run over max(TP, EP) ranks, the smaller dividing the larger, in
// dist.NewLayout's groups (tp groups and ep groups of consecutive ranks, tp rank = rank
// mod TP, ep rank = rank mod EP): each tp group splits the attention, the vocabulary and
// the shared expert TP ways, and every tp group runs the same tokens (replicated, as
// SGLang's attention DP within the ep group); the routed experts (each whole) split over
// the ep group, and with EP < TP the ep groups hold the same experts (replicated) and each
// reduces its own partials. Equal sizes are SGLang's --tp N --ep N: the same ranks split
// both ways. The MTP head's block is split like a layer (its e_proj, h_proj, norms
// and hc_head replicated) and reads the split embedding and lm_head, so every rank runs
// the drafts of every step (Runner.LockstepRank) and they come out equal on every rank.
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

// Check refuses a layout the config does not divide into.
func (l Layout) Check(c *Config) error {
	tpn, epn := max(l.TP, 1), max(l.EP, 1)
	switch {
	case l.TP < 0 || l.EP < 0:
		return fmt.Errorf("%s: layout tp=%d ep=%d", Name, l.TP, l.EP)
	case tpn > 1 && epn > 1 && max(tpn, epn)%min(tpn, epn) != 0:
		return fmt.Errorf("%s: tp=%d with ep=%d: the smaller must divide the larger (they run over max(tp, ep) ranks, the smaller's groups within the larger's)", Name, tpn, epn)
	case epn > c.NRoutedExperts:
		// More ranks than experts would work (expert-less ranks are handled), but it is
		// surely a mistake on the command line.
		return fmt.Errorf("%s: ep=%d for %d routed experts", Name, epn, c.NRoutedExperts)
	case c.NumAttentionHeads%tpn != 0 || c.OGroups%tpn != 0 || c.MoEIntermediateSize%tpn != 0:
		return fmt.Errorf("%s: %d heads, %d o_groups and moe_intermediate_size %d do not all divide by tp=%d",
			Name, c.NumAttentionHeads, c.OGroups, c.MoEIntermediateSize, tpn)
	case l.Dispatch != DispatchGather && l.Dispatch != DispatchAllToAll:
		return fmt.Errorf("%s: dispatch %d", Name, l.Dispatch)
	case l.CP && (epn < 2 || tpn > 1):
		return fmt.Errorf("%s: prefill CP over a layout splits the ep ranks' prompts: ep 2 or more, tp 1 (not tp=%d ep=%d)", Name, tpn, epn)
	}
	return nil
}

// parallel is what a Model holds of its layout; the zero layout (one rank) is filled by
// NewModel.
type parallel struct {
	comm   dist.Communicator // every rank of the layout; nil on one rank
	tp, ep int               // group sizes, 1 when off
	rank   int               // in comm
	// The tp and ep groups (NewRankModel: comm itself where one spans every rank; nil
	// where comm was set alone: tpGroup, epGroup) and this rank's place in them.
	tpComm, epComm   dist.Communicator
	tpRank, epRank   int
	dispatch         Dispatch
	heads, groups    int // attention heads and o_groups held
	inter            int // intermediate columns held of each routed expert
	sharedInter      int // and of the shared one
	expLo, expHi     int // routed experts held
	vocabLo, vocabHi int // embedding and lm_head rows held

	// DP-attention (dp.go): the ep group's ranks bring their own tokens, each padding its
	// MoE rows to dpPad (0: none) with rows routed to no expert.
	dp    bool
	dpPad int
	// dpExchanges counts the MoE exchanges run under DP-attention (DPDraft evens out a
	// step's draft rounds with it).
	dpExchanges int
}

func wholeModel(c *Config) parallel {
	return parallel{tp: 1, ep: 1, heads: c.NumAttentionHeads, groups: c.OGroups, inter: c.MoEIntermediateSize,
		sharedInter: c.MoEIntermediateSize, expHi: c.NRoutedExperts, vocabHi: c.VocabSize}
}

func rankPart(c *Config, l Layout, rank int) parallel {
	p := wholeModel(c)
	p.tp, p.ep, p.rank, p.dispatch = max(l.TP, 1), max(l.EP, 1), rank, l.Dispatch
	p.tpRank, p.epRank = rank%p.tp, rank%p.ep // dist.NewLayout's
	if p.tp > 1 {
		p.heads, p.groups, p.sharedInter = c.NumAttentionHeads/p.tp, c.OGroups/p.tp, c.MoEIntermediateSize/p.tp
		if p.ep == 1 {
			p.inter = c.MoEIntermediateSize / p.tp // without EP every expert is split too
		}
		p.vocabLo, p.vocabHi = tp.VocabRange(c.VocabSize, p.tpRank, p.tp)
	}
	if p.ep > 1 {
		p.expLo, p.expHi = ep.Layer{Experts: c.NRoutedExperts}.Range(p.epRank, p.ep)
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

// NewRankModel is NewModel for rank comm.Rank() of layout l: w must be that rank's
// weights (ShardWeights, or LoadShard), and every collective of its forward runs on comm,
// whose ranks run the same plans.
func NewRankModel(c *Config, w *Weights, maxContext int, l Layout, comm dist.Communicator) (*Model, error) {
	if err := l.Check(c); err != nil {
		return nil, err
	}
	if comm.Size() != l.Size() {
		return nil, fmt.Errorf("%s: layout of %d ranks on a group of %d", Name, l.Size(), comm.Size())
	}
	if l.CP {
		return nil, fmt.Errorf("%s: prefill CP over the ep ranks runs on the GPU (NewGPULayout); the CPU's CP runs the whole model on each rank (NewCPRank)", Name)
	}
	m, err := NewModel(c, w, maxContext)
	if err != nil {
		return nil, err
	}
	m.par = rankPart(c, l, comm.Rank())
	if err := m.par.join(comm); err != nil { // first: every rank splits comm, even one whose weights are refused
		return nil, err
	}
	if err := m.par.checkWeights(c, w); err != nil {
		return nil, err
	}
	return m, nil
}

// checkWeights makes sure w holds the slices p says (a whole model given to a rank, or
// another rank's, would compute garbage).
func (p *parallel) checkWeights(c *Config, w *Weights) error {
	h, d, in := c.HiddenSize, c.HeadDim, p.inter
	if len(w.Embed) != (p.vocabHi-p.vocabLo)*h || len(w.Head) != (p.vocabHi-p.vocabLo)*h {
		return fmt.Errorf("%s: rank %d: embedding of %d values, want vocabulary rows [%d, %d)", Name, p.rank, len(w.Embed), p.vocabLo, p.vocabHi)
	}
	layers := w.Layers
	if w.MTP != nil {
		layers = append(slices.Clip(layers), w.MTP.Block)
	}
	for i := range layers {
		l := &layers[i]
		ne := p.expHi - p.expLo
		if len(l.QB) != p.heads*d*c.QLoraRank || len(l.Sinks) != p.heads || len(l.OB) != h*p.groups*c.OLoraRank ||
			len(l.GateUp) != ne*2*in*h || len(l.Down) != ne*h*in || len(l.SharedGate) != p.sharedInter*h {
			what := fmt.Sprintf("layer %d's", i)
			if i == len(w.Layers) {
				what = "the MTP block's"
			}
			return fmt.Errorf("%s: rank %d: %s weights are not this rank's slices (%d heads, experts [%d, %d), %d columns)",
				Name, p.rank, what, p.heads, p.expLo, p.expHi, in)
		}
	}
	return nil
}

// ShardWeights cuts rank's part of the whole model w for layout l (copies: w may be
// dropped afterwards), the MTP head's when w has one.
func ShardWeights(c *Config, w *Weights, l Layout, rank int) (*Weights, error) {
	if err := l.Check(c); err != nil {
		return nil, err
	}
	if rank < 0 || rank >= l.Size() {
		return nil, fmt.Errorf("%s: rank %d of a layout of %d", Name, rank, l.Size())
	}
	p := rankPart(c, l, rank)
	return p.cut(c, w, 0, false), nil
}

// LoadShard is LoadWeights for rank of layout l: under EP only the per-expert tensors of
// the rank's experts are read (a packed module-form tensor is read whole and cut); under
// TP the rank's rows or columns of the attention's split tensors (q_b, sinks, o_a, o_b),
// the shared experts' and the vocabulary's are read alone when the checkpoint stores them
// unquantized (a quantized one is read whole and cut), and each routed expert is read
// whole and cut. The MTP head, when the checkpoint has one, is read and cut the same way.
func LoadShard(c *Config, ck *weights.Checkpoint, l Layout, rank int) (*Weights, error) {
	if err := l.Check(c); err != nil {
		return nil, err
	}
	if rank < 0 || rank >= l.Size() {
		return nil, fmt.Errorf("%s: rank %d of a layout of %d", Name, rank, l.Size())
	}
	p := rankPart(c, l, rank)
	var keep *[2]int
	if p.ep > 1 {
		keep = &[2]int{p.expLo, p.expHi}
	}
	var parts func(*Weights) map[*[]float32]part
	if p.tp > 1 {
		parts = p.parts(c)
	}
	w, err := loadWeights(c, ck, keep, parts)
	if err != nil {
		return nil, err
	}
	return p.cut(c, w, p.expLo, parts != nil), nil
}

// parts maps the tensors TP splits outside the routed experts to p's slices of them:
// what cut would cut, for the loader to read alone.
func (p *parallel) parts(c *Config) func(*Weights) map[*[]float32]part {
	return func(w *Weights) map[*[]float32]part {
		d, olr := c.HeadDim, c.OLoraRank
		h0, h1 := p.tpRank*p.heads, (p.tpRank+1)*p.heads
		g0, g1 := p.tpRank*p.groups, (p.tpRank+1)*p.groups
		s0, s1 := p.tpRank*p.sharedInter, (p.tpRank+1)*p.sharedInter
		m := map[*[]float32]part{&w.Embed: {lo: p.vocabLo, hi: p.vocabHi}, &w.Head: {lo: p.vocabLo, hi: p.vocabHi}}
		layers := make([]*Layer, 0, len(w.Layers)+1)
		for i := range w.Layers {
			layers = append(layers, &w.Layers[i])
		}
		if w.MTP != nil {
			layers = append(layers, &w.MTP.Block)
		}
		for _, l := range layers {
			m[&l.QB] = part{lo: h0 * d, hi: h1 * d}
			m[&l.Sinks] = part{lo: h0, hi: h1}
			m[&l.OA] = part{lo: g0 * olr, hi: g1 * olr}
			m[&l.OB] = part{cols: true, lo: g0 * olr, hi: g1 * olr}
			m[&l.SharedGate] = part{lo: s0, hi: s1}
			m[&l.SharedUp] = part{lo: s0, hi: s1}
			m[&l.SharedDown] = part{cols: true, lo: s0, hi: s1}
			if p.inter < c.MoEIntermediateSize { // every routed expert split too
				i0, i1 := p.tpRank*p.inter, (p.tpRank+1)*p.inter
				m[&l.GateUp] = part{lo: i0, hi: i1}
				m[&l.Down] = part{cols: true, lo: i0, hi: i1}
			}
		}
		return m
	}
}

// cut returns p's slices of w, whose routed experts start at the model's expert lo; with
// read, w's tensors in parts are p's slices already (the loader read them alone).
func (p *parallel) cut(c *Config, w *Weights, lo int, read bool) *Weights {
	out := &Weights{HCFn: w.HCFn, HCBase: w.HCBase, HCScale: w.HCScale, Norm: w.Norm, Layers: make([]Layer, len(w.Layers))}
	h := c.HiddenSize
	if read {
		out.Embed, out.Head = w.Embed, w.Head
	} else {
		out.Embed = slices.Clone(w.Embed[p.vocabLo*h : p.vocabHi*h])
		out.Head = slices.Clone(w.Head[p.vocabLo*h : p.vocabHi*h])
	}
	if c.TieWordEmbeddings {
		out.Head = out.Embed
	}
	for i := range w.Layers {
		out.Layers[i] = p.shardLayer(c, &w.Layers[i], lo, read)
	}
	if w.MTP != nil {
		mtp := *w.MTP // e_proj, h_proj, the norms and hc_head replicated
		mtp.Block = p.shardLayer(c, &w.MTP.Block, lo, read)
		out.MTP = &mtp
	}
	return out
}

// shardLayer cuts p's slices of layer l, whose routed experts start at the model's expert
// lo (0: all of them; p's own first when the loader read only p's).
func (p *parallel) shardLayer(c *Config, l *Layer, lo int, read bool) Layer {
	h, d, qr, in, olr := c.HiddenSize, c.HeadDim, c.QLoraRank, c.MoEIntermediateSize, c.OLoraRank
	gin := c.NumAttentionHeads * d / c.OGroups
	out := *l
	h0, h1 := p.tpRank*p.heads, (p.tpRank+1)*p.heads
	g0, g1 := p.tpRank*p.groups, (p.tpRank+1)*p.groups
	i0, i1 := p.tpRank*p.inter, (p.tpRank+1)*p.inter
	s0, s1 := p.tpRank*p.sharedInter, (p.tpRank+1)*p.sharedInter
	if p.tp == 1 {
		h0, h1, g0, g1, s0, s1 = 0, c.NumAttentionHeads, 0, c.OGroups, 0, in
	}
	if p.inter == in {
		i0, i1 = 0, in
	}
	if !read {
		out.QB = slices.Clone(l.QB[h0*d*qr : h1*d*qr])
		out.Sinks = slices.Clone(l.Sinks[h0:h1])
		out.OA = slices.Clone(l.OA[g0*olr*gin : g1*olr*gin])
		out.OB = columns(l.OB, h, c.OGroups*olr, g0*olr, g1*olr)
		out.SharedGate = slices.Clone(l.SharedGate[s0*h : s1*h])
		out.SharedUp = slices.Clone(l.SharedUp[s0*h : s1*h])
		out.SharedDown = columns(l.SharedDown, h, in, s0, s1)
	}
	if read && p.inter < in {
		return out // the loader read each expert's gate and up rows and down columns alone
	}
	// Routed experts: p's range, each expert's gate and up rows [i0, i1) and down columns.
	var gu, down []float32
	for e := p.expLo; e < p.expHi; e++ {
		ge := l.GateUp[(e-lo)*2*in*h : (e-lo+1)*2*in*h]
		gu = append(gu, ge[i0*h:i1*h]...)
		gu = append(gu, ge[(in+i0)*h:(in+i1)*h]...)
		down = append(down, columns(l.Down[(e-lo)*h*in:(e-lo+1)*h*in], h, in, i0, i1)...)
	}
	out.GateUp, out.Down = gu, down
	return out
}

// columns returns columns [lo, hi) of the row-major [rows, cols] matrix m.
func columns(m []float32, rows, cols, lo, hi int) []float32 {
	out := make([]float32, 0, rows*(hi-lo))
	for r := range rows {
		out = append(out, m[r*cols+lo:r*cols+hi]...)
	}
	return out
}

// embed looks up tokens into x ([n, hidden]): under TP this rank's vocabulary rows, zeros
// for the others', summed over the group.
func (m *Model) embed(x []float32, tokens []int32) error {
	p, h := &m.par, m.Config.HiddenSize
	if p.tp == 1 {
		return ref.Embedding(x, m.W.Embed, tokens, h)
	}
	clear(x)
	for i, t := range tokens {
		if int(t) >= p.vocabLo && int(t) < p.vocabHi {
			copy(x[i*h:(i+1)*h], m.W.Embed[(int(t)-p.vocabLo)*h:])
		}
	}
	if err := dist.AllReduceF32(p.tpGroup(), x); err != nil {
		return fmt.Errorf("embedding: %w", err)
	}
	return nil
}

// lmHead returns the logits of the n rows of y ([n, hidden]): under TP each rank's
// vocabulary rows, all-gathered.
func (m *Model) lmHead(y []float32, n int) ([]float32, error) {
	c, p := m.Config, &m.par
	vl := p.vocabHi - p.vocabLo
	part, err := linearQ(y, m.W.Head, m.headW, n, c.HiddenSize, vl)
	if err != nil || p.tp == 1 {
		return part, err
	}
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
		src := asF32(b)
		for r := range n {
			copy(logits[r*v+lo:r*v+hi], src[r*(hi-lo):(r+1)*(hi-lo)])
		}
	}
	return logits, nil
}

// allReduce sums x over the TP group (nothing on one rank).
func (m *Model) allReduce(x []float32, what string) error {
	if m.par.tp == 1 {
		return nil
	}
	if err := dist.AllReduceF32(m.par.tpGroup(), x); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// asF32 copies little-endian float32 bytes into a new slice.
func asF32(b []byte) []float32 {
	out := make([]float32, len(b)/4)
	copy(dist.F32Bytes(out), b)
	return out
}

// RankForward is the forward of one rank of a parallel layout (a model from
// NewRankModel), for core/dist/lockstep: every rank of the group runs every plan.
func (r *Runner) RankForward(p *engine.BatchPlan, logits []float32) error {
	return r.forward(p, logits)
}

// CheckPlan refuses, before any collective, what the forward would refuse of p: rank 0
// of a parallel group calls it before broadcasting p, so that no rank fails alone.
func (r *Runner) CheckPlan(p *engine.BatchPlan, logits []float32) error {
	if r.kv == nil {
		return fmt.Errorf("%s: the runner is not bound to a pool", Name)
	}
	c := r.Model.Config
	n := p.NumTokens()
	if len(p.Positions) != n || len(p.QueryStart) != p.NumSeqs()+1 {
		return fmt.Errorf("%s: a plan of %d tokens with %d positions and %d query starts", Name, n, len(p.Positions), len(p.QueryStart))
	}
	for i := range p.NumSeqs() {
		if st := r.kv.L.state; st >= 0 && p.Groups[st].StatePage[i] == kvslab.NoPage {
			return fmt.Errorf("kv cache: request %d has no state page", p.ReqIDs[i])
		}
		if int(p.Computed[i])+int(p.QueryStart[i+1]-p.QueryStart[i]) > r.Model.maxContext {
			return fmt.Errorf("forward: position %d outside the context of %d tokens", int(p.Computed[i])+int(p.QueryStart[i+1]-p.QueryStart[i])-1, r.Model.maxContext)
		}
	}
	for _, t := range p.Tokens {
		if t < 0 || int(t) >= c.VocabSize {
			return fmt.Errorf("forward: token id %d outside the vocabulary [0, %d)", t, c.VocabSize)
		}
	}
	for _, row := range p.LogitsIndices {
		if row < 0 || int(row) >= n {
			return fmt.Errorf("forward: logits row %d outside the %d rows of the step", row, n)
		}
	}
	if len(logits) != len(p.LogitsIndices)*c.VocabSize {
		return fmt.Errorf("forward: logits of %d values for %d rows", len(logits), len(p.LogitsIndices))
	}
	return nil
}

// loadRankWeights reads the config in dir and rank's weights of layout l: its shard of
// the safetensors there, or of the seeded random weights of the config (whole, when
// whole is set: built once for every rank of an in-process group).
func loadRankWeights(dir string, opts Options, l Layout, rank int, whole *Weights) (*Config, *Weights, error) {
	c, err := LoadConfig(dir)
	if err != nil {
		return nil, nil, err
	}
	if err := l.Check(c); err != nil {
		return nil, nil, err
	}
	ck, err := weights.Open(dir)
	switch {
	case err == nil:
		defer ck.Close()
		w, err := LoadShard(c, ck, l, rank)
		if err != nil {
			return nil, nil, fmt.Errorf("load %s: %w", dir, err)
		}
		return c, w, nil
	case !errors.Is(err, weights.ErrNotFound):
		return nil, nil, fmt.Errorf("load %s: %w", dir, err)
	}
	if whole == nil {
		what := "seeded random weights of " + filepath.Join(dir, "config.json")
		if err := weights.CheckMemory(WeightBytes(c, false), what); err != nil {
			return nil, nil, fmt.Errorf("load %s: %w (put the checkpoint's safetensors there, or shrink the config)", dir, err)
		}
		whole = RandomWeights(c, cmp.Or(opts.Seed, 1), c.NumNextNPredictLayers > 0)
	}
	w, err := ShardWeights(c, whole, l, rank)
	return c, w, err
}

// OpenRank opens rank comm.Rank() of layout l of the model in dir (Load's directory:
// a checkpoint, of which it reads its shard, or a config for seeded random weights) with
// a host cache pool of cacheBytes bytes of its own: every rank keeps the whole cache (the
// attention state is replicated), at the page ids of rank 0's plans. Every rank of comm
// must run every plan (core/dist/lockstep); rank 0 also checks each plan before
// broadcasting it (CheckPlan), and the others execute its CacheOps on their pools first.
func OpenRank(dir string, opts Options, l Layout, comm dist.Communicator, cacheBytes int64) (*Runner, *kvslab.Pool, error) {
	return openRank(dir, opts, l, comm, cacheBytes, nil)
}

func openRank(dir string, opts Options, l Layout, comm dist.Communicator, cacheBytes int64, whole *Weights) (*Runner, *kvslab.Pool, error) {
	if opts.DType != "" && opts.DType != ref.DTypeFP32 {
		return nil, nil, fmt.Errorf("%s: a parallel layout runs fp32, not %s", Name, opts.DType)
	}
	c, w, err := loadRankWeights(dir, opts, l, comm.Rank(), whole)
	if err != nil {
		return nil, nil, err
	}
	if opts.Drafts == 0 {
		w.MTP = nil // not drafting: the head is not needed
	}
	m, err := NewRankModel(c, w, maxContextOf(c, opts), l, comm)
	if err != nil {
		return nil, nil, err
	}
	r, err := rankRunner(m, opts)
	if err != nil {
		return nil, nil, err
	}
	pool, err := r.NewPool(cacheBytes)
	if err != nil {
		return nil, nil, err
	}
	return r, pool, nil
}

// rankRunner is a rank's runner of m: drafting with the MTP head when opts asks for drafts.
func rankRunner(m *Model, opts Options) (*Runner, error) {
	if opts.Drafts > 0 {
		return NewMTPRunner(m, opts.PageTokens, opts.Drafts)
	}
	return NewRunner(m, opts.PageTokens), nil
}

// LockstepRank is r as a rank of core/dist/lockstep's group: rank 0 checks each plan
// before it is broadcast, the others execute its CacheOps on their own pool first. A
// runner that drafts (NewMTPRunner) drafts on every rank: rank 0 broadcasts each step's
// result after sampling, every rank puts back its rejected drafts and runs the split MTP
// head, whose logits (all-gathered) and so whose drafts are the same on every rank.
func (r *Runner) LockstepRank(rank int, pool *kvslab.Pool) lockstep.Rank {
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

// Forward runs one plan on every rank, rank 0's logits into logits (what the Runner's
// Execute calls; tests drive it directly).
func (g *Group) Forward(p *engine.BatchPlan, logits []float32) error {
	return g.ranks.Forward(p, logits)
}

// OpenInProcess opens the model in dir in layout l over l.Size() ranks of this process
// (the random weights built once and cut per rank; a checkpoint read per rank, each its
// shard), each with a pool of cacheBytes bytes; it returns rank 0's runner and pool, for
// the engine. o bounds each collective.
func OpenInProcess(dir string, opts Options, l Layout, cacheBytes int64, o dist.Options) (*Group, *kvslab.Pool, error) {
	c, err := LoadConfig(dir)
	if err != nil {
		return nil, nil, err
	}
	if err := l.Check(c); err != nil {
		return nil, nil, err
	}
	var whole *Weights
	if ck, err := weights.Open(dir); err == nil {
		ck.Close() // each rank reads its shard
	} else if errors.Is(err, weights.ErrNotFound) {
		what := "seeded random weights of " + filepath.Join(dir, "config.json")
		if err := weights.CheckMemory(WeightBytes(c, false), what); err != nil {
			return nil, nil, fmt.Errorf("load %s: %w (put the checkpoint's safetensors there, or shrink the config)", dir, err)
		}
		whole = RandomWeights(c, cmp.Or(opts.Seed, 1), c.NumNextNPredictLayers > 0)
	}
	var r0 *Runner
	var pool0 *kvslab.Pool
	g, err := lockstep.StartInProcess(l.Size(), o, func(rank int, data dist.Communicator) (lockstep.Rank, error) {
		r, pool, err := openRank(dir, opts, l, data, cacheBytes, whole)
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
