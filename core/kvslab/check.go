package kvslab

import "fmt"

// Check verifies the pool's invariants and returns the first violation: every page is
// exactly one of free, referenced or cached-and-idle; reference counts equal the number of
// places that hold a page; no page sits in two groups' tables or twice in one table; the
// prefix cache, the LRU lists and the slab accounting agree. It walks the whole pool and is
// meant for tests.
func (p *Pool) Check() error {
	pages := p.nslabs * p.maxSlots
	refs := make([]int32, pages)
	isFree := make([]bool, pages)
	group := make([]int, pages)
	for i := range group {
		group[i] = -1
	}
	// Slabs and their free stacks.
	freeSlab := make([]bool, p.nslabs)
	for _, s := range p.freeSlabs {
		if freeSlab[s] {
			return fmt.Errorf("slab %d is on the free list twice", s)
		}
		freeSlab[s] = true
	}
	lent := make([]int, len(p.groups))
	for s := range p.nslabs {
		o := int(p.slabOwner[s])
		if freeSlab[s] != (o < 0) {
			return fmt.Errorf("slab %d: owner %d but free-list membership %v", s, o, freeSlab[s])
		}
		if o < 0 {
			continue
		}
		lent[o]++
		slots := p.groups[o].slots
		base := s * p.maxSlots
		for i := range p.maxSlots {
			if i < slots {
				group[base+i] = o
			}
		}
		for i := range int(p.slabFreeN[s]) {
			slot := int(p.slotStack[base+i])
			if slot >= slots || isFree[base+slot] {
				return fmt.Errorf("slab %d: bad or repeated free slot %d", s, slot)
			}
			isFree[base+slot] = true
		}
		if int(p.slabUsed[s]) != slots-int(p.slabFreeN[s]) {
			return fmt.Errorf("slab %d: %d slots used but %d of %d free", s, p.slabUsed[s], p.slabFreeN[s], slots)
		}
		inPartial := p.slabPos[s] >= 0 && int(p.slabPos[s]) < len(p.groups[o].partial) && p.groups[o].partial[p.slabPos[s]] == int32(s)
		if inPartial != (p.slabFreeN[s] > 0) {
			return fmt.Errorf("slab %d: %d free slots but partial-list membership %v", s, p.slabFreeN[s], inPartial)
		}
	}
	for g, gr := range p.groups {
		if lent[g] != gr.slabs {
			return fmt.Errorf("group %q: counts %d slabs, holds %d", p.specs[g].Name, gr.slabs, lent[g])
		}
	}
	holdPage := func(g int, id PageID, what string) error {
		if id.Slab() >= p.nslabs || group[p.meta(id)] != g {
			return fmt.Errorf("%s: page %#x is not a page of group %q", what, uint32(id), p.specs[g].Name)
		}
		m := p.meta(id)
		if isFree[m] {
			return fmt.Errorf("%s: page %#x is free", what, uint32(id))
		}
		refs[m]++
		return nil
	}
	// Sequences.
	open := 0
	for i := range p.seqs {
		s := &p.seqs[i]
		if !s.open {
			continue
		}
		open++
		blocks := (s.length + p.block - 1) / p.block
		for g, spec := range p.specs {
			t := s.tables[g]
			if len(t) != blocks {
				return fmt.Errorf("seq %d group %q: %d blocks in the table for %d tokens", i, spec.Name, len(t), s.length)
			}
			for b, id := range t {
				if id == NoPage {
					if spec.Kind != SlidingWindow && spec.Kind != Recurrent {
						return fmt.Errorf("seq %d group %q: block %d has no page", i, spec.Name, b)
					}
					continue
				}
				if b < s.held[g] {
					return fmt.Errorf("seq %d group %q: block %d holds a page below the held start %d", i, spec.Name, b, s.held[g])
				}
				if err := holdPage(g, id, fmt.Sprintf("seq %d group %q block %d", i, spec.Name, b)); err != nil {
					return err
				}
			}
			if spec.Kind == SlidingWindow {
				for b := max(s.held[g], p.windowStart(g, s.length)); b < blocks; b++ {
					if t[b] == NoPage {
						return fmt.Errorf("seq %d group %q: block %d inside the window has no page", i, spec.Name, b)
					}
				}
			}
			if (spec.Kind == Recurrent) != (s.state[g] != NoPage) {
				return fmt.Errorf("seq %d group %q: state page %#x for a %s group", i, spec.Name, uint32(s.state[g]), spec.Kind)
			}
			if s.state[g] != NoPage {
				if err := holdPage(g, s.state[g], fmt.Sprintf("seq %d group %q state", i, spec.Name)); err != nil {
					return err
				}
			}
		}
		if s.committed > blocks || len(s.hashes) != s.committed {
			return fmt.Errorf("seq %d: %d committed blocks, %d hashes, %d blocks", i, s.committed, len(s.hashes), blocks)
		}
	}
	// Recorded copies hold their source pages.
	if p.taken > len(p.copies) {
		return fmt.Errorf("%d copies taken of %d recorded", p.taken, len(p.copies))
	}
	for i, c := range p.copies {
		if c.Group < 0 || c.Group >= len(p.groups) {
			return fmt.Errorf("copy %d: group %d", i, c.Group)
		}
		if err := holdPage(c.Group, c.Src, fmt.Sprintf("copy %d source", i)); err != nil {
			return err
		}
		if c.Seq == freedSeq && i >= p.taken {
			return fmt.Errorf("copy %d: not taken, for a sequence already freed", i)
		}
		if c.Seq != freedSeq && (c.Seq < 0 || int(c.Seq) >= len(p.seqs) || !p.seqs[c.Seq].open) {
			return fmt.Errorf("copy %d: for sequence %d, which is not open", i, c.Seq)
		}
	}
	if open != p.open {
		return fmt.Errorf("%d sequences open, %d counted", open, p.open)
	}
	// Prefix cache.
	c := &p.cache
	cached := make([]int32, pages)
	for i := range cached {
		cached[i] = -1
	}
	for h, e := range c.byHash {
		if c.hash[e] != h {
			return fmt.Errorf("cache entry %d: hash %#x filed under %#x", e, c.hash[e], h)
		}
		any := false
		for g, id := range c.entryPages(e) {
			if id == NoPage {
				if required(p.groups[g].kind) {
					return fmt.Errorf("cache entry %d lacks its page of required group %q", e, p.specs[g].Name)
				}
				continue
			}
			any = true
			m := p.meta(id)
			if id.Slab() >= p.nslabs || group[m] != g || isFree[m] {
				return fmt.Errorf("cache entry %d: page %#x of group %q is free or foreign", e, uint32(id), p.specs[g].Name)
			}
			if cached[m] >= 0 {
				return fmt.Errorf("page %#x is in cache entries %d and %d", uint32(id), cached[m], e)
			}
			cached[m] = e
		}
		if !any {
			return fmt.Errorf("cache entry %d holds no page", e)
		}
	}
	// Every page: free, referenced, or cached and idle in its group's LRU.
	inLRU := make([]bool, pages)
	for g, gr := range p.groups {
		n := 0
		prev := int32(-1)
		for m := gr.lruHead; m >= 0; m = p.lruNext[m] {
			if p.lruPrev[m] != prev || group[m] != g || inLRU[m] {
				return fmt.Errorf("group %q: LRU list is broken at page %#x", p.specs[g].Name, uint32(p.pageOf(m)))
			}
			inLRU[m] = true
			prev = m
			if n++; n > pages {
				return fmt.Errorf("group %q: LRU list loops", p.specs[g].Name)
			}
		}
		if prev != gr.lruTail || n != gr.cached {
			return fmt.Errorf("group %q: LRU holds %d pages, counted %d", p.specs[g].Name, n, gr.cached)
		}
	}
	used := make([]int, len(p.groups))
	slabCached := make([]int32, p.nslabs)
	for m := range pages {
		g := group[m]
		if g < 0 {
			continue
		}
		if p.owner[m] != cached[m] {
			return fmt.Errorf("page %#x: owner %d but listed by cache entry %d", uint32(p.pageOf(int32(m))), p.owner[m], cached[m])
		}
		if p.ref[m] != refs[m] {
			return fmt.Errorf("page %#x: reference count %d, held %d times", uint32(p.pageOf(int32(m))), p.ref[m], refs[m])
		}
		switch {
		case isFree[m]:
			if refs[m] != 0 || cached[m] >= 0 || inLRU[m] {
				return fmt.Errorf("page %#x is free and also held or cached", uint32(p.pageOf(int32(m))))
			}
		case refs[m] > 0:
			used[g]++
			if inLRU[m] {
				return fmt.Errorf("page %#x is held and idle in the LRU", uint32(p.pageOf(int32(m))))
			}
		default:
			if cached[m] < 0 || !inLRU[m] {
				return fmt.Errorf("page %#x is neither free, held nor cached", uint32(p.pageOf(int32(m))))
			}
			slabCached[m/p.maxSlots]++
		}
	}
	for g, gr := range p.groups {
		if used[g] != gr.used {
			return fmt.Errorf("group %q: %d pages held, counted %d", p.specs[g].Name, used[g], gr.used)
		}
	}
	for s := range p.nslabs {
		if p.slabOwner[s] >= 0 && slabCached[s] != p.slabCached[s] {
			return fmt.Errorf("slab %d: %d cached pages, counted %d", s, slabCached[s], p.slabCached[s])
		}
	}
	return p.checkSpare(inLRU)
}

// checkSpare verifies the per-slab lists of idle cached pages and the groups' live and
// spare lists (slabs holding referenced pages and free slots, or idle cached pages).
func (p *Pool) checkSpare(inLRU []bool) error {
	counts := make([][2]int, len(p.groups)) // live and spare slabs per group
	for s := range p.nslabs {
		o := int(p.slabOwner[s])
		n, prev := int32(0), int32(-1)
		for m := p.slabCHead[s]; m >= 0; m = p.slabNext[m] {
			if int(m)/p.maxSlots != s || !inLRU[m] || p.slabPrev[m] != prev {
				return fmt.Errorf("slab %d: its list of cached pages is broken at page %#x", s, uint32(p.pageOf(m)))
			}
			prev = m
			if n++; n > int32(p.maxSlots) {
				return fmt.Errorf("slab %d: its list of cached pages loops", s)
			}
		}
		if prev != p.slabCTail[s] || (o >= 0 && n != p.slabCached[s]) || (o < 0 && n != 0) {
			return fmt.Errorf("slab %d: lists %d cached pages, counted %d", s, n, p.slabCached[s])
		}
		held := o >= 0 && p.slabUsed[s] > p.slabCached[s]
		for k, c := range []struct {
			name string
			in   bool
			pos  []int32
		}{{"live", held && p.slabFreeN[s] > 0, p.livePos}, {"spare", held && p.slabCached[s] > 0, p.sparePos}} {
			i := c.pos[s]
			var list []int32
			if o >= 0 {
				list = [][]int32{p.groups[o].live, p.groups[o].spare}[k]
			}
			listed := i >= 0 && int(i) < len(list) && list[i] == int32(s)
			if c.in != listed || (!c.in && i >= 0) {
				return fmt.Errorf("slab %d: %s %v but %s-list position %d", s, c.name, c.in, c.name, i)
			}
			if c.in {
				counts[o][k]++
			}
		}
	}
	for g, gr := range p.groups {
		if len(gr.live) != counts[g][0] || len(gr.spare) != counts[g][1] {
			return fmt.Errorf("group %q: %d live and %d spare slabs listed, %v counted", p.specs[g].Name, len(gr.live), len(gr.spare), counts[g])
		}
	}
	return nil
}
