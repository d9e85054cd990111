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
	if s.Heads <= 0 || s.KVHeads <= 0 || s.HeadDim <= 0 || s.Heads%s.KVHeads != 0 {
		return fmt.Errorf("cp: shape %+v", s)
	}
	qd, kvd := s.Heads*s.HeadDim, s.KVHeads*s.HeadDim
	n := len(q) / qd
	if len(q) != n*qd || len(k) != n*kvd || len(v) != n*kvd || len(out) != n*qd {
		return fmt.Errorf("cp: q %d, k %d, v %d, out %d values: not %d tokens of %d query and %d kv values", len(q), len(k), len(v), len(out), n, qd, kvd)
	}
	msg := append(append([]byte(nil), dist.F32Bytes(k)...), dist.F32Bytes(v)...)
	all, err := c.AllGatherV(msg)
	if err != nil {
		return fmt.Errorf("cp: keys and values: %w", err)
	}
	start := 0
	for r := range c.Rank() {
		if len(all[r])%(8*kvd) != 0 {
			return fmt.Errorf("cp: rank %d sent %d bytes, not tokens of %d keys and values", r, len(all[r]), kvd)
		}
		start += len(all[r]) / (8 * kvd)
	}
	if n == 0 {
		return nil
	}
	ctx := start + n
	const pt = 16
	pages := (ctx + pt - 1) / pt
	kv := ref.PagedKV{K: make([]float32, pages*pt*kvd), V: make([]float32, pages*pt*kvd), PageTokens: pt, KVHeads: s.KVHeads, HeadDim: s.HeadDim}
	slot := int64(0)
	for r := 0; r <= c.Rank(); r++ {
		m := all[r]
		t := len(m) / (8 * kvd)
		kr, vr := make([]float32, t*kvd), make([]float32, t*kvd)
		copy(dist.F32Bytes(kr), m[:4*t*kvd])
		copy(dist.F32Bytes(vr), m[4*t*kvd:])
		slots := make([]int64, t)
		for i := range slots {
			slots[i] = slot
			slot++
		}
		if err := kv.StoreKV(kr, vr, slots); err != nil {
			return fmt.Errorf("cp: %w", err)
		}
	}
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
