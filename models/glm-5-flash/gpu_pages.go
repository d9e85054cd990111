package glm5flash

import (
	"fmt"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/models/glm-5-flash/kernels"
)

// bindPool makes the model keep its cache in pool, whose arena is the device arena
// arena; the pool's groups must be the layout's (textLayout without the MTP layer).
func (g *gpuModel) bindPool(pool *kvslab.Pool, arena *cudart.DeviceArena) error {
	if pool.Arena() != kvslab.Arena(arena) {
		return fmt.Errorf("gpu: the pool's arena is %T, not the runner's device arena", pool.Arena())
	}
	if pt := pool.BlockTokens(); pt != g.blockTokens {
		return fmt.Errorf("gpu: a pool of %d-token blocks, the runner's are %d", pt, g.blockTokens)
	}
	got := pool.Groups()
	if len(got) != len(g.L.groups) {
		return fmt.Errorf("gpu: the pool has %d groups, the model needs %d", len(got), len(g.L.groups))
	}
	for i, want := range g.L.groups {
		if h := got[i]; h.Name != want.Name || h.Kind != want.Kind || h.Layers != want.Layers || h.BytesPerToken != want.BytesPerToken || h.Ratio != want.Ratio {
			return fmt.Errorf("gpu: pool group %d %+v does not match the model's %+v", i, h, want)
		}
	}
	g.pool, g.arena = pool, arena
	return nil
}

// layerFloats is the floats a layer takes in a page of group gr.
func (g *gpuModel) layerFloats(gr int) int {
	spec := g.L.groups[gr]
	return int(spec.PageBytes() / int64(spec.Layers) / 4)
}

// pageAt is the device address of page id of group gr.
func (g *gpuModel) pageAt(gr int, id kvslab.PageID) cudart.DevicePtr {
	return g.arena.Ptr(g.pool.PageOffset(gr, id))
}

// seqPages records plan sequence i's pages in s for the step.
func (g *gpuModel) seqPages(p *engine.BatchPlan, i int, s *gpuSeq) error {
	L := g.L
	s.Done = int(p.Computed[i])
	s.State, s.Ckpt, s.MLAPages, s.PoolPages = 0, s.Ckpt[:0], nil, nil
	if len(p.Groups) != len(L.groups) {
		return fmt.Errorf("gpu: a plan of %d cache groups, the pool has %d", len(p.Groups), len(L.groups))
	}
	if L.kda >= 0 {
		if len(p.Groups[L.kda].StatePage) <= i {
			return fmt.Errorf("gpu: request %d has no state page", p.ReqIDs[i])
		}
		page := p.Groups[L.kda].StatePage[i]
		if page == kvslab.NoPage {
			return fmt.Errorf("gpu: request %d has no state page", p.ReqIDs[i])
		}
		s.State = g.pageAt(L.kda, page)
		for _, ck := range p.PageTableOf(L.kda, i) {
			var at cudart.DevicePtr
			if ck != kvslab.NoPage {
				at = g.pageAt(L.kda, ck)
			}
			s.Ckpt = append(s.Ckpt, at)
		}
	}
	if L.mla >= 0 {
		s.MLAPages = p.PageTableOf(L.mla, i)
	}
	if L.pool >= 0 {
		s.PoolPages = p.PageTableOf(L.pool, i)
	}
	return nil
}

// prepare readies s for a step that continues it at s.Done tokens: a new sequence's KDA
// states are cleared (its state page may hold a freed sequence's), a slot holding more
// tokens forgets the rest (a truncated or restarted sequence: its earlier rows are the
// same tokens'), and one holding fewer gathers the missing rows from the pages (a prefix
// hit, or a sequence the slot did not hold).
func (g *gpuModel) prepare(c *cudart.Ctx, s *gpuSeq) error {
	if s.Done == 0 && s.State != 0 {
		if err := c.MemsetAsync(s.State, 0, int64(4*g.L.stateFloats), nil); err != nil {
			return fmt.Errorf("gpu: clearing a state page: %w", err)
		}
	}
	if s.Len > s.Done {
		s.Len = s.Done
	}
	if s.Len < s.Done {
		if err := g.pageRows(c, s, s.Len, s.Done, true); err != nil {
			return err
		}
		s.Len = s.Done
	}
	return nil
}

// kdaState is s's state of KDA layer li in its live state page.
func (g *gpuModel) kdaState(s *gpuSeq, li int) gpuKDAState {
	o := g.L.kdaOff[li]
	return gpuKDAState{Conv: off(s.State, o), Recurrent: off(s.State, o+g.convFloats)}
}

// checkpoint copies KDA layer li's states of s, after the token at pos (a block's last),
// into that block's checkpoint page when the plan gives it one.
func (g *gpuModel) checkpoint(c *cudart.Ctx, s *gpuSeq, li, pos int) error {
	b := pos / g.blockTokens
	if b >= len(s.Ckpt) || s.Ckpt[b] == 0 {
		return nil
	}
	o := g.L.kdaOff[li]
	return c.CopyDtoDAsync(off(s.Ckpt[b], o), off(s.State, o), int64(4*(g.convFloats+g.recFloats)), nil)
}

// pagedLayer is one MLA layer as the pages hold it: its layer in the "mla" group and,
// with a full indexer, in "kpool" (-1 without), and its slot buffers (gpuDSA's layout).
type pagedLayer struct {
	mla, pool int
	dense     gpuDSAState
}

// mainLayers are the decoder's MLA layers as paged.
func (g *gpuModel) mainLayers() []pagedLayer {
	var out []pagedLayer
	for li, l := range g.layers {
		if mi := g.L.mlaIndex[li]; mi >= 0 {
			out = append(out, pagedLayer{mla: mi, pool: g.L.poolIndex[li], dense: l.dsaPools})
		}
	}
	return out
}

// pageRows copies the MLA rows of positions [from, to) of s, and the pooled keys of the
// pools those positions complete, between the pages and s's slot (toDense: into the
// slot), every decoder MLA layer's.
func (g *gpuModel) pageRows(c *cudart.Ctx, s *gpuSeq, from, to int, toDense bool) error {
	P := g.m.Config.IndexKPool
	return g.pageSpan(c, s, g.mainLayers(), from, to, from/P, to/P, 0, toDense)
}

// pageSpan copies, for each of layers, s's rows of positions [from, to) and its pools
// [j0, j1) between the pages and the slot (toDense: into the slot). The pages hold row p
// at stored slot p+shift and pool j as stored pool j+shift (the MTP layer's shift is 1,
// see textLayout); the slot holds them by position and pool index.
func (g *gpuModel) pageSpan(c *cudart.Ctx, s *gpuSeq, layers []pagedLayer, from, to, j0, j1, shift int, toDense bool) error {
	cfg, L := g.m.Config, g.L
	if L.mla < 0 || len(layers) == 0 {
		return nil
	}
	R, I, P, pt := cfg.KVLoraRank, cfg.IndexHeadDim, cfg.IndexKPool, g.blockTokens
	if to-from > g.tabRows || j1-j0 > g.tabRows/P+g.slots {
		return fmt.Errorf("gpu: %d rows and %d pools to page, room for %d", to-from, j1-j0, g.tabRows)
	}
	table := func(n int, at func(k int) (int64, int64)) []int64 {
		g.tab = append(g.tab[:0], make([]int64, 2*n)...)
		for k := range n {
			g.tab[k], g.tab[n+k] = at(k)
		}
		return g.tab
	}
	run := func(paged, dense, tab cudart.DevicePtr, rows, dim int) error {
		if err := kernels.Run(g.dsa.ks, c, nil, kernels.PageRows{Paged: paged, Dense: dense, Table: tab, Rows: rows, Dim: dim,
			ToDense: toDense}); err != nil {
			return fmt.Errorf("gpu: paging rows: %w", err)
		}
		return nil
	}
	var bad error
	if n := to - from; n > 0 {
		rows := table(n, func(k int) (int64, int64) {
			p := from + k
			q := p + shift
			if b := q / pt; b >= len(s.MLAPages) || s.MLAPages[b] == kvslab.NoPage {
				bad = fmt.Errorf("gpu: position %d has no page of the mla group", p)
				return 0, 0
			}
			return g.pool.PageOffset(L.mla, s.MLAPages[q/pt])/4 + int64((q%pt)*L.mlaStride), int64(s.slot*g.maxPos + p)
		})
		if bad != nil {
			return bad
		}
		if err := cudart.Upload(c, g.rowTab, rows); err != nil {
			return err
		}
		for _, l := range layers {
			base := g.arena.Ptr(int64(4 * l.mla * g.layerFloats(L.mla)))
			if err := run(base, l.dense.Latent, g.rowTab, n, R); err != nil {
				return err
			}
			if l.pool >= 0 {
				if err := run(off(base, R), l.dense.IdxKey, g.rowTab, n, I); err != nil {
					return err
				}
				if err := run(off(base, R+I), l.dense.IdxGate, g.rowTab, n, I); err != nil {
					return err
				}
			}
		}
	}
	if L.pool < 0 || j1 <= j0 {
		return nil
	}
	perPage := pt / P
	pools := table(j1-j0, func(k int) (int64, int64) {
		j := j0 + k
		q := j + shift
		if b := q / perPage; b >= len(s.PoolPages) || s.PoolPages[b] == kvslab.NoPage {
			bad = fmt.Errorf("gpu: pool %d has no page of the kpool group", j)
			return 0, 0
		}
		return g.pool.PageOffset(L.pool, s.PoolPages[q/perPage])/4 + int64((q%perPage)*I), int64(s.slot*(g.maxPos/P) + j)
	})
	if bad != nil {
		return bad
	}
	if err := cudart.Upload(c, g.poolTab, pools); err != nil {
		return err
	}
	for _, l := range layers {
		if l.pool >= 0 {
			if err := run(g.arena.Ptr(int64(4*l.pool*g.layerFloats(L.pool))), l.dense.Pools, g.poolTab, j1-j0, I); err != nil {
				return err
			}
		}
	}
	return nil
}
