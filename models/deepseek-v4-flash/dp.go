package deepseekv4flash

import (
	"cmp"
	"errors"
	"fmt"
	"path/filepath"
	"slices"

	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/dist/ep"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kernels/ref"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/core/weights"
)

// DP-attention on the CPU reference forward, as SGLang's --enable-dp-attention with
// --ep N: each dp rank has an engine and a cache pool of its own and runs the attention
// (replicated weights: embedding, attention, hyper-connections, shared expert, lm_head)
// for its own plan's rows only; the MoE layers run expert-parallel over the dp group (the
// ep group is the dp group, each rank holding its range of the routed experts), each rank
// sending its rows' routes to the experts' ranks (ep.AllToAll) or all-gathering every
// rank's routes (ep.Gather), per Dispatch. core/dist/dp's Group steps the ranks together;
// a rank with no work runs an idle plan, which here runs only the MoE layers' exchanges,
// so that the busy ranks' collectives meet. With DPStep.Pad set (graph buckets), every
// rank pads its MoE rows to that count with dummy rows routed to no expert (ep.Masked).
// With Options.Drafts each dp rank drafts with the MTP head, its block's routed experts
// split over the dp group like a layer's: the ranks draft together (core/dist/dp's
// Rank.Draft, Runner.DPDraft), each running the head's rounds for its own rows, an idle
// rank running the rounds' exchanges alone.

// OpenDPRanks opens len(data) dp ranks of the model in dir (Load's directory: a
// checkpoint, of which each rank reads its experts, or a config for seeded random weights,
// built once and cut per rank) for DP-attention with expert exchange d: rank r's runner
// is bound to a host pool of cacheBytes bytes of its own, and its MoE layers exchange
// rows with the other ranks over data[r]. Each rank's forward is its runner's DPForward,
// run under a core/dist/dp Group whose data communicators may be data.
func OpenDPRanks(dir string, opts Options, d Dispatch, data []dist.Communicator, cacheBytes int64) ([]*Runner, []*kvslab.Pool, error) {
	return OpenDPTPRanks(dir, opts, d, 1, data, cacheBytes)
}

// OpenDPTPRanks is OpenDPRanks with attention TP (SGLang's --dp-attention with --tp
// above --dp): the len(world) ranks are dp ranks of tp consecutive ranks each (world rank
// w: dp rank w/tp, tp rank w%tp), the ranks of a dp rank splitting its attention heads,
// o_groups, shared expert columns and vocabulary (Layout's TP, all-reduced over them),
// every rank holding its range of the routed experts (ep = len(world)), with a pool of its
// own (the attention's cache is replicated over a TP group, each rank writing the same).
// A dp rank's ranks must run its plans together (core/dist/dp's AttentionTP: its first
// rank's plans broadcast to the others, their CacheOps applied to the others' pools). A dp
// rank's first rank alone gives the exchange its rows; the others get the rows' routed
// sums through the TP all-reduce of the shared expert (moeDP). The ranks open
// concurrently (their layout's groups are split by collectives).
func OpenDPTPRanks(dir string, opts Options, d Dispatch, tp int, world []dist.Communicator, cacheBytes int64) ([]*Runner, []*kvslab.Pool, error) {
	n := len(world)
	if tp > 1 && opts.Drafts > 0 {
		return nil, nil, fmt.Errorf("%s: DP-attention with attention tp=%d does not draft yet (MTP drafts run under DP-attention without TP)", Name, tp)
	}
	whole, err := dpWeights(dir, opts, d, n, max(tp, 1))
	if err != nil {
		return nil, nil, err
	}
	runners := make([]*Runner, n)
	pools := make([]*kvslab.Pool, n)
	err = dist.OnEveryRank(world, func(r int, comm dist.Communicator) (err error) {
		runners[r], pools[r], err = openDPRank(dir, opts, d, max(tp, 1), comm, cacheBytes, whole)
		return err
	})
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", Name, err)
	}
	return runners, pools, nil
}

// OpenDPRank opens dp rank comm.Rank() of comm.Size() alone, as OpenDPRanks opens each:
// the rank of a process of its own (core/dist/dp's ServeForward in a worker, or rank 0's
// process), which reads its experts from a checkpoint or builds the seeded random
// weights whole and cuts its part.
func OpenDPRank(dir string, opts Options, d Dispatch, comm dist.Communicator, cacheBytes int64) (*Runner, *kvslab.Pool, error) {
	return OpenDPTPRank(dir, opts, d, 1, comm, cacheBytes)
}

// OpenDPTPRank is OpenDPRank with attention TP, as OpenDPTPRanks opens each rank: world
// rank comm.Rank() of comm.Size(), tp rank comm.Rank()%tp of dp rank comm.Rank()/tp.
func OpenDPTPRank(dir string, opts Options, d Dispatch, tp int, comm dist.Communicator, cacheBytes int64) (*Runner, *kvslab.Pool, error) {
	tp = max(tp, 1)
	if tp > 1 && opts.Drafts > 0 {
		return nil, nil, fmt.Errorf("%s: DP-attention with attention tp=%d does not draft yet (MTP drafts run under DP-attention without TP)", Name, tp)
	}
	whole, err := dpWeights(dir, opts, d, comm.Size(), tp)
	if err != nil {
		return nil, nil, err
	}
	return openDPRank(dir, opts, d, tp, comm, cacheBytes, whole)
}

// dpWeights checks DP-attention over n ranks (tp of them in each dp rank's attention TP
// group) with exchange d for the model in dir and returns the whole seeded random
// weights to cut the ranks from, or nil for a checkpoint (each rank reads its shard).
func dpWeights(dir string, opts Options, d Dispatch, n, tp int) (*Weights, error) {
	if opts.DType != "" && opts.DType != ref.DTypeFP32 {
		return nil, fmt.Errorf("%s: DP-attention ranks run fp32 only, not %s", Name, opts.DType)
	}
	if n < 2*tp || n%tp != 0 {
		return nil, fmt.Errorf("%s: DP-attention over %d ranks with attention tp=%d, want 2 or more dp ranks of tp ranks each", Name, n, tp)
	}
	c, err := LoadConfig(dir)
	if err != nil {
		return nil, err
	}
	if err := (Layout{TP: tp, EP: n, Dispatch: d}).Check(c); err != nil {
		return nil, fmt.Errorf("DP-attention: %w", err)
	}
	if ck, err := weights.Open(dir); err == nil {
		ck.Close() // each rank reads its shard
		return nil, nil
	} else if !errors.Is(err, weights.ErrNotFound) {
		return nil, fmt.Errorf("load %s: %w", dir, err)
	}
	what := "seeded random weights of " + filepath.Join(dir, "config.json")
	if err := weights.CheckMemory(WeightBytes(c, false), what); err != nil {
		return nil, fmt.Errorf("load %s: %w (put the checkpoint's safetensors there, or shrink the config)", dir, err)
	}
	return RandomWeights(c, cmp.Or(opts.Seed, 1), c.NumNextNPredictLayers > 0), nil
}

// openDPRank opens rank comm.Rank() of comm.Size() (tp ranks a dp rank: 1 without
// attention TP), cut from whole (nil: read from dir's checkpoint), with a pool of
// cacheBytes.
func openDPRank(dir string, opts Options, d Dispatch, tp int, comm dist.Communicator, cacheBytes int64, whole *Weights) (*Runner, *kvslab.Pool, error) {
	r := comm.Rank()
	l := Layout{TP: tp, EP: comm.Size(), Dispatch: d}
	c, w, err := loadRankWeights(dir, opts, l, r, whole)
	if err != nil {
		return nil, nil, fmt.Errorf("dp rank %d: %w", r, err)
	}
	if opts.Drafts == 0 {
		w.MTP = nil
	}
	m, err := NewRankModel(c, w, maxContextOf(c, opts), l, comm)
	if err != nil {
		return nil, nil, fmt.Errorf("dp rank %d: %w", r, err)
	}
	m.par.dp = true
	run, err := rankRunner(m, opts)
	if err != nil {
		return nil, nil, fmt.Errorf("dp rank %d: %w", r, err)
	}
	pool, err := run.NewPool(cacheBytes)
	if err != nil {
		return nil, nil, fmt.Errorf("dp rank %d: %w", r, err)
	}
	return run, pool, nil
}

// CloseComms closes the rank's communicators: its layout's TP and ep groups and the
// world's. A rank whose step failed mid-way calls it so that its peers, waiting for it in
// an all-reduce or an exchange, fail at once rather than at their deadline (the group is
// done: it runs no more steps).
func (r *Runner) CloseComms() {
	p := &r.Model.par
	for _, c := range []dist.Communicator{p.tpComm, p.epComm, p.comm} {
		if c != nil {
			c.Close()
		}
	}
}

// DPForward is the forward of a dp rank (a runner of OpenDPRanks) under core/dist/dp's
// Group: p.DP must name this rank of the group. A plan with tokens runs as the runner's
// forward does, its MoE layers exchanging its rows with the other ranks; an idle plan (no
// tokens, no logits) runs only the MoE layers' exchanges, with DP.Pad dummy rows.
func (r *Runner) DPForward(p *engine.BatchPlan, logits []float32) error {
	m := r.Model
	par := &m.par
	rank, size := par.dpRank()
	switch {
	case !par.dp:
		return fmt.Errorf("%s: DPForward on a runner not opened for DP-attention", Name)
	case len(p.DP.Tokens) != size || int(p.DP.Rank) != rank:
		return fmt.Errorf("%s: a plan of dp rank %d of %d on dp rank %d of %d", Name, p.DP.Rank, len(p.DP.Tokens), rank, size)
	case int(p.DP.Tokens[rank]) != p.NumTokens():
		return fmt.Errorf("%s: dp rank %d's plan has %d tokens, its step says %d", Name, rank, p.NumTokens(), p.DP.Tokens[rank])
	case p.DP.Pad < 0 || p.DP.Pad > 0 && int(p.DP.Pad) < p.NumTokens():
		return fmt.Errorf("%s: dp rank %d pads %d tokens to %d rows", Name, rank, p.NumTokens(), p.DP.Pad)
	}
	par.dpPad = int(p.DP.Pad)
	if p.NumTokens() > 0 {
		return r.forward(p, logits)
	}
	if len(p.LogitsIndices) > 0 || len(logits) > 0 {
		return fmt.Errorf("%s: an idle plan asks for %d logits rows", Name, len(p.LogitsIndices))
	}
	for li := range m.W.Layers {
		if _, err := m.moeDP(&m.W.Layers[li], nil, 0); err != nil {
			return fmt.Errorf("idle step: layer %d: %w", li, err)
		}
	}
	return nil
}

// DPDraft is the draft step of a dp rank that drafts (OpenDPRanks with Options.Drafts),
// for core/dist/dp's Rank.Draft: on a busy rank's plan and result the MTP step as on one
// rank (rejected drafts put back, the next drafts proposed), its MTP block's MoE
// exchanging this rank's rows with the other ranks'; every rank then runs exactly as many
// of those exchanges per step (one per draft), an idle rank or one without draft rows
// running the missing ones with no rows, so that the exchanges always meet.
func (r *Runner) DPDraft(p *engine.BatchPlan, res *engine.StepResult) error {
	m := r.Model
	par := &m.par
	if !par.dp || r.drafts == 0 {
		return fmt.Errorf("%s: DPDraft on a runner not opened for DP-attention with drafts", Name)
	}
	before := par.dpExchanges
	if p.NumSeqs() > 0 {
		if err := r.draft(p, res); err != nil {
			return err
		}
	}
	ran := par.dpExchanges - before
	if ran > r.drafts {
		return fmt.Errorf("%s: the draft step ran %d MTP exchanges, want at most %d", Name, ran, r.drafts)
	}
	for ; ran < r.drafts; ran++ {
		if _, err := m.moeDP(&m.W.MTP.Block, nil, 0); err != nil {
			return fmt.Errorf("draft step: mtp: %w", err)
		}
	}
	return nil
}

// moeDP is moe under DP-attention, after the routing: the routed experts' sum of this
// rank's n rows of x, by the exchange of m's dispatch over the dp group (padded with
// m.par.dpPad−n dummy rows routed to no expert), plus the shared expert's output. n may be
// 0 (an idle rank). The routes are m.moeBuf's. Under attention TP the dp rank's T ranks
// hold the same rows: only its first brings them to the exchange (the others bring none,
// so the experts run each row once, not T times), and adds their routed sums to its
// shared-expert partial before the TP all-reduce that the shared expert's split columns
// need anyway, which hands every rank of the dp rank the whole.
func (m *Model) moeDP(l *Layer, x []float32, n int) ([]float32, error) {
	c, s, p := m.Config, &m.moeBuf, &m.par
	h, k := c.HiddenSize, c.NumExpertsPerTok
	p.dpExchanges++
	send := n
	if p.tp > 1 && p.tpRank != 0 {
		send = 0
	}
	routes := ep.Routes{X: x[:send*h], IDs: s.ids[:send*k], Weights: s.weights[:send*k]}
	if rows := max(send, p.dpPad); rows > send {
		routes.X = append(slices.Clone(routes.X), make([]float32, (rows-send)*h)...)
		routes.IDs = slices.Clone(routes.IDs)
		for range (rows - send) * k {
			routes.IDs = append(routes.IDs, ep.Masked)
		}
		routes.Weights = append(slices.Clone(routes.Weights), make([]float32, (rows-send)*k)...)
	}
	out := make([]float32, len(routes.X))
	layer := ep.Layer{Experts: c.NRoutedExperts, Hidden: h, TopK: k}
	exchange := ep.Gather
	if p.dispatch == DispatchAllToAll {
		exchange = ep.AllToAll
	}
	if err := exchange(p.epGroup(), layer, routes, m.expertFunc(l), out); err != nil {
		return nil, err
	}
	out = out[:send*h]
	if n == 0 {
		return out, nil
	}
	shared, err := m.sharedExpert(x, l, n)
	if err != nil {
		return nil, err
	}
	if p.tp > 1 { // the attention's TP group split the shared expert's columns
		for i := range out { // the first TP rank's routed sums (the others' out is empty)
			shared[i] += out[i]
		}
		if err := m.allReduce(shared, "shared and routed experts"); err != nil {
			return nil, err
		}
		return shared, nil
	}
	for i := range out {
		out[i] += shared[i]
	}
	return out, nil
}

// dpRank is this rank's dp rank and the dp group's size: under DP-attention with
// attention TP (OpenDPTPRanks) the world's ranks are dp groups of tp consecutive ranks,
// the routed experts split over all of them (ep = dp·tp); without TP each rank is a dp
// rank.
func (p *parallel) dpRank() (rank, size int) {
	return p.rank / p.tp, p.ep / p.tp
}

// expertFunc runs this rank's routed expert e of layer l (gate_up GEMM, clamped SwiGLU,
// down GEMM) for core/dist/ep.
func (m *Model) expertFunc(l *Layer) ep.ExpertFunc {
	c, p := m.Config, &m.par
	h, in, lim := c.HiddenSize, p.inter, float32(c.SwigluLimit)
	var gateUp, act []float32
	return func(e int, xe []float32, rows int, y []float32) error {
		le := e - p.expLo
		if le < 0 || e >= p.expHi {
			return fmt.Errorf("expert %d is not held by this rank (experts [%d, %d))", e, p.expLo, p.expHi)
		}
		gateUp, act = grow(gateUp, rows*2*in), grow(act, rows*in)
		if err := ref.MatMulT(gateUp, xe, l.GateUp[le*2*in*h:(le+1)*2*in*h], rows, h, 2*in); err != nil {
			return err
		}
		for r := range rows {
			gu := gateUp[r*2*in : (r+1)*2*in]
			swiglu(act[r*in:(r+1)*in], gu[:in], gu[in:], lim)
		}
		return ref.MatMulT(y, act, l.Down[le*h*in:(le+1)*h*in], rows, in, h)
	}
}
