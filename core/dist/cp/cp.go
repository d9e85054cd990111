// Package cp is context parallelism for prefill: one long prompt's tokens split across
// the cp group in contiguous chunks (rank r holds the tokens after those of ranks < r;
// any lengths, zero too), each rank computing its own queries, keys and values. Attention
// all-gathers the keys and values so each rank attends its queries to exactly the keys a
// single rank would (causal, within the window), on core/kernels/ref.
//
// What is left (docs/parallelism.md): the model forward over a CP plan, a zig-zag split
// that balances causal work, ring exchange instead of the all-gather, and decode CP (the
// cache striped across ranks, partial outputs merged by log-sum-exp).
package cp

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/kernels/ref"
)

// Shape is the attention's: query heads, KV heads, head dim and sliding window (0 none).
type Shape struct {
	Heads, KVHeads, HeadDim, Window int
}

// Start returns the position of this rank's first token: the sum of the earlier ranks'
// token counts, each rank passing its own n. Every rank must call it.
func Start(c dist.Communicator, n int) (int, error) {
	all, err := c.AllGatherV(binary.LittleEndian.AppendUint64(nil, uint64(n)))
	if err != nil {
		return 0, fmt.Errorf("cp: token counts: %w", err)
	}
	start := 0
	for r := range c.Rank() {
		if len(all[r]) != 8 {
			return 0, fmt.Errorf("cp: rank %d sent %d bytes for its count", r, len(all[r]))
		}
		start += int(binary.LittleEndian.Uint64(all[r]))
	}
	return start, nil
}

// Attention computes out ([n, Heads, HeadDim]) for this rank's n queries q, its keys k
// and values v ([n, KVHeads, HeadDim], RoPE already applied at the tokens' positions):
// the keys and values of every rank are all-gathered and this rank's queries attend the
// first start+n of them. Every rank of c must call it, a rank without tokens too.
func Attention(c dist.Communicator, s Shape, q, k, v, out []float32) error {
	allK, allV, start, err := Gather(c, s, q, k, v, out)
	if err != nil {
		return err
	}
	return Attend(s, q, allK, allV, start, out)
}

// Gather all-gathers the keys and values of every rank's tokens (k, v: this rank's n,
// [n, KVHeads, HeadDim]) and returns them in token order (the whole prompt's) with start,
// this rank's first token. q and out, this rank's queries and output, are only checked
// against the shape. Every rank of c must call it, a rank without tokens too.
func Gather(c dist.Communicator, s Shape, q, k, v, out []float32) (allK, allV []float32, start int, err error) {
	if s.Heads <= 0 || s.KVHeads <= 0 || s.HeadDim <= 0 || s.Heads%s.KVHeads != 0 {
		return nil, nil, 0, fmt.Errorf("cp: shape %+v", s)
	}
	qd, kvd := s.Heads*s.HeadDim, s.KVHeads*s.HeadDim
	n := len(q) / qd
	if len(q) != n*qd || len(k) != n*kvd || len(v) != n*kvd || len(out) != n*qd {
		return nil, nil, 0, fmt.Errorf("cp: q %d, k %d, v %d, out %d values: not %d tokens of %d query and %d kv values", len(q), len(k), len(v), len(out), n, qd, kvd)
	}
	msg := append(append([]byte(nil), dist.F32Bytes(k)...), dist.F32Bytes(v)...)
	all, err := c.AllGatherV(msg)
	if err != nil {
		return nil, nil, 0, fmt.Errorf("cp: keys and values: %w", err)
	}
	total := 0
	for r, m := range all {
		if len(m)%(8*kvd) != 0 {
			return nil, nil, 0, fmt.Errorf("cp: rank %d sent %d bytes, not tokens of %d keys and values", r, len(m), kvd)
		}
		if r < c.Rank() {
			start += len(m) / (8 * kvd)
		}
		total += len(m) / (8 * kvd)
	}
	allK, allV = make([]float32, 0, total*kvd), make([]float32, 0, total*kvd)
	for _, m := range all {
		t := len(m) / (8 * kvd)
		kr, vr := make([]float32, t*kvd), make([]float32, t*kvd)
		copy(dist.F32Bytes(kr), m[:4*t*kvd])
		copy(dist.F32Bytes(vr), m[4*t*kvd:])
		allK, allV = append(allK, kr...), append(allV, vr...)
	}
	return allK, allV, start, nil
}

// Attend computes out ([n, Heads, HeadDim]) for the n queries q of the tokens at
// start..start+n−1 of a prompt whose keys and values (from its first token) are allK and
// allV: causal, within the window, on core/kernels/ref.
func Attend(s Shape, q, allK, allV []float32, start int, out []float32) error {
	qd, kvd := s.Heads*s.HeadDim, s.KVHeads*s.HeadDim
	n := len(q) / qd
	if n == 0 {
		return nil
	}
	ctx := start + n
	if len(allK) < ctx*kvd || len(allV) < ctx*kvd || len(out) != n*qd {
		return fmt.Errorf("cp: %d keys and %d values for a context of %d tokens, out %d values for %d queries", len(allK)/kvd, len(allV)/kvd, ctx, len(out), n)
	}
	const pt = 16
	pages := (ctx + pt - 1) / pt
	kv := ref.PagedKV{K: make([]float32, pages*pt*kvd), V: make([]float32, pages*pt*kvd), PageTokens: pt, KVHeads: s.KVHeads, HeadDim: s.HeadDim}
	copy(kv.K, allK[:ctx*kvd])
	copy(kv.V, allV[:ctx*kvd])
	table := make([]uint32, pages)
	for i := range table {
		table[i] = uint32(i)
	}
	b := &ref.AttentionBatch{QueryStart: []int32{0, int32(n)}, CtxLen: []int32{int32(ctx)}, PageStart: []int32{0, int32(pages)}, Pages: table}
	a := ref.Attention{Heads: s.Heads, Scale: float32(1 / math.Sqrt(float64(s.HeadDim))), Window: s.Window}
	if err := ref.PagedAttentionBatch(out, q, &kv, b, a); err != nil {
		return fmt.Errorf("cp: %w", err)
	}
	return nil
}
