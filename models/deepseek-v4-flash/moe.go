package deepseekv4flash

import (
	"cmp"
	"fmt"
	"math"

	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/dist/ep"
	"github.com/resin-llm/resin/core/kernels/ref"
)

// moeScratch is the MoE's working memory. It lives on the Model and is reused by every
// layer and step, so that the MoE allocates nothing once it has grown to the largest chunk.
type moeScratch struct {
	logits  []float32       // [n, experts] router logits
	scores  []float32       // [experts] one token's unbiased scores
	choice  []float32       // [experts] one token's biased scores, -Inf once picked
	ids     []int32         // [n, topK] the expert of each (token, slot) pair
	weights []float32       // [n, topK] its routing weight
	start   []int           // [experts+1] each expert's first pair in pairs
	cursor  []int           // [experts] fill position of the counting sort
	pairs   []int32         // [n·topK] pair indices (token·topK + slot), grouped by expert
	parts   []expertScratch // per participant of ref's pool
	run     expertCall      // the call runExperts serves
	runFn   func(part, lo, hi int)
	y       []float32 // [n·topK, hidden] the experts' output rows, in pairs' order
	gate    []float32 // [n, moeInter] the shared expert's gate, then its activation
	up      []float32 // [n, moeInter] the shared expert's up
	shared  []float32 // [n, hidden] the shared expert's output
	out     []float32 // [n, hidden] the MoE's output
}

// expertCall is what runExperts reads of one moe call.
type expertCall struct {
	x        []float32 // [n, hidden] the MoE's input
	l        *Layer
	k, h, in int
	e0       int // the first expert this rank holds (experts [e0, e0+len) run)
	lim      float32
}

// runExperts runs experts e0+[lo, hi) as participant part of ref's pool: each expert's rows
// gathered, its gate_up GEMM, the clamped SwiGLU and its down GEMM, whose rows go to s.y
// at the expert's pairs.
func (s *moeScratch) runExperts(part, lo, hi int) {
	c, ps := &s.run, &s.parts[part]
	h, in := c.h, c.in
	for ex := lo + c.e0; ex < hi+c.e0 && ps.err == nil; ex++ {
		pairs := s.pairs[s.start[ex]:s.start[ex+1]]
		rows := len(pairs)
		if rows == 0 {
			continue
		}
		ps.x = grow(ps.x, rows*h)
		for i, p := range pairs {
			t := int(p) / c.k
			copy(ps.x[i*h:(i+1)*h], c.x[t*h:(t+1)*h])
		}
		ps.gateUp, ps.act = grow(ps.gateUp, rows*2*in), grow(ps.act, rows*in)
		le := ex - c.e0 // the expert's index among those this rank holds
		if ps.err = matMulT(ps.gateUp, ps.x, expertSlice(c.l.GateUp, le, 2*in*h), c.l.cpu.expert(le, false), rows, h, 2*in); ps.err != nil {
			return
		}
		for r := range rows {
			gu := ps.gateUp[r*2*in : (r+1)*2*in]
			swiglu(ps.act[r*in:(r+1)*in], gu[:in], gu[in:], c.lim)
		}
		ps.err = matMulT(s.y[s.start[ex]*h:s.start[ex+1]*h], ps.act, expertSlice(c.l.Down, le, h*in), c.l.cpu.expert(le, true), rows, in, h)
	}
}

// expertScratch is one participant's working memory for one routed expert.
type expertScratch struct {
	x      []float32 // [rows, hidden] the expert's gathered input rows
	gateUp []float32 // [rows, 2·moeInter]
	act    []float32 // [rows, moeInter]
	err    error     // the first GEMM error met
}

// grow returns buf resized to n values, reallocated only when its capacity is short. The
// values are not cleared.
func grow[T any](buf []T, n int) []T {
	if cap(buf) < n {
		return make([]T, n)
	}
	return buf[:n]
}

// moe runs the routed experts and the shared expert over every row of x ([n, hidden]).
// Each token picks its experts (hash routing by token id, or learned routing); the
// (token, slot) pairs are grouped by expert with a counting sort; each expert runs as two
// GEMMs over the rows routed to it (gate_up, then down), and its weighted output rows are
// added back to their tokens, expert by expert as transformers' index_add_ does; the shared
// expert then runs as GEMMs over all rows. The result is scratch of m, valid until the
// next call.
func (m *Model) moe(l *Layer, kind string, x []float32, tokens []int32) ([]float32, error) {
	c, s := m.Config, &m.moeBuf
	n, h, e, k, in := len(tokens), c.HiddenSize, c.NRoutedExperts, c.NumExpertsPerTok, m.par.inter
	s.logits = grow(s.logits, n*e)
	if err := ref.MatMulT(s.logits, x, l.Router, n, h, e); err != nil {
		return nil, err
	}
	if err := m.route(l, kind, tokens); err != nil {
		return nil, err
	}
	if m.par.dp {
		return m.moeDP(l, x, n) // DP-attention: this rank's rows only (dp.go)
	}
	s.groupByExpert(e)

	// The experts run on ref's pool, a participant one expert at a time; their rows are
	// then added to their tokens expert by expert, as transformers' index_add_ does.
	lim := float32(c.SwigluLimit)
	s.y = grow(s.y, len(s.pairs)*h)
	for len(s.parts) < ref.Parts() {
		s.parts = append(s.parts, expertScratch{})
	}
	if s.runFn == nil {
		s.runFn = s.runExperts // bound once: ParallelRange then allocates nothing
	}
	s.out = grow(s.out, n*h)
	out := s.out
	if m.par.ep > 1 && m.par.dispatch == DispatchAllToAll {
		if err := m.allToAllExperts(l, x, out); err != nil {
			return nil, err
		}
	} else {
		// This rank's experts (all of them on one rank) over every row routed to them.
		p := &m.par
		s.run = expertCall{x: x, l: l, k: k, h: h, in: in, e0: p.expLo, lim: lim}
		ref.ParallelRange(p.expHi-p.expLo, 1, s.runFn)
		s.run = expertCall{}
		var err error
		for i := range s.parts {
			err = cmp.Or(err, s.parts[i].err)
			s.parts[i].err = nil
		}
		if err != nil {
			return nil, err
		}
		clear(out)
		for i, pr := range s.pairs[s.start[p.expLo]:s.start[p.expHi]] {
			t, w := int(pr)/k, s.weights[pr]
			o, y := out[t*h:(t+1)*h], s.y[(s.start[p.expLo]+i)*h:(s.start[p.expLo]+i+1)*h]
			for j := range o {
				o[j] += y[j] * w
			}
		}
	}

	shared, err := m.sharedExpert(x, l, n)
	if err != nil {
		return nil, err
	}
	p := &m.par
	switch {
	case p.ep > 1 && p.dispatch == DispatchGather && p.tp > 1 && p.tp <= p.ep:
		// TP × EP with the tp group inside the ep group: this rank's experts and, on the
		// ep group's first tp group (every rank when equal), its columns of the shared
		// one, summed at once.
		if p.epRank < p.tp {
			for i := range out {
				out[i] += shared[i]
			}
		}
		return out, ep.CombineReplicated(p.epGroup(), out, n, h)
	case p.ep > 1 && p.dispatch == DispatchGather:
		if err := ep.CombineReplicated(p.epGroup(), out, n, h); err != nil {
			return nil, err
		}
	}
	if p.ep > 1 && p.tp > 1 {
		// All-to-all gave the routed sum, or the ep group's combine did not span the tp
		// group (EP < TP): the shared expert's columns still need theirs.
		if err := m.allReduce(shared, "shared expert"); err != nil {
			return nil, err
		}
	}
	for i := range out {
		out[i] += shared[i]
	}
	if p.ep > 1 {
		return out, nil
	}
	// Under TP each rank summed its columns of every expert: one all-reduce.
	return out, m.allReduce(out, "moe")
}

// allToAllExperts computes the routed experts' sum of every row of x into out with the
// experts spread over the ep group by all-to-all-v: this rank sends its share of the rows
// (ep.RowShare) to the experts' ranks, runs its experts on what it receives (ep.AllToAll),
// and the group all-gathers the shares' sums. The routes are m.moeBuf's.
func (m *Model) allToAllExperts(l *Layer, x, out []float32) error {
	c, s, p := m.Config, &m.moeBuf, &m.par
	h, k, in := c.HiddenSize, c.NumExpertsPerTok, p.inter
	n := len(x) / h
	lo, hi := ep.RowShare(n, p.epRank, p.ep)
	lim := float32(c.SwigluLimit)
	var gateUp, act []float32
	run := func(e int, xe []float32, rows int, y []float32) error {
		le := e - p.expLo
		gateUp, act = grow(gateUp, rows*2*in), grow(act, rows*in)
		if err := matMulT(gateUp, xe, expertSlice(l.GateUp, le, 2*in*h), l.cpu.expert(le, false), rows, h, 2*in); err != nil {
			return err
		}
		for r := range rows {
			gu := gateUp[r*2*in : (r+1)*2*in]
			swiglu(act[r*in:(r+1)*in], gu[:in], gu[in:], lim)
		}
		return matMulT(y, act, expertSlice(l.Down, le, h*in), l.cpu.expert(le, true), rows, in, h)
	}
	layer := ep.Layer{Experts: c.NRoutedExperts, Hidden: h, TopK: k}
	routes := ep.Routes{X: x[lo*h : hi*h], IDs: s.ids[lo*k : hi*k], Weights: s.weights[lo*k : hi*k]}
	mine := make([]float32, (hi-lo)*h)
	if err := ep.AllToAll(p.epGroup(), layer, routes, run, mine); err != nil {
		return err
	}
	all, err := p.epGroup().AllGatherV(dist.F32Bytes(mine))
	if err != nil {
		return fmt.Errorf("ep: gather the shares: %w", err)
	}
	off := 0
	for q, b := range all {
		ql, qh := ep.RowShare(n, q, p.ep)
		if len(b) != 4*(qh-ql)*h {
			return fmt.Errorf("ep: rank %d sent %d bytes of its share, want %d", q, len(b), 4*(qh-ql)*h)
		}
		off += copy(dist.F32Bytes(out)[off:], b)
	}
	return nil
}

// route picks each token's experts and their weights from the router logits in m's
// scratch: hash routing reads tid2eid by token id, learned routing takes the top-k of
// score + correction bias (the lower expert first on a tie, as a stable descending sort);
// either way a weight is the expert's unbiased score over the picked scores' sum, times
// routed_scaling_factor.
func (m *Model) route(l *Layer, kind string, tokens []int32) error {
	c, s := m.Config, &m.moeBuf
	n, e, k := len(tokens), c.NRoutedExperts, c.NumExpertsPerTok
	s.ids, s.weights = grow(s.ids, n*k), grow(s.weights, n*k)
	s.scores, s.choice = grow(s.scores, e), grow(s.choice, e)
	scale := float32(c.RoutedScalingFactor)
	for t, tok := range tokens {
		for i, v := range s.logits[t*e : (t+1)*e] {
			s.scores[i] = score(c.ScoringFunc, v)
		}
		ids := s.ids[t*k : (t+1)*k]
		if kind == HashMoE {
			copy(ids, l.Tid2Eid[int(tok)*k:(int(tok)+1)*k])
			for _, id := range ids {
				if id < 0 || int(id) >= e {
					return fmt.Errorf("moe: tid2eid routes token %d to expert %d of %d", tok, id, e)
				}
			}
		} else {
			for i := range s.choice {
				s.choice[i] = s.scores[i] + l.RouteBias[i]
			}
			topK(ids, s.choice)
		}
		var sum float32
		for _, id := range ids {
			sum += s.scores[id]
		}
		for j, id := range ids {
			s.weights[t*k+j] = s.scores[id] / (sum + 1e-20) * scale
		}
	}
	return nil
}

// groupByExpert sorts the pairs of s.ids by expert (a counting sort, tokens ascending
// within an expert): expert ex's pairs are s.pairs[s.start[ex]:s.start[ex+1]].
func (s *moeScratch) groupByExpert(experts int) {
	s.start, s.cursor = grow(s.start, experts+1), grow(s.cursor, experts)
	clear(s.start)
	for _, id := range s.ids {
		s.start[id+1]++
	}
	for ex := range experts {
		s.start[ex+1] += s.start[ex]
	}
	copy(s.cursor, s.start[:experts])
	s.pairs = grow(s.pairs, len(s.ids))
	for p, id := range s.ids {
		s.pairs[s.cursor[id]] = int32(p)
		s.cursor[id]++
	}
}

// sharedExpert is the clamped SwiGLU MLP down(silu(min(gate, L))·clamp(up, −L, L)) over
// all n rows of x, as three GEMMs; the result is scratch of m.
func (m *Model) sharedExpert(x []float32, l *Layer, n int) ([]float32, error) {
	c, s := m.Config, &m.moeBuf
	h, in := c.HiddenSize, m.par.sharedInter
	s.gate, s.up, s.shared = grow(s.gate, n*in), grow(s.up, n*in), grow(s.shared, n*h)
	if err := matMulT(s.gate, x, l.SharedGate, l.cpu.at(pSharedGate), n, h, in); err != nil {
		return nil, err
	}
	if err := matMulT(s.up, x, l.SharedUp, l.cpu.at(pSharedUp), n, h, in); err != nil {
		return nil, err
	}
	swiglu(s.gate, s.gate, s.up, float32(c.SwigluLimit))
	return s.shared, matMulT(s.shared, s.gate, l.SharedDown, l.cpu.at(pSharedDown), n, in, h)
}

// swiglu writes silu(min(gate, lim))·clamp(up, −lim, lim); out may alias gate.
func swiglu(out, gate, up []float32, lim float32) {
	// The three have the length of one row by construction: an error is a bug here.
	if err := ref.SiLUMulClamped(out, gate, up, lim); err != nil {
		panic(err)
	}
}

// score is the router's scoring function: sqrt(softplus(x)) (torch's softplus returns x
// above 20) or sigmoid(x).
func score(fn string, x float32) float32 {
	if fn == "sigmoid" {
		return sigmoid(x)
	}
	sp := x
	if x <= 20 {
		sp = float32(math.Log1p(math.Exp(float64(x))))
	}
	return float32(math.Sqrt(float64(sp)))
}

// topK writes the indices of the len(ids) largest values of v, largest first (the lower
// index first on a tie, as a stable descending sort orders them). It overwrites the picked
// values of v with -Inf.
func topK(ids []int32, v []float32) {
	for j := range ids {
		best := 0
		for i := 1; i < len(v); i++ {
			if v[i] > v[best] {
				best = i
			}
		}
		ids[j] = int32(best)
		v[best] = float32(math.Inf(-1))
	}
}
