package dspark

import (
	"fmt"
	"unsafe"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kernels/ref"
	"github.com/resin-llm/resin/core/kvslab"
)

// CacheGroupName names the drafter's context cache group in a pool.
const CacheGroupName = "dspark"

// CacheGroup is the kvslab group that holds the draft context (Speculator.Bind): a full
// group of the draft layers, a token's entry their context K and V rows
// ([KVHeads·HeadDim] float32 each). A runner that drafts with DSpark declares it after its
// own groups.
func (d *Drafter) CacheGroup(pageTokens int) kvslab.GroupSpec {
	b := d.Config.Base
	return kvslab.GroupSpec{
		Name: CacheGroupName, Kind: kvslab.Full, Layers: len(d.W.Layers),
		BytesPerToken: 2 * b.NumKeyValueHeads * b.HeadDim * 4, PageTokens: pageTokens,
	}
}

// pagedContext is the draft context kept in a pool's group: per draft layer a paged view
// of its keys and values, a page holding each layer's K block then its V block.
type pagedContext struct {
	g      int
	layers []ref.PagedKV
	scr    []*Context // per drafting sequence of a step: the context gathered from the pages

	dev    PagedDevice       // BindDevice's: the group lives there (layers and scr unused)
	tables [][]kvslab.PageID // per drafting sequence of a step: its pages of the group
	lens   []int             // and its context length
}

// PagedDevice holds the drafter's group where the host cannot address it (a GPU runner's
// device pool: BindDevice). The Speculator computes the context K/V of every fed row on
// the host and hands them to StoreKV; the block forward then reads each sequence's
// context through its page table of the group.
type PagedDevice interface {
	// StoreKV writes draft layer l's context K and V rows ([len(slots), KVHeads·HeadDim]
	// float32 each, valid only until it returns) at slots of the group.
	StoreKV(l int, k, v []float32, slots []int64) error
	// Blocks is Drafter.Blocks for sequences whose draft contexts are the first lens[i]
	// positions of the group, read through tables[i], anchored at anchors[i].
	Blocks(tables [][]kvslab.PageID, lens []int, anchors []int32) ([]*Block, error)
}

// Bind makes the Speculator keep the draft context in group g of pool (CacheGroup's spec,
// host memory) instead of a host buffer per request: each step writes the context K/V of
// every fed row at the plan's slots of that group, as the target writes its own cache, and
// reads a sequence's context back through its page table before drafting. The engine then
// rolls back rejected drafts' entries, keeps the entries of a cached prefix and restores
// them on a prefix hit, so a request that starts from a prefix hit or comes back after a
// preemption drafts from its first step. Call it before the runner serves an engine.
func (s *Speculator) Bind(pool *kvslab.Pool, g int) error {
	want, err := s.checkGroup(pool, g)
	if err != nil {
		return err
	}
	hm, ok := pool.Arena().(kvslab.HostMemory)
	if !ok {
		return fmt.Errorf("dspark: bind: the draft context needs a host-memory arena, got %T", pool.Arena())
	}
	raw := hm.Bytes(0, hm.Size())
	if len(raw) < 4 {
		return fmt.Errorf("dspark: bind: arena of %d bytes", len(raw))
	}
	all := unsafe.Slice((*float32)(unsafe.Pointer(&raw[0])), len(raw)/4)
	b := s.Drafter.Config.Base
	pt := pool.BlockTokens()
	e := pt * b.NumKeyValueHeads * b.HeadDim
	pc := &pagedContext{g: g, layers: make([]ref.PagedKV, want.Layers)}
	for l := range pc.layers {
		off := l * 2 * e
		pc.layers[l] = ref.PagedKV{
			K: all[off:], V: all[off+e:], PageTokens: pt, KVHeads: b.NumKeyValueHeads, HeadDim: b.HeadDim,
			PageOffset: func(page uint32) int { return int(pool.PageOffset(g, kvslab.PageID(page)) / 4) },
		}
	}
	s.cache = pc
	return nil
}

// BindDevice is Bind for a pool whose arena is not host memory: group g of pool
// (CacheGroup's spec) holds the draft context, and dev writes it and runs the blocks over
// it. As with Bind, prefix hits and preempted requests draft from their first step.
func (s *Speculator) BindDevice(pool *kvslab.Pool, g int, dev PagedDevice) error {
	if _, err := s.checkGroup(pool, g); err != nil {
		return err
	}
	if dev == nil {
		return fmt.Errorf("dspark: bind: no device for group %d", g)
	}
	s.cache = &pagedContext{g: g, dev: dev}
	return nil
}

// checkGroup checks that group g of pool is the drafter's CacheGroup and returns its spec.
func (s *Speculator) checkGroup(pool *kvslab.Pool, g int) (kvslab.GroupSpec, error) {
	groups := pool.Groups()
	want := s.Drafter.CacheGroup(pool.BlockTokens())
	if g < 0 || g >= len(groups) {
		return want, fmt.Errorf("dspark: bind: pool has %d groups, no group %d", len(groups), g)
	}
	if got := groups[g]; got.Kind != want.Kind || got.Layers != want.Layers || got.BytesPerToken != want.BytesPerToken {
		return want, fmt.Errorf("dspark: bind: pool group %d %+v is not the drafter's %+v", g, got, want)
	}
	return want, nil
}

// store writes the context K/V of n fed rows (features [n, FeatureDim] at positions pos)
// at their slots of the group.
func (s *Speculator) store(features []float32, pos []int32, slots []int64) error {
	return s.Drafter.contextKV(features, pos, len(slots), func(l int, k, v []float32) error {
		if s.cache.dev != nil {
			return s.cache.dev.StoreKV(l, k, v, slots)
		}
		return s.cache.layers[l].StoreKV(k, v, slots)
	})
}

// gather reads positions [0, n) of a sequence's draft context through its page table
// into ctx.
func (s *Speculator) gather(ctx *Context, table []kvslab.PageID, n int) error {
	b := s.Drafter.Config.Base
	kvd := b.NumKeyValueHeads * b.HeadDim
	for l := range ctx.K {
		kv := &s.cache.layers[l]
		ck, cv := grow(&ctx.K[l], n*kvd), grow(&ctx.V[l], n*kvd)
		for q := range n {
			pi := q / kv.PageTokens
			if pi >= len(table) || table[pi] == kvslab.NoPage {
				return fmt.Errorf("dspark: draft context: no page for position %d", q)
			}
			at := kv.PageOffset(uint32(table[pi])) + (q%kv.PageTokens)*kvd
			if at < 0 || at+kvd > len(kv.K) || at+kvd > len(kv.V) {
				return fmt.Errorf("dspark: draft context: page %d of position %d is outside the arena", table[pi], q)
			}
			copy(ck[q*kvd:(q+1)*kvd], kv.K[at:at+kvd])
			copy(cv[q*kvd:(q+1)*kvd], kv.V[at:at+kvd])
		}
	}
	ctx.n = n
	return nil
}

// draftPaged is Draft over the paged context: every fed row's context K/V is stored, and
// each sequence with a token this step gathers its context up to the new anchor and
// proposes.
func (s *Speculator) draftPaged(plan *engine.BatchPlan, res *engine.StepResult) error {
	d, pc := s.Drafter, s.cache
	F := d.Config.FeatureDim()
	slots := plan.Groups[pc.g].SlotMapping
	tok := 0
	s.draft, s.ctxs, s.anchors = s.draft[:0], s.ctxs[:0], s.anchors[:0]
	pc.tables, pc.lens = pc.tables[:0], pc.lens[:0]
	for i, id := range plan.ReqIDs {
		a := int(res.Accepted[i])
		tok += a
		st := s.seqs[id]
		if st == nil {
			st = &seqState{}
			s.seqs[id] = st
		}
		lo, hi := int(plan.QueryStart[i]), int(plan.QueryStart[i+1])
		s.trace(plan, res, i, st, a, tok)
		st.prop = nil
		if lo == hi {
			continue
		}
		at := s.firstRow[i]
		if err := s.store(s.tap.Features[at*F:(at+hi-lo)*F], plan.Positions[lo:hi], slots[lo:hi]); err != nil {
			return fmt.Errorf("request %d: draft context: %w", id, err)
		}
		if a == 0 {
			continue
		}
		last := int(plan.LogitsIndices[int(plan.LogitsStart[i])+a-1]) // the last row kept
		n := int(plan.Positions[last]) + 1                            // the new anchor's position
		if n+d.Config.BlockSize > d.rope.MaxPos {
			continue
		}
		if pc.dev != nil {
			pc.tables, pc.lens = append(pc.tables, plan.PageTableOf(pc.g, i)), append(pc.lens, n)
		} else {
			k := len(s.draft)
			for len(pc.scr) <= k {
				pc.scr = append(pc.scr, d.NewContext())
			}
			if err := s.gather(pc.scr[k], plan.PageTableOf(pc.g, i), n); err != nil {
				return fmt.Errorf("request %d: %w", id, err)
			}
			s.ctxs = append(s.ctxs, pc.scr[k])
		}
		s.draft = append(s.draft, i)
		s.anchors = append(s.anchors, res.Tokens[tok-1])
	}
	if pc.dev == nil || len(s.draft) == 0 {
		return s.propose(plan, res)
	}
	blks, err := pc.dev.Blocks(pc.tables, pc.lens, s.anchors)
	if err != nil {
		return err
	}
	return s.fill(plan, res, blks)
}
