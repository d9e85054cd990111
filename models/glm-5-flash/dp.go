package glm5flash

import (
	"errors"
	"fmt"
	"slices"

	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/dist/ep"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/core/weights"
)

// DP-attention on the CPU reference forward, as SGLang's --enable-dp-attention with
// --ep N: each dp rank has an engine and a cache pool of its own and runs everything but
// the routed experts (embedding, KDA and MLA attention, hyper-connections, dense and
// shared MLPs, lm_head: replicated weights) for its own plan's rows only; the sparse
// layers' routed experts run expert-parallel over the dp group (the ep group is the dp
// group, each rank holding its range), each rank sending its rows' routes to the experts'
// ranks (ep.AllToAll) or all-gathering every rank's routes (ep.Gather), per Dispatch.
// core/dist/dp's Group steps the ranks together; a rank with no work runs an idle plan,
// which here runs only the sparse layers' exchanges, so that the busy ranks' collectives
// meet. With DPStep.Pad set (graph buckets), every rank pads its MoE rows to that count
// with dummy rows routed to no expert (ep.Masked). With RankOptions.Drafts each dp rank
// drafts with the MTP layer, its routed experts split over the dp group like a sparse
// layer's: the ranks draft together (core/dist/dp's Rank.Draft, TextRunner.DPDraft), each
// running the layer's rounds for its own rows, an idle rank running the rounds' exchanges
// alone.
//
// The routed sum is added to the shared experts' output after the exchange, where one
// rank adds expert by expert onto it: logits may differ from one engine's in the last
// bits, greedy and seeded tokens do not on the tests' model.

// OpenDPRanks opens len(data) dp ranks of the model in dir (LoadText's directory: a
// checkpoint, of which each rank reads its experts, or a config for seeded random
// weights, built once and cut per rank) for DP-attention with expert exchange d: rank r's
// runner is bound to a host pool of o.CacheBytes of its own, and its MoE layers exchange
// rows with the other ranks over data[r]. Each rank's forward is its runner's DPForward,
// run under a core/dist/dp Group whose data communicators may be data.
func OpenDPRanks(dir string, o RankOptions, d Dispatch, data []dist.Communicator) ([]*TextRunner, []*kvslab.Pool, error) {
	return OpenDPTPRanks(dir, o, d, 1, data)
}

// OpenDPTPRanks is OpenDPRanks with attention TP (SGLang's --dp-attention with --tp
// above --dp): the len(world) ranks are dp ranks of tp consecutive ranks each (world rank
// w: dp rank w/tp, tp rank w%tp), the ranks of a dp rank splitting its MLA and KDA heads,
// the dense and shared experts' columns and the vocabulary (Layout's TP, all-reduced over
// them), every rank holding its range of the routed experts (ep = len(world)), with a pool
// of its own (each rank of a TP group caches its own heads' state). A dp rank's ranks must
// run its plans together (core/dist/dp's AttentionTP: its first rank's plans broadcast to
// the others, their CacheOps applied to the others' pools). A dp rank's first rank alone
// gives the exchange its rows; the others get the rows' routed sums through the TP
// all-reduce of the shared experts (moeDP). The ranks open concurrently (their layout's
// groups are split by collectives).
func OpenDPTPRanks(dir string, o RankOptions, d Dispatch, tp int, world []dist.Communicator) ([]*TextRunner, []*kvslab.Pool, error) {
	n, tp := len(world), max(tp, 1)
	if tp > 1 && o.Drafts > 0 {
		return nil, nil, fmt.Errorf("%s: DP-attention with attention tp=%d does not draft yet (MTP drafts run under DP-attention without TP)", Name, tp)
	}
	whole, err := dpWeights(dir, o, d, n, tp)
	if err != nil {
		return nil, nil, err
	}
	runners := make([]*TextRunner, n)
	pools := make([]*kvslab.Pool, n)
	err = dist.OnEveryRank(world, func(r int, comm dist.Communicator) (err error) {
		runners[r], pools[r], err = openDPRank(dir, o, d, tp, comm, whole)
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
func OpenDPRank(dir string, o RankOptions, d Dispatch, comm dist.Communicator) (*TextRunner, *kvslab.Pool, error) {
	return OpenDPTPRank(dir, o, d, 1, comm)
}

// OpenDPTPRank is OpenDPRank with attention TP, as OpenDPTPRanks opens each rank: world
// rank comm.Rank() of comm.Size(), tp rank comm.Rank()%tp of dp rank comm.Rank()/tp.
func OpenDPTPRank(dir string, o RankOptions, d Dispatch, tp int, comm dist.Communicator) (*TextRunner, *kvslab.Pool, error) {
	tp = max(tp, 1)
	if tp > 1 && o.Drafts > 0 {
		return nil, nil, fmt.Errorf("%s: DP-attention with attention tp=%d does not draft yet (MTP drafts run under DP-attention without TP)", Name, tp)
	}
	whole, err := dpWeights(dir, o, d, comm.Size(), tp)
	if err != nil {
		return nil, nil, err
	}
	return openDPRank(dir, o, d, tp, comm, whole)
}

// dpWeights checks DP-attention over n ranks (tp of them in each dp rank's attention TP
// group) with exchange d for the model in dir and returns the whole seeded random
// weights to cut the ranks from, or nil for a checkpoint (each rank reads its shard).
func dpWeights(dir string, o RankOptions, d Dispatch, n, tp int) (*TextWeights, error) {
	if n < 2*tp || n%tp != 0 {
		return nil, fmt.Errorf("%s: DP-attention over %d ranks with attention tp=%d, want 2 or more dp ranks of tp ranks each", Name, n, tp)
	}
	c, err := LoadTextConfig(dir)
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
	return randomWeights(dir, c, o.Seed)
}

// openDPRank opens rank comm.Rank() of comm.Size() (tp ranks a dp rank: 1 without
// attention TP), cut from whole (nil: read from dir's checkpoint), with a pool of
// o.CacheBytes.
func openDPRank(dir string, o RankOptions, d Dispatch, tp int, comm dist.Communicator, whole *TextWeights) (*TextRunner, *kvslab.Pool, error) {
	run, pool, err := openRank(dir, o, Layout{TP: tp, EP: comm.Size(), Dispatch: d}, comm, whole)
	if err != nil {
		return nil, nil, fmt.Errorf("rank %d: %w", comm.Rank(), err)
	}
	run.Model.par.dp = true
	return run, pool, nil
}

// CloseComms closes the rank's communicators: its layout's TP and ep groups and the
// world's. A rank whose step failed mid-way calls it so that its peers, waiting for it in
// an all-reduce or an exchange, fail at once rather than at their deadline (the group is
// done: it runs no more steps).
func (r *TextRunner) CloseComms() {
	p := &r.Model.par
	for _, c := range []dist.Communicator{p.tpComm, p.epComm, p.comm} {
		if c != nil {
			c.Close()
		}
	}
}

// DPForward is the forward of a dp rank (a runner of OpenDPRanks) under core/dist/dp's
// Group: p.DP must name this rank of the group. A plan with tokens runs as the runner's
// forward does, its sparse layers exchanging its rows with the other ranks; an idle plan
// (no tokens, no logits) runs only the sparse layers' exchanges, with DP.Pad dummy rows.
func (r *TextRunner) DPForward(p *engine.BatchPlan, logits []float32) error {
	m := r.Model
	par := &m.par
	rank, size := par.rank/par.tp, par.ep/par.tp // dp groups of tp ranks (OpenDPTPRanks)
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
	for i := range m.W.layers {
		if ly := &m.W.layers[i]; ly.moe != nil {
			if _, err := m.moeDP(ly.moe, nil, 0, nil, nil); err != nil {
				return fmt.Errorf("idle step: layer %d mlp: %w", i, err)
			}
		}
	}
	return nil
}

// DPDraft is the draft step of a dp rank that drafts (OpenDPRanks with
// RankOptions.Drafts), for core/dist/dp's Rank.Draft: on a busy rank's plan and result
// the MTP step as on one rank (KDA states of rejected drafts put back, the next drafts
// proposed), its MTP layer's MoE exchanging this rank's rows with the other ranks'; every
// rank then runs exactly as many of those exchanges per step (one per draft: the first
// round, which also fills the MTP cache of mid-prompt chunks, and each chained one), an
// idle rank or one whose sequences do not draft this step running the missing ones with
// no rows, so that the exchanges always meet.
func (r *TextRunner) DPDraft(p *engine.BatchPlan, res *engine.StepResult) error {
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
		if _, err := m.moeDP(m.W.mtp.moe, nil, 0, nil, nil); err != nil {
			return fmt.Errorf("draft step: mtp: %w", err)
		}
	}
	return nil
}

// moeDP is moe under DP-attention, after the routing (ids, wts: [T, K]): the shared
// experts' output of this rank's T rows of x plus the routed experts' sum, by the exchange
// of m's dispatch over the dp group (padded with m.par.dpPad−T dummy rows routed to no
// expert). T may be 0 (an idle rank). Under attention TP the dp rank's ranks hold the
// same rows: only its first brings them to the exchange (so the experts run each row
// once, not once per TP rank) and adds their routed sums to its shared-experts partial
// before the TP all-reduce the shared experts' split columns need anyway.
func (m *TextModel) moeDP(w *moeWeights, x []float32, T int, ids []int32, wts []float32) ([]float32, error) {
	c, p := m.Config, &m.par
	D, K := c.HiddenSize, c.NumExpertsPerTok
	p.dpExchanges++
	send := T
	if p.tp > 1 && p.tpRank != 0 {
		send = 0
	}
	routes := ep.Routes{X: x[:send*D], IDs: ids[:send*K], Weights: wts[:send*K]}
	if rows := max(send, p.dpPad); rows > send {
		routes.X = append(slices.Clone(routes.X), make([]float32, (rows-send)*D)...)
		routes.IDs = slices.Clone(routes.IDs)
		for range (rows - send) * K {
			routes.IDs = append(routes.IDs, ep.Masked)
		}
		routes.Weights = append(slices.Clone(routes.Weights), make([]float32, (rows-send)*K)...)
	}
	routed := make([]float32, len(routes.X))
	layer := ep.Layer{Experts: c.NRoutedExperts, Hidden: D, TopK: K}
	exchange := ep.Gather
	if p.dispatch == DispatchAllToAll {
		exchange = ep.AllToAll
	}
	if err := exchange(p.epGroup(), layer, routes, m.expertFunc(w), routed); err != nil {
		return nil, err
	}
	if T == 0 {
		return nil, nil
	}
	out := m.mlp(&w.shared, x, T, D, float32(c.SwigluLimit))
	if p.tp > 1 {
		for i := range routed[:send*D] { // the first TP rank's routed sums (the others sent none)
			out[i] += routed[i]
		}
		if err := m.allReduce(out, "shared and routed experts"); err != nil { // the shared experts' columns split
			return nil, err
		}
		return out, nil
	}
	for i := range out {
		out[i] += routed[i]
	}
	return out, nil
}

// expertFunc runs this rank's routed expert e of w (gate_up GEMM, clamped SwiGLU, down
// GEMM) for core/dist/ep.
func (m *TextModel) expertFunc(w *moeWeights) ep.ExpertFunc {
	c := m.Config
	D, F := c.HiddenSize, m.moeInter()
	e0, e1 := m.experts()
	return func(e int, xe []float32, n int, y []float32) error {
		le := e - e0
		if le < 0 || e >= e1 {
			return fmt.Errorf("expert %d is not held by this rank (experts [%d, %d))", e, e0, e1)
		}
		gu := m.expertDense(xe, &w.gateUp, le, n, D, 2*F)
		g, u := make([]float32, n*F), make([]float32, n*F)
		for r := range n {
			copy(g[r*F:(r+1)*F], gu[r*2*F:r*2*F+F])
			copy(u[r*F:(r+1)*F], gu[r*2*F+F:(r+1)*2*F])
		}
		clampedSwiGLU(g, u, float32(c.SwigluLimit))
		return m.expertMatMulT(y, g, &w.down, le, n, F, D)
	}
}
