package deepseekv4flash

import (
	"fmt"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
)

// devPages is GPURunner's kvslab pool in device memory (NewPool): the CPU runner's page
// layout (cache.go's layout: "swa", "csa", "hca", "state"), each view an address in the
// pool's DeviceArena instead of a host slice. The engine executes the plans' CacheOps on
// it (kvslab page copies, DeviceArena.Copy on the device), so a prefix hit's state page
// is restored from its checkpoint without leaving the device.
type devPages struct {
	c     *Config
	pool  *kvslab.Pool
	arena *cudart.DeviceArena
	L     *cacheLayout
	pt    int
}

// newDevPages binds the layout (with the MTP head's state when mtp) to pool, whose arena
// must be arena and whose groups must be the layout's.
func newDevPages(c *Config, pool *kvslab.Pool, arena *cudart.DeviceArena, mtp bool) (*devPages, error) {
	if pool.Arena() != kvslab.Arena(arena) {
		return nil, fmt.Errorf("device pages: the pool's arena is %T, not the runner's device arena", pool.Arena())
	}
	L, err := poolLayout(c, pool, mtp, 0)
	if err != nil {
		return nil, fmt.Errorf("device pages: %w", err)
	}
	return &devPages{c: c, pool: pool, arena: arena, L: L, pt: pool.BlockTokens()}, nil
}

// at is the address of float off in page id of group g.
func (kv *devPages) at(g int, id kvslab.PageID, off int) cudart.DevicePtr {
	return kv.arena.Ptr(kv.pool.PageOffset(g, id) + int64(4*off))
}

// seqPages is one plan sequence's page tables and live state page (NoPage without a
// "state" group).
type seqPages struct {
	swa, csa, hca, ckpt []kvslab.PageID
	state               kvslab.PageID
}

// seq returns plan sequence i's pages.
func (kv *devPages) seq(p *engine.BatchPlan, i int) (seqPages, error) {
	L := kv.L
	if len(p.Groups) != len(L.groups) {
		return seqPages{}, fmt.Errorf("device pages: a plan of %d cache groups, the pool has %d", len(p.Groups), len(L.groups))
	}
	sp := seqPages{swa: p.PageTableOf(L.swa, i), state: kvslab.NoPage}
	if L.csa >= 0 {
		sp.csa = p.PageTableOf(L.csa, i)
	}
	if L.hca >= 0 {
		sp.hca = p.PageTableOf(L.hca, i)
	}
	if L.state >= 0 {
		if len(p.Groups[L.state].StatePage) <= i || p.Groups[L.state].StatePage[i] == kvslab.NoPage {
			return seqPages{}, fmt.Errorf("device pages: request %d has no state page", p.ReqIDs[i])
		}
		sp.state, sp.ckpt = p.Groups[L.state].StatePage[i], p.PageTableOf(L.state, i)
	}
	return sp, nil
}

// window returns the address of layer li's sliding-window row q (li = NumHiddenLayers:
// the MTP block's, kept at token slot q+1) and how many rows from q on follow it in the
// same page.
func (kv *devPages) window(sp *seqPages, li, q int) (cudart.DevicePtr, int, error) {
	j := q
	if li == kv.c.NumHiddenLayers {
		j++
	}
	b := j / kv.pt
	if b >= len(sp.swa) || sp.swa[b] == kvslab.NoPage {
		return 0, 0, fmt.Errorf("device pages: layer %d's window row %d has no page", li, q)
	}
	d := kv.c.HeadDim
	return kv.at(kv.L.swa, sp.swa[b], li*kv.L.layerFloats(kv.L.swa)+(j%kv.pt)*d), kv.pt - j%kv.pt, nil
}

// entry returns the address of layer li's compressed entry w: the compressor's, or with
// indexer the indexer's key beside it (CSA layers).
func (kv *devPages) entry(sp *seqPages, li int, indexer bool, w int) (cudart.DevicePtr, error) {
	c := kv.c
	kind := c.LayerTypes[li]
	g, pages, stride, inner := kv.L.hca, sp.hca, c.HeadDim, 0
	if kind == CompressedSparse {
		g, pages, stride = kv.L.csa, sp.csa, c.HeadDim+c.IndexHeadDim
	}
	if indexer {
		inner = c.HeadDim
	}
	per := kv.pt / c.CompressRates[kind]
	b := w / per
	if g < 0 || b >= len(pages) || pages[b] == kvslab.NoPage {
		return 0, fmt.Errorf("device pages: layer %d's entry %d has no page", li, w)
	}
	return kv.at(g, pages[b], kv.L.index[li]*kv.L.layerFloats(g)+(w%per)*stride+inner), nil
}

// state returns the address of float off in state page id.
func (kv *devPages) state(id kvslab.PageID, off int) cudart.DevicePtr {
	return kv.at(kv.L.state, id, off)
}

// stream returns the address of the final streams of the last token state page id keeps
// (the layout with the MTP head).
func (kv *devPages) stream(id kvslab.PageID) cudart.DevicePtr { return kv.state(id, kv.L.streamOff) }

// savePageDrafts records in u what the write-through of feeding positions [from, to) of
// plan sequence seq (pages sp) writes into the pool, as undoLog.saveDrafts does for the
// CPU runner's host pool: per layer the window row, per compressor the pending slot in
// the live state page and, where the position closes a window, the entry and the
// previous window's buffers.
func (g *gpuModel) savePageDrafts(c *cudart.Ctx, u *devUndo, kv *devPages, seq int, sp *seqPages, from, to int) error {
	d := g.m.Config.HeadDim
	for q := from; q < to; q++ {
		for li := range g.layers {
			row, _, err := kv.window(sp, li, q)
			if err != nil {
				return err
			}
			if err := u.save(c, seq, q, row, d); err != nil {
				return err
			}
			for _, cp := range g.comps(li) {
				kc := cp.dev
				r, wd, dim, j := kc.Ratio, kc.Width(), kc.Dim, q%kc.Ratio
				live := kv.state(sp.state, cp.offset(kv.L, li))
				for _, b := range []int{j * wd, r*wd + j*wd} {
					if err := u.save(c, seq, q, live+cudart.DevicePtr(4*b), wd); err != nil {
						return err
					}
				}
				if j < r-1 {
					continue
				}
				e, err := kv.entry(sp, li, cp.indexer, q/r)
				if err != nil {
					return err
				}
				if err := u.save(c, seq, q, e, dim); err != nil {
					return err
				}
				if kc.Overlap {
					if err := u.save(c, seq, q, live+cudart.DevicePtr(4*2*r*wd), 2*r*dim); err != nil {
						return err
					}
				}
			}
		}
	}
	return nil
}
