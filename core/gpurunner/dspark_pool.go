package gpurunner

import (
	"fmt"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/dspark"
	"github.com/resin-llm/resin/core/kernels/cuda"
	"github.com/resin-llm/resin/core/kvslab"
)

// poolArena is the part of the device arena the pool cuts: its first size bytes. DSpark's
// block pages (dsparkScratchSlabs) follow them.
type poolArena struct {
	*cudart.DeviceArena
	size int64
}

func (a poolArena) Size() int64 { return a.size }

// dsparkBlockPages is the most pages a block of B slots touches (positions n…n+B−1 of
// pages of pageTokens).
func dsparkBlockPages(B, pageTokens int) int { return (B-1)/pageTokens + 2 }

// dsparkScratchSlabs is the number of slabs the device arena holds after the pool's
// (Options.DSpark; 0 without): a block's own K/V go to pages there, never to the pool's
// (the pages of positions past the committed ones are not the sequence's, or not yet), so
// that the paged attention reads a sequence's context from the pool's pages of the
// drafter's group (the last of groups) and its block from those, through one page table.
// There is room for every sequence of a step at once; a pool at the most slabs a page id
// addresses shrinks to make room for them in the id space.
func dsparkScratchSlabs(d *dspark.Drafter, groups []kvslab.GroupSpec, z *kvslab.Sizing, maxSeqs int) (int, error) {
	if d == nil {
		return 0, nil
	}
	g := groups[len(groups)-1]
	slots := int(z.SlabBytes / g.PageBytes())
	if slots < 1 {
		return 0, fmt.Errorf("gpurunner: DSpark pages of %d bytes exceed a slab of %d", g.PageBytes(), z.SlabBytes)
	}
	pages := maxSeqs * dsparkBlockPages(d.Config.BlockSize, g.PageTokens)
	n := (pages + slots - 1) / slots
	if n >= kvslab.MaxSlabs {
		return 0, fmt.Errorf("gpurunner: %d slabs for DSpark's blocks exceed the %d a page id addresses", n, kvslab.MaxSlabs)
	}
	// A pool sized to the most slabs a page id addresses (a small model in a large cache)
	// gives the blocks' slabs up from its own: they sit in the same id space.
	z.Slabs = min(z.Slabs, kvslab.MaxSlabs-n)
	return n, nil
}

// dsparkPool is the draft context in the device pool's drafter group
// (dspark.PagedDevice): the Speculator computes each fed row's context K/V on the host and
// StoreKV writes them at the row's slots; Blocks runs DSparkBlocks's forward with the
// attention reading the pool's pages. The engine keeps, rolls back, copies and restores
// that group with the target's, so a prefix hit restores the draft context too.
type dsparkPool struct {
	g       *DSparkBlocks
	pool    *kvslab.Pool
	group   int
	layouts []cuda.KVSlabLayout // per draft layer, float32 elements from the arena's start
	pt      int                 // the pool's page tokens
	slots   int                 // the group's pages per slab
	first   int                 // the first slab after the pool's: the block pages
	scratch int                 // block pages there
	pages   []uint32            // staging: one sequence's page table for the kernel
}

var _ dspark.PagedDevice = (*dsparkPool)(nil)

// newDSparkPool drafts from group g of the runner's pool, with the block pages in the
// scratch slabs after the pool's.
func (r *Runner) newDSparkPool(blocks *DSparkBlocks, g, scratchSlabs int) (*dsparkPool, error) {
	spec := r.pool.Groups()[g]
	b := blocks.d.Config.Base
	p := &dsparkPool{g: blocks, pool: r.pool, group: g, pt: r.pool.BlockTokens(), first: r.pool.Slabs()}
	p.slots = int(r.pool.SlabBytes() / spec.PageBytes())
	p.scratch = scratchSlabs * p.slots
	if r.arena.Size() < int64(p.first+scratchSlabs)*r.pool.SlabBytes() {
		return nil, fmt.Errorf("gpurunner: the device arena of %d bytes lacks DSpark's %d block slabs after the pool's %d", r.arena.Size(), scratchSlabs, p.first)
	}
	for l := range blocks.w.layers {
		lay, err := cuda.NewKVSlabLayout(r.pool.SlabBytes(), spec.PageBytes(), l, p.pt, b.NumKeyValueHeads, b.HeadDim)
		if err != nil {
			return nil, fmt.Errorf("gpurunner: DSpark group: %w", err)
		}
		p.layouts = append(p.layouts, lay)
	}
	return p, nil
}

// elem is the float32 element of slot's entry of layer l (keys; values with v).
func (p *dsparkPool) elem(l int, slot int64, v bool) (int64, error) {
	page, row := kvslab.PageID(slot/int64(p.pt)), int64(slot%int64(p.pt))
	if slot < 0 || page.Slab() >= p.first || page.Slot() >= p.slots {
		return 0, fmt.Errorf("gpurunner: DSpark context slot %d is outside the pool's %d slabs of %d pages", slot, p.first, p.slots)
	}
	lay := p.layouts[l]
	off := lay.KOffset
	if v {
		off = lay.VOffset
	}
	kvd := int64(p.g.d.Config.Base.NumKeyValueHeads * p.g.d.Config.Base.HeadDim)
	return int64(page.Slab())*lay.SlabElems + int64(page.Slot())*lay.PageElems + off + row*kvd, nil
}

// StoreKV writes layer l's context K and V rows at slots, a run of consecutive slots of
// one page per copy, and waits for the copies (k and v are the caller's again after it).
func (p *dsparkPool) StoreKV(l int, k, v []float32, slots []int64) error {
	b := p.g.d.Config.Base
	kvd := b.NumKeyValueHeads * b.HeadDim
	if l < 0 || l >= len(p.layouts) || len(k) != len(slots)*kvd || len(v) != len(k) {
		return fmt.Errorf("gpurunner: DSpark context of layer %d: %d and %d values for %d slots of %d", l, len(k), len(v), len(slots), kvd)
	}
	r := p.g.r
	return r.dev.Do(func(c *cudart.Ctx) error {
		for i := 0; i < len(slots); {
			j := i + 1
			for j < len(slots) && slots[j] == slots[j-1]+1 && slots[j]%int64(p.pt) != 0 {
				j++
			}
			ke, err := p.elem(l, slots[i], false)
			if err != nil {
				return err
			}
			ve, err := p.elem(l, slots[i], true)
			if err != nil {
				return err
			}
			err = firstErr(cudart.UploadAsync(c, r.arena.Ptr(4*ke), k[i*kvd:j*kvd], r.stream), cudart.UploadAsync(c, r.arena.Ptr(4*ve), v[i*kvd:j*kvd], r.stream))
			if err != nil {
				return fmt.Errorf("gpurunner: DSpark context of layer %d: %w", l, err)
			}
			i = j
		}
		return c.Sync(r.stream)
	})
}

// Blocks runs the blocks of sequences whose contexts are the first lens[i] positions of
// the group through tables[i]. A block's slots take block pages: the page holding its
// anchor's position is first copied from the pool when it holds context positions too,
// and the kernel's page table names the pool's pages below it.
func (p *dsparkPool) Blocks(tables [][]kvslab.PageID, lens []int, anchors []int32) ([]*dspark.Block, error) {
	g := p.g
	c := g.d.Config
	B, S, PT := c.BlockSize, len(lens), p.pt
	per := dsparkBlockPages(B, PT)
	if S == 0 || len(tables) != S || len(anchors) != S {
		return nil, fmt.Errorf("gpurunner: DSpark blocks: %d contexts, %d page tables and %d anchors", S, len(tables), len(anchors))
	}
	if S*per > p.scratch {
		return nil, fmt.Errorf("gpurunner: DSpark blocks of %d sequences need %d block pages, the arena holds %d", S, S*per, p.scratch)
	}
	maxPages := 0
	for i, n := range lens {
		if err := g.check(n, anchors[i]); err != nil {
			return nil, err
		}
		if need := (n + PT - 1) / PT; len(tables[i]) < need {
			return nil, fmt.Errorf("gpurunner: DSpark context of %d positions with a page table of %d pages", n, len(tables[i]))
		}
		maxPages = max(maxPages, (n+B+PT-1)/PT)
	}
	R := S * B
	g.grow(R, maxPages)
	hidden, logits := g.outputs(R)
	pageBytes := p.pool.Groups()[p.group].PageBytes()
	r := g.r
	err := r.dev.Do(func(cx *cudart.Ctx) error {
		for i, n := range lens {
			first := n / PT // the page of the anchor's position: the first block page
			p.pages = p.pages[:0]
			for _, id := range tables[i][:first] {
				if id == kvslab.NoPage {
					return fmt.Errorf("gpurunner: DSpark context of %d positions: no page for block %d", n, len(p.pages))
				}
				p.pages = append(p.pages, uint32(id))
			}
			for k := range (n+B+PT-1)/PT - first {
				idx := i*per + k
				p.pages = append(p.pages, uint32(kvslab.PageID(p.first+idx/p.slots)<<kvslab.SlotBits|kvslab.PageID(idx%p.slots)))
			}
			if n%PT != 0 { // the anchor's page holds context positions: start from the pool's
				src := tables[i][first]
				if src == kvslab.NoPage {
					return fmt.Errorf("gpurunner: DSpark context of %d positions: no page for block %d", n, first)
				}
				dst := kvslab.PageID(p.pages[first])
				at := func(id kvslab.PageID) int64 {
					return int64(id.Slab())*p.pool.SlabBytes() + int64(id.Slot())*pageBytes
				}
				if err := r.arena.CopyAsync(cx, r.stream, at(dst), at(src), pageBytes); err != nil {
					return err
				}
			}
			g.stage(i, n, anchors[i], p.pages, len(p.pages), maxPages, PT)
		}
		layout := func(l int) cuda.KVSlabLayout { return p.layouts[l] }
		return g.run(cx, S, maxPages, blockCache{r.arena.Ptr(0), layout, PT}, hidden, logits)
	})
	if err != nil {
		return nil, fmt.Errorf("gpurunner: DSpark blocks: %w", err)
	}
	return g.blocks(lens, anchors, hidden, logits), nil
}
