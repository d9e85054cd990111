package glm5flash

import (
	"errors"
	"fmt"

	"github.com/resin-llm/resin/core/kernels/ref"
)

// ErrNoMTP is returned when MTP drafts are asked of a model whose checkpoint has no MTP
// layer (layers.{num_hidden_layers}.eh_proj.weight).
var ErrNoMTP = errors.New("the checkpoint has no MTP layer (layers.{num_hidden_layers}.eh_proj.weight)")

// HasMTP reports whether the model's checkpoint has the MTP layer.
func (m *TextModel) HasMTP() bool { return m.W.mtp != nil }

// MTPChunk is one sequence's rows for the MTP layer: the main model's positions Pos0,
// Pos0+1, ..., each with its final hidden state (Hidden [n, hidden], ForwardHidden's
// rows) and the token that follows it (Next [n]). State is the MTP layer's attention
// state of the sequence (NewMTPState, or the runner's pages), whose row p belongs to
// position p; Rows lists the rows (indices into Next) that need logits, nil meaning all.
type MTPChunk struct {
	State  *TextLayerState
	Pos0   int
	Hidden []float32
	Next   []int32
	Rows   []int
}

// NewMTPState returns the MTP layer's empty attention state of a new sequence, in Go
// memory.
func (m *TextModel) NewMTPState() *TextLayerState {
	c := m.Config
	return &TextLayerState{Latent: &growRows{dim: c.KVLoraRank}, IdxKey: &growRows{dim: c.IndexHeadDim},
		IdxGate: &growRows{dim: c.IndexHeadDim}, Pools: &growRows{dim: c.IndexHeadDim}}
}

// MTPForward runs the MTP layer over the rows of every chunk and returns the logits of the
// token after each row's Next for the chunks' Rows, chunk after chunk ([rows, vocab]),
// and the layer's output of every row ([Σ len(Next), hidden], before shared_head.norm),
// which a chained draft reads as its hidden state. Each state advances by its chunk.
//
// Row p of a sequence: x = eh_proj([enorm(embed(next)); hnorm(hidden_p)]), then one
// pre-norm decoder layer without mHC (x += MLA-DSA(input_layernorm(x)) over rows ≤ p with
// the layer's own indexer; x += MoE(post_attention_layernorm(x))), then
// shared_head.head(shared_head.norm(x)), as vLLM and SGLang run the glm5_next MTP layer.
func (m *TextModel) MTPForward(chunks []MTPChunk) (logits, out []float32, err error) {
	c, mt := m.Config, m.W.mtp
	if mt == nil {
		return nil, nil, fmt.Errorf("mtp: %w", ErrNoMTP)
	}
	D := c.HiddenSize
	eps := float32(c.RMSNormEps)
	var next []int32
	var hidden []float32
	off := make([]int, len(chunks)+1)
	for i, ch := range chunks {
		if len(ch.Hidden) != len(ch.Next)*D {
			return nil, nil, fmt.Errorf("mtp: %d hidden values for %d rows of %d", len(ch.Hidden), len(ch.Next), D)
		}
		next = append(next, ch.Next...)
		hidden = append(hidden, ch.Hidden...)
		off[i+1] = len(next)
	}
	T := len(next)
	if T == 0 {
		return nil, nil, nil
	}
	e := make([]float32, T*D)
	if err := m.embed(e, next); err != nil { // under TP: this rank's rows, all-reduced
		return nil, nil, fmt.Errorf("mtp: %w", err)
	}
	if err := ref.RMSNorm(e, e, mt.eNorm, T, D, eps); err != nil {
		return nil, nil, err
	}
	h := make([]float32, T*D)
	if err := ref.RMSNorm(h, hidden, mt.hNorm, T, D, eps); err != nil {
		return nil, nil, err
	}
	eh := make([]float32, T*2*D)
	for t := range T {
		copy(eh[t*2*D:], e[t*D:(t+1)*D])
		copy(eh[t*2*D+D:], h[t*D:(t+1)*D])
	}
	x := dense(eh, mt.ehProj, T, 2*D, D)
	a := make([]float32, T*D)
	if err := ref.RMSNorm(a, x, mt.inNorm, T, D, eps); err != nil {
		return nil, nil, err
	}
	att := make([]float32, T*D)
	for ci, ch := range chunks {
		n := off[ci+1] - off[ci]
		if n == 0 {
			continue
		}
		y, _, err := m.mla(mt.mla, ch.State, a[off[ci]*D:off[ci+1]*D], n, ch.Pos0, nil)
		if err != nil {
			return nil, nil, fmt.Errorf("mtp attention: %w", err)
		}
		copy(att[off[ci]*D:], y)
	}
	// Under TP each rank projected its heads: one all-reduce for every chunk.
	if err := m.allReduce(att, "mtp attention"); err != nil {
		return nil, nil, err
	}
	for j, v := range att {
		x[j] += v
	}
	if err := ref.RMSNorm(a, x, mt.postNorm, T, D, eps); err != nil {
		return nil, nil, err
	}
	f, err := m.moe(mt.moe, a, T)
	if err != nil {
		return nil, nil, fmt.Errorf("mtp mlp: %w", err)
	}
	for j, v := range f {
		x[j] += v
	}
	var picked []float32
	for ci, ch := range chunks {
		if ch.Rows == nil {
			picked = append(picked, x[off[ci]*D:off[ci+1]*D]...)
		}
		for _, r := range ch.Rows {
			picked = append(picked, x[(off[ci]+r)*D:(off[ci]+r+1)*D]...)
		}
	}
	n := len(picked) / D
	if n == 0 {
		return nil, x, nil
	}
	if err := ref.RMSNorm(picked, picked, mt.norm, n, D, eps); err != nil {
		return nil, nil, err
	}
	if m.tensorParallel() {
		logits, err := m.vocabParallel(picked, mt.head, n) // this rank's rows of the head
		return logits, x, err
	}
	return dense(picked, mt.head, n, D, c.VocabSize), x, nil
}
