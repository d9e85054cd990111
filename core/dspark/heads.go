package dspark

import (
	"fmt"
	"math"

	"github.com/resin-llm/resin/core/kernels/ref"
)

// GreedyBelow is the temperature under which drafts are chosen by argmax (DeepSpec's
// sample_tokens and logits_to_probs switch at 1e-5).
const GreedyBelow = 1e-5

// Sampling says how Propose draws a block's drafts.
type Sampling struct {
	Temperature float32 // below GreedyBelow: argmax
	// Threshold is the confidence cut: with a confidence head and Threshold > 0 the drafts
	// stop before the first slot whose sigmoid(confidence) is below it. 0: full blocks.
	Threshold float32
	MaxDrafts int // at most this many drafts (≤ 0: the block size)
	// Uniforms holds one number in [0, 1) per slot, the draw of slot i's draft by inverse
	// CDF over its q; needed when sampling, ignored when greedy.
	Uniforms []float64
}

// Proposal is one block's drafts and what verification needs of them.
type Proposal struct {
	Drafts []int32 // d_1..d_n after the confidence cut and MaxDrafts; may be empty
	// Q holds the drafts' distributions: [n, vocab], row i the q that d_{i+1} was drawn
	// from (softmax(Logits_i / T), one-hot at the argmax when greedy). Exact verification
	// accepts d with probability min(1, p(d)/q(d)) and on a rejection draws from
	// normalize(max(0, p − q)).
	Q []float32
	// Chain is every slot's draw ([B]) before the cut; Logits ([B, vocab]) every slot's
	// logits with the Markov bias of its previous token (the anchor, then Chain[i−1]).
	Chain  []int32
	Logits []float32
	// Confidence is the confidence head's logit per slot ([B]), nil without the head.
	Confidence []float32
}

// DraftProb returns q_i(d_i), the probability draft i had under its distribution.
func (p *Proposal) DraftProb(i int) float32 {
	v := len(p.Q) / max(len(p.Drafts), 1)
	return p.Q[i*v+int(p.Drafts[i])]
}

// Propose draws a block's drafts slot by slot (markov_head.py sample_block_tokens, then
// draft_ops.py build_dspark_proposal): slot i's logits get the Markov bias of the previous
// token, its draft is drawn, and it becomes the next slot's previous token; then the
// confidence head cuts the block.
func (d *Drafter) Propose(blk *Block, s Sampling) (*Proposal, error) {
	c := d.Config
	B, V, H, r := c.BlockSize, c.Base.VocabSize, c.Base.HiddenSize, c.MarkovRank
	greedy := s.Temperature < GreedyBelow
	if !greedy && len(s.Uniforms) < B {
		return nil, fmt.Errorf("dspark: propose at temperature %g needs %d uniforms, got %d", s.Temperature, B, len(s.Uniforms))
	}
	if len(blk.Hidden) != B*H || len(blk.Logits) != B*V {
		return nil, fmt.Errorf("dspark: propose: the block holds %d hidden and %d logit values, want %d×%d and %d×%d", len(blk.Hidden), len(blk.Logits), B, H, B, V)
	}
	p := &Proposal{Chain: make([]int32, B), Logits: make([]float32, B*V)}
	copy(p.Logits, blk.Logits)
	probs := make([]float32, B*V)
	if c.Confidence {
		p.Confidence = make([]float32, B)
	}
	state := make([]float32, r) // the rnn head's, zero at the block's start
	z := make([]float32, r)
	prev := blk.Anchor
	for i := range B {
		h := blk.Hidden[i*H : (i+1)*H]
		row := p.Logits[i*V : (i+1)*V]
		var e []float32
		if r > 0 {
			e = d.W.MarkovW1[int(prev)*r : int(prev+1)*r]
			d.markovLatent(z, state, e, h)
			for t := range V { // bias = markov_w2 · z
				w2 := d.W.MarkovW2[t*r : (t+1)*r]
				var acc float32
				for j := range r {
					acc += w2[j] * z[j]
				}
				row[t] += acc
			}
		}
		if c.Confidence {
			acc := d.W.ConfB[0]
			for j := range H {
				acc += d.W.ConfW[j] * h[j]
			}
			if c.ConfidenceMarkov {
				for j := range r {
					acc += d.W.ConfW[H+j] * e[j]
				}
			}
			p.Confidence[i] = acc
		}
		q := probs[i*V : (i+1)*V]
		if greedy {
			clear(q)
			p.Chain[i] = int32(ref.Argmax(row))
			q[p.Chain[i]] = 1
		} else {
			softmaxT(q, row, s.Temperature)
			p.Chain[i] = drawInverseCDF(q, s.Uniforms[i])
		}
		prev = p.Chain[i]
	}
	n := B
	if c.Confidence && s.Threshold > 0 {
		for i, l := range p.Confidence {
			if sigmoid(l) < s.Threshold {
				n = i
				break
			}
		}
	}
	if s.MaxDrafts > 0 {
		n = min(n, s.MaxDrafts)
	}
	p.Drafts = p.Chain[:n:n]
	p.Q = probs[: n*V : n*V]
	return p, nil
}

// markovLatent writes the rank-r vector whose markov_w2 projection is the slot's bias:
// vanilla e; gated sigmoid(gate_proj([h; e]))·e; rnn tanh(output) of one GRU-like step
// over [state; e; h], updating state.
func (d *Drafter) markovLatent(z, state, e, h []float32) {
	c, w := d.Config, d.W
	r, H := c.MarkovRank, c.Base.HiddenSize
	switch c.MarkovHead {
	case MarkovVanilla:
		copy(z, e)
	case MarkovGated:
		in := H + r
		for j := range r {
			row := w.GateW[j*in : (j+1)*in]
			acc := w.GateB[j]
			for t := range H {
				acc += row[t] * h[t]
			}
			for t := range r {
				acc += row[H+t] * e[t]
			}
			z[j] = sigmoid(acc) * e[j]
		}
	case MarkovRNN:
		in := 2*r + H
		proj := make([]float32, 3*r)
		for j := range proj {
			row := w.JointW[j*in : (j+1)*in]
			acc := w.JointB[j]
			for t := range r {
				acc += row[t]*state[t] + row[r+t]*e[t]
			}
			for t := range H {
				acc += row[2*r+t] * h[t]
			}
			proj[j] = acc
		}
		for j := range r {
			g := sigmoid(proj[j])
			cand := float32(math.Tanh(float64(proj[r+j])))
			state[j] = g*state[j] + (1-g)*cand
			z[j] = float32(math.Tanh(float64(proj[2*r+j])))
		}
	}
}

func sigmoid(x float32) float32 { return float32(1 / (1 + math.Exp(-float64(x)))) }

// softmaxT writes softmax(logits / t) to q, the sum in float64.
func softmaxT(q, logits []float32, t float32) {
	mx := float32(math.Inf(-1))
	for _, l := range logits {
		mx = max(mx, l/t)
	}
	var sum float64
	for i, l := range logits {
		e := math.Exp(float64(l/t - mx))
		q[i] = float32(e)
		sum += e
	}
	for i := range q {
		q[i] = float32(float64(q[i]) / sum)
	}
}

// drawInverseCDF returns the first index whose cumulative probability exceeds u, or the
// last index with positive probability when rounding leaves u past the total.
func drawInverseCDF(q []float32, u float64) int32 {
	var cum float64
	last := int32(-1)
	for i, p := range q {
		if p <= 0 {
			continue
		}
		cum += float64(p)
		last = int32(i)
		if u < cum {
			return int32(i)
		}
	}
	return last
}
