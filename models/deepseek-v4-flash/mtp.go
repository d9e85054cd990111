package deepseekv4flash

import (
	"fmt"

	"github.com/resin-llm/resin/core/kernels/ref"
)

// MTPForward runs the MTP head over n rows of one sequence: row i reads the main model's
// final hidden streams of position p = st.MTP's length + i (streams: [n, hc, hidden], as
// Forward returns them) and the token that follows it (next[i]), and returns the logits
// of the token after that ([n, vocab]). It extends the MTP block's sliding window in st
// (st.MTP, st.MTPLen).
//
// Layout (the upstream checkpoint's mtp.0.*, as vLLM/SGLang's DeepSeek-V4 MTP reads it):
// x_i = e_proj(enorm(embed(next))) + h_proj(hnorm(stream_i)) for each stream i, one
// decoder block with sliding attention ("main" rotary, at position p) and a learned-routing
// MoE, then the head's own hc_head and norm, and the shared lm_head.
func (m *Model) MTPForward(st *SeqState, streams []float32, next []int32) ([]float32, error) {
	if st.MTP == nil {
		ls := newLayerState(m.Config, SlidingAttention)
		st.MTP = &ls
	}
	logits, _, err := m.mtpForward([]mtpChunk{{state: st.MTP, pos0: st.MTPLen, streams: streams, next: next}}, nil)
	if err != nil {
		return nil, err
	}
	st.MTPLen += len(next)
	return logits, nil
}

// mtpChunk is one sequence's rows for the MTP head: positions pos0, pos0+1, ..., the main
// model's final streams there ([rows, hc, hidden]) and the token after each; state is the
// MTP block's layer state of the sequence.
type mtpChunk struct {
	state   *LayerState
	pos0    int
	streams []float32
	next    []int32
}

// mtpForward runs the MTP head over the rows of every chunk (in chunk order) and returns,
// for the rows listed in rows (flat row indices, ascending; nil: every row), the logits
// ([len(rows), vocab]) and the MTP block's output streams ([len(rows), hc, hidden]),
// which a chained draft reads as the main model's streams.
func (m *Model) mtpForward(chunks []mtpChunk, rows []int) (logits, outStreams []float32, err error) {
	c, w := m.Config, m.W
	if w.MTP == nil {
		return nil, nil, fmt.Errorf("mtp: the checkpoint has no MTP head (mtp.0.*)")
	}
	mt := w.MTP
	h, hc := c.HiddenSize, c.HCMult
	b := batch{start: []int{0}}
	var streams []float32
	states := make([]*LayerState, len(chunks))
	for ci, ch := range chunks {
		n := len(ch.next)
		if len(ch.streams) != n*hc*h {
			return nil, nil, fmt.Errorf("mtp: %d stream values for %d rows of %d×%d", len(ch.streams), n, hc, h)
		}
		for i, t := range ch.next {
			if t < 0 || int(t) >= c.VocabSize {
				return nil, nil, fmt.Errorf("mtp: token id %d outside the vocabulary [0, %d)", t, c.VocabSize)
			}
			b.pos = append(b.pos, int32(ch.pos0+i))
		}
		b.tokens = append(b.tokens, ch.next...)
		b.start = append(b.start, len(b.tokens))
		if len(chunks) == 1 {
			streams = ch.streams
		} else {
			streams = append(streams, ch.streams...)
		}
		states[ci] = ch.state
	}
	n := len(b.tokens)
	eps := float32(c.RMSNormEps)
	e := make([]float32, n*h)
	if err := m.embed(e, b.tokens); err != nil { // under TP: this rank's rows, all-reduced
		return nil, nil, fmt.Errorf("mtp: %w", err)
	}
	if err := ref.RMSNorm(e, e, mt.ENorm, n, h, eps); err != nil {
		return nil, nil, err
	}
	ep, err := linear(e, mt.EProj, n, h, h)
	if err != nil {
		return nil, nil, err
	}
	hs := make([]float32, n*hc*h)
	if err := ref.RMSNorm(hs, streams, mt.HNorm, n*hc, h, eps); err != nil {
		return nil, nil, err
	}
	x, err := linear(hs, mt.HProj, n*hc, h, h)
	if err != nil {
		return nil, nil, err
	}
	for t := range n {
		for i := range hc {
			row := x[(t*hc+i)*h : (t*hc+i+1)*h]
			for j := range h {
				row[j] += ep[t*h+j]
			}
		}
	}
	out, err := m.block(&mt.Block, SlidingAttention, MoE, x, &b, states)
	if err != nil {
		return nil, nil, fmt.Errorf("mtp: %w", err)
	}
	if rows != nil {
		sel := make([]float32, 0, len(rows)*hc*h)
		for _, r := range rows {
			sel = append(sel, out[r*hc*h:(r+1)*hc*h]...)
		}
		out, n = sel, len(rows)
	}
	logits, err = m.head(out, n, mt.HCFn, mt.HCBase, mt.HCScale, mt.Norm)
	return logits, out, err
}
