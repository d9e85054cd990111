// Package cp is context parallelism for prefill: one sequence's new tokens split across
// the cp group in contiguous chunks (rank r holds the tokens after those of ranks < r;
// any lengths, zero too), each rank computing its own queries, keys and values. Attention
// all-gathers the keys and values (with those of the tokens already cached on rank 0,
// when the new tokens continue a sequence: GatherCached) so each rank attends its
// queries to exactly the keys a single rank would (causal, within the window), on
// core/kernels/ref. Prefill runs a model's forward over the group (prefill.go).
//
// What is left (docs/parallelism.md): a zig-zag split that balances causal work, ring
// exchange instead of the all-gather, and decode CP (the cache striped across ranks,
// partial outputs merged by log-sum-exp).
package cp

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/kernels/ref"
	"github.com/resin-llm/resin/core/kvslab"
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
	return GatherCached(c, s, 0, 0, nil, nil, q, k, v, out)
}

// GatherCached is Gather for new tokens that follow cached ones (a later chunk of a
// prompt, or its rest after a prefix hit): the sequence's tokens [0, cached) are in rank
// 0's cache, and rank 0 passes those of them from `from` on (prefixK, prefixV: [cached −
// from, KVHeads, HeadDim]; the others pass nil), which go to every rank with the chunks'.
// allK and allV hold the cached tokens then every rank's new ones, in token order (zeros
// before from: keys no query attends, CachedFrom); start is cached plus the earlier
// ranks' new tokens. Every rank of c must call it with the same cached and from.
func GatherCached(c dist.Communicator, s Shape, cached, from int, prefixK, prefixV, q, k, v, out []float32) (allK, allV []float32, start int, err error) {
	if s.Heads <= 0 || s.KVHeads <= 0 || s.HeadDim <= 0 || s.Heads%s.KVHeads != 0 {
		return nil, nil, 0, fmt.Errorf("cp: shape %+v", s)
	}
	qd, kvd := s.Heads*s.HeadDim, s.KVHeads*s.HeadDim
	n := len(q) / qd
	if len(q) != n*qd || len(k) != n*kvd || len(v) != n*kvd || len(out) != n*qd {
		return nil, nil, 0, fmt.Errorf("cp: q %d, k %d, v %d, out %d values: not %d tokens of %d query and %d kv values", len(q), len(k), len(v), len(out), n, qd, kvd)
	}
	if from < 0 || from > cached {
		return nil, nil, 0, fmt.Errorf("cp: cached tokens from %d of %d", from, cached)
	}
	sent := cached - from // the cached tokens in rank 0's message
	var msg []byte
	if c.Rank() == 0 {
		if len(prefixK) != sent*kvd || len(prefixV) != sent*kvd {
			return nil, nil, 0, fmt.Errorf("cp: %d cached keys and %d values for the %d tokens from %d to %d", len(prefixK)/kvd, len(prefixV)/kvd, sent, from, cached)
		}
		msg = append(append(msg, dist.F32Bytes(prefixK)...), dist.F32Bytes(prefixV)...)
	}
	msg = append(append(msg, dist.F32Bytes(k)...), dist.F32Bytes(v)...)
	all, err := c.AllGatherV(msg)
	if err != nil {
		return nil, nil, 0, fmt.Errorf("cp: keys and values: %w", err)
	}
	if len(all) == 0 || len(all[0]) < 8*sent*kvd {
		return nil, nil, 0, fmt.Errorf("cp: rank 0 sent no room for the %d cached tokens' keys and values", sent)
	}
	prefix := all[0][:8*sent*kvd]
	all[0] = all[0][8*sent*kvd:]
	total := cached
	start = cached
	for r, m := range all {
		if len(m)%(8*kvd) != 0 {
			return nil, nil, 0, fmt.Errorf("cp: rank %d sent %d bytes, not tokens of %d keys and values", r, len(m), kvd)
		}
		if r < c.Rank() {
			start += len(m) / (8 * kvd)
		}
		total += len(m) / (8 * kvd)
	}
	allK, allV = make([]float32, total*kvd), make([]float32, total*kvd)
	copy(dist.F32Bytes(allK[from*kvd:cached*kvd]), prefix[:4*sent*kvd])
	copy(dist.F32Bytes(allV[from*kvd:cached*kvd]), prefix[4*sent*kvd:])
	at := cached * kvd
	for _, m := range all {
		t := len(m) / (8 * kvd)
		copy(dist.F32Bytes(allK[at:at+t*kvd]), m[:4*t*kvd])
		copy(dist.F32Bytes(allV[at:at+t*kvd]), m[4*t*kvd:])
		at += t * kvd
	}
	return allK, allV, start, nil
}

// CachedFrom returns the first of cached tokens that a query after them can attend
// within window (0: no window, every one): the earliest new token, at position cached,
// sees keys from cached − window + 1 on.
func CachedFrom(cached, window int) int {
	if window <= 0 {
		return 0
	}
	return max(0, cached-window+1)
}

// ReadKV copies the keys and values of a sequence's tokens [from, to) out of a paged
// cache, table its page table (token t in page table[t/PageTokens] at t%PageTokens, as
// the engine's slots): [to − from, KVHeads, HeadDim] each.
func ReadKV(kv *ref.PagedKV, table []kvslab.PageID, from, to int) (k, v []float32, err error) {
	if kv == nil || kv.PageTokens <= 0 || kv.KVHeads <= 0 || kv.HeadDim <= 0 {
		return nil, nil, fmt.Errorf("cp: read keys and values: cache %v", kv)
	}
	if from < 0 || to < from || (to > 0 && (to-1)/kv.PageTokens >= len(table)) {
		return nil, nil, fmt.Errorf("cp: read tokens [%d, %d) through a page table of %d pages of %d tokens", from, to, len(table), kv.PageTokens)
	}
	row, e := kv.KVHeads*kv.HeadDim, kv.PageElems()
	k, v = make([]float32, (to-from)*row), make([]float32, (to-from)*row)
	for t := from; t < to; t++ {
		page := uint32(table[t/kv.PageTokens])
		var kb int
		if kv.PageOffset != nil {
			kb = kv.PageOffset(page)
		} else {
			kb = int(page) * e
		}
		vb := kb
		if kv.VPageOffset != nil {
			vb = kv.VPageOffset(page)
		}
		in := (t % kv.PageTokens) * row
		if kb < 0 || vb < 0 || kb+in+row > len(kv.K) || vb+in+row > len(kv.V) {
			return nil, nil, fmt.Errorf("cp: read token %d: page %#x lies outside the cache (%d key and %d value floats)", t, page, len(kv.K), len(kv.V))
		}
		copy(k[(t-from)*row:], kv.K[kb+in:kb+in+row])
		copy(v[(t-from)*row:], kv.V[vb+in:vb+in+row])
	}
	return k, v, nil
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
