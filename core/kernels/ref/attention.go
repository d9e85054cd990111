package ref

import (
	"fmt"
	"math"
)

// PagedKV is a paged key/value cache in host memory, laid out like a kvslab cache group of
// full attention: a page holds PageTokens tokens, and within a page
//
//	K, V page: [PageTokens, KVHeads, HeadDim]
//
// A token's slot is page*PageTokens + offset-in-page, as in a BatchPlan's slot mapping.
type PagedKV struct {
	K, V       []float32
	PageTokens int
	KVHeads    int
	HeadDim    int
	// PageOffset maps a page id to the element offset of the page's first value in K (and
	// in V when VPageOffset is nil). Nil means pages are packed back to back:
	// page * PageTokens*KVHeads*HeadDim. Page ids are uint32 like kvslab.PageID
	// (slab<<SlotBits | slot), so every bit of an id is a valid page number.
	PageOffset func(page uint32) int
	// VPageOffset, when set, maps a page id to its offset in V; with K and V views of one
	// arena, a page's values can then sit right after its keys.
	VPageOffset func(page uint32) int
}

// PageElems is the number of float32 values one page holds in K (and in V).
func (c *PagedKV) PageElems() int { return c.PageTokens * c.KVHeads * c.HeadDim }

// offsets returns the element offsets of (page, token in page, kv head) in K and in V,
// checked against the slices.
func (c *PagedKV) offsets(op string, page uint32, tok, head int) (k, v int, err error) {
	var kBase int
	if c.PageOffset != nil {
		kBase = c.PageOffset(page)
	} else {
		e := c.PageElems()
		if uint64(page) > uint64(math.MaxInt/e) {
			return 0, 0, fmt.Errorf("ref.%s: page %#x lies outside the cache (%d key and %d value floats)", op, page, len(c.K), len(c.V))
		}
		kBase = int(page) * e
	}
	vBase := kBase
	if c.VPageOffset != nil {
		vBase = c.VPageOffset(page)
	}
	in := (tok*c.KVHeads + head) * c.HeadDim
	if kBase < 0 || vBase < 0 || kBase+in+c.HeadDim > len(c.K) || vBase+in+c.HeadDim > len(c.V) {
		return 0, 0, fmt.Errorf("ref.%s: page %#x lies outside the cache (%d key and %d value floats)", op, page, len(c.K), len(c.V))
	}
	return kBase + in, vBase + in, nil
}

func (c *PagedKV) check(op string) error {
	if c == nil {
		return fmt.Errorf("ref.%s: nil cache", op)
	}
	if c.PageTokens <= 0 || c.KVHeads <= 0 || c.HeadDim <= 0 {
		return fmt.Errorf("ref.%s: cache shape page_tokens=%d kv_heads=%d head_dim=%d must be positive", op, c.PageTokens, c.KVHeads, c.HeadDim)
	}
	return nil
}

// StoreKV writes the keys and values of new tokens into their cache slots.
//
//	k, v: [tokens, KVHeads, HeadDim]   slots: [tokens]   slot = page*PageTokens + offset
//
// A negative slot means "do not store" (a padding token).
func (c *PagedKV) StoreKV(k, v []float32, slots []int64) error {
	if err := c.check("StoreKV"); err != nil {
		return err
	}
	n := len(slots)
	row := c.KVHeads * c.HeadDim
	if err := checkLen("StoreKV", "k", len(k), n*row); err != nil {
		return err
	}
	if err := checkLen("StoreKV", "v", len(v), n*row); err != nil {
		return err
	}
	for t, s := range slots {
		if s < 0 {
			continue
		}
		page, tok := s/int64(c.PageTokens), int(s%int64(c.PageTokens))
		if page > math.MaxUint32 {
			return fmt.Errorf("ref.StoreKV: slot %d of token %d names page %d beyond uint32", s, t, page)
		}
		ko, vo, err := c.offsets("StoreKV", uint32(page), tok, 0)
		if err != nil {
			return err
		}
		// The last kv head was checked; the row's heads are contiguous before it.
		if _, _, err := c.offsets("StoreKV", uint32(page), tok, c.KVHeads-1); err != nil {
			return err
		}
		copy(c.K[ko:ko+row], k[t*row:(t+1)*row])
		copy(c.V[vo:vo+row], v[t*row:(t+1)*row])
	}
	return nil
}

// Attention describes one attention layer for PagedAttention.
type Attention struct {
	Heads int     // query heads; a multiple of the cache's KVHeads (GQA)
	Scale float32 // multiplies q·k; usually 1/sqrt(HeadDim)
	// Window, when positive, limits each query at position p to keys at positions
	// (p-Window, p] (sliding-window attention); 0 means full causal attention.
	Window int
}

// PagedAttention computes causal attention for the newest tokens of one sequence, whose keys
// and values (those new tokens included) are already in the cache. Prefill, a prefill
// chunk and decode are the same call with different numbers of queries.
//
//	q: [nq, Heads, HeadDim]   out: [nq, Heads, HeadDim]
//	pages: the sequence's page table; token t of the sequence is at pages[t/PageTokens],
//	       offset t%PageTokens
//	ctxLen: tokens in the cache for this sequence; query i sits at position ctxLen-nq+i
//	        and attends to positions [max(0, p-Window+1), p]
//	query head h reads kv head h / (Heads/KVHeads)
//
// Scores and the softmax sum are computed in float64. out must not alias q. It allocates
// nothing.
func PagedAttention(out, q []float32, c *PagedKV, pages []uint32, ctxLen, nq int, a Attention) error {
	const op = "PagedAttention"
	if err := c.check(op); err != nil {
		return err
	}
	if a.Heads <= 0 || a.Heads%c.KVHeads != 0 {
		return fmt.Errorf("ref.%s: %d query heads is not a positive multiple of %d kv heads", op, a.Heads, c.KVHeads)
	}
	if nq < 0 || nq > ctxLen {
		return fmt.Errorf("ref.%s: %d queries but only %d tokens in the cache", op, nq, ctxLen)
	}
	if need := (ctxLen + c.PageTokens - 1) / c.PageTokens; len(pages) < need {
		return fmt.Errorf("ref.%s: page table has %d pages, %d tokens need %d", op, len(pages), ctxLen, need)
	}
	d := c.HeadDim
	if err := checkLen(op, "q", len(q), nq*a.Heads*d); err != nil {
		return err
	}
	if err := checkLen(op, "out", len(out), nq*a.Heads*d); err != nil {
		return err
	}
	group := a.Heads / c.KVHeads
	for i := 0; i < nq; i++ {
		p := ctxLen - nq + i
		lo := 0
		if a.Window > 0 {
			lo = max(0, p-a.Window+1)
		}
		for h := 0; h < a.Heads; h++ {
			kvh := h / group
			qv := q[(i*a.Heads+h)*d : (i*a.Heads+h+1)*d]
			o := out[(i*a.Heads+h)*d : (i*a.Heads+h+1)*d]
			// pass 1: mx = max_t score(t), score(t) = Scale · q·k_t for t in [lo, p]
			mx := math.Inf(-1)
			for t := lo; t <= p; t++ {
				ko, _, err := c.offsets(op, pages[t/c.PageTokens], t%c.PageTokens, kvh)
				if err != nil {
					return err
				}
				mx = max(mx, dot(qv, c.K[ko:ko+d])*float64(a.Scale))
			}
			// pass 2: o = Σ_t exp(score(t) − mx) · v_t / Σ_t exp(score(t) − mx)
			clear(o)
			var sum float64
			for t := lo; t <= p; t++ {
				ko, vo, _ := c.offsets(op, pages[t/c.PageTokens], t%c.PageTokens, kvh)
				w := math.Exp(dot(qv, c.K[ko:ko+d])*float64(a.Scale) - mx)
				sum += w
				for j, v := range c.V[vo : vo+d] {
					o[j] += float32(w) * v
				}
			}
			inv := float32(1 / sum)
			for j := range o {
				o[j] *= inv
			}
		}
	}
	return nil
}

// dot returns a·b accumulated in float64.
func dot(a, b []float32) float64 {
	var s float64
	for i, v := range a {
		s += float64(v) * float64(b[i])
	}
	return s
}
