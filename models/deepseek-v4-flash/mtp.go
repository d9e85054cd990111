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
	c, w := m.Config, m.W
	if w.MTP == nil {
		return nil, fmt.Errorf("mtp: the checkpoint has no MTP head (mtp.0.*)")
	}
	mt := w.MTP
	n, h, hc := len(next), c.HiddenSize, c.HCMult
	if len(streams) != n*hc*h {
		return nil, fmt.Errorf("mtp: %d stream values for %d rows of %d×%d", len(streams), n, hc, h)
	}
	if st.MTP == nil {
		ls := newLayerState(c, SlidingAttention)
		st.MTP = &ls
	}
	p0 := st.MTPLen
	b := batch{tokens: next, start: []int{0, n}}
	for i := range n {
		b.pos = append(b.pos, int32(p0+i))
	}
	eps := float32(c.RMSNormEps)
	e := make([]float32, n*h)
	if err := ref.Embedding(e, w.Embed, next, h); err != nil {
		return nil, fmt.Errorf("mtp: %w", err)
	}
	if err := ref.RMSNorm(e, e, mt.ENorm, n, h, eps); err != nil {
		return nil, err
	}
	ep, err := linear(e, mt.EProj, n, h, h)
	if err != nil {
		return nil, err
	}
	hs := make([]float32, n*hc*h)
	if err := ref.RMSNorm(hs, streams, mt.HNorm, n*hc, h, eps); err != nil {
		return nil, err
	}
	x, err := linear(hs, mt.HProj, n*hc, h, h)
	if err != nil {
		return nil, err
	}
	for t := range n {
		for i := range hc {
			row := x[(t*hc+i)*h : (t*hc+i+1)*h]
			for j := range h {
				row[j] += ep[t*h+j]
			}
		}
	}
	out, err := m.block(&mt.Block, SlidingAttention, MoE, x, &b, []*LayerState{st.MTP})
	if err != nil {
		return nil, fmt.Errorf("mtp: %w", err)
	}
	st.MTPLen += n
	return m.head(out, n, mt.HCFn, mt.HCBase, mt.HCScale, mt.Norm)
}
