package kvslab

import (
	"fmt"
)

// Pool hands out cache pages for every group of a model from one arena. It is not safe for
// concurrent use: the engine's scheduler owns it.
type Pool struct {
	arena     Arena
	specs     []GroupSpec
	groups    []group
	block     int // tokens per block (the shared PageTokens)
	slabBytes int64
	nslabs    int
	maxSlots  int // most slots any group cuts a slab into

	// Per slab.
	slabOwner  []int16 // group index, or -1 when free
	slabUsed   []int32 // slots that are not free (referenced or cached)
	slabCached []int32 // slots holding unreferenced cached pages
	slabFreeN  []int32 // free slots on the slab's stack
	slabPos    []int32 // index in its group's partial list, or -1
	// A slab is live while it holds a referenced page; a live slab with a free slot is on
	// its group's live list, one with an idle cached page on its spare list (see alloc).
	livePos   []int32 // index in its group's live list, or -1
	sparePos  []int32 // index in its group's spare list, or -1
	slabCHead []int32 // the slab's idle cached pages, least recently used first
	slabCTail []int32
	freeSlabs []int32 // stack of free slabs; slab 0 on top at start

	// Per page, indexed by meta(id) = slab*maxSlots + slot.
	slotStack []uint16 // per slab, maxSlots entries: its free slots
	ref       []int32  // sequences holding the page
	owner     []int32  // cache block the page belongs to, or -1
	lruPrev   []int32  // per-group LRU of unreferenced cached pages (meta indices)
	lruNext   []int32
	slabPrev  []int32 // per-slab list of the same pages
	slabNext  []int32

	seqs     []seqState
	freeSeqs []SeqID
	open     int

	cache prefixCache
	stats counters
	undo  []undoEntry

	// Recorded page copies (copies.go): all not yet retired, oldest first; the first
	// taken of them were handed out.
	deferCopies bool
	pack        bool // PackPages
	copies      []PageCopy
	taken       int
}

type group struct {
	kind      Kind
	pageBytes int64
	slots     int     // pages per slab
	partial   []int32 // slabs lent to the group that have a free slot
	live      []int32 // the partial slabs that hold a referenced page
	spare     []int32 // slabs lent to the group that hold referenced and idle cached pages
	slabs     int     // slabs lent
	used      int     // referenced pages
	cached    int     // unreferenced cached pages
	lruHead   int32   // least recently used, evicted first
	lruTail   int32
}

type counters struct {
	queries, queryTokens, hitTokens, evictions int64
}

// New builds a pool over arena for the groups of cfg.
func New(cfg Config, arena Arena) (*Pool, error) {
	slab, err := cfg.slabBytes()
	if err != nil {
		return nil, err
	}
	if arena == nil {
		return nil, fmt.Errorf("kvslab: no arena")
	}
	n := arena.Size() / slab
	if n < 1 {
		return nil, fmt.Errorf("%w: an arena of %d bytes is below one slab of %d bytes", ErrInvalidSpec, arena.Size(), slab)
	}
	if n > MaxSlabs {
		return nil, fmt.Errorf("%w: %d slabs of %d bytes exceed the %d a page id can address; use larger slabs",
			ErrInvalidSpec, n, slab, MaxSlabs)
	}
	p := &Pool{
		arena:     arena,
		specs:     append([]GroupSpec(nil), cfg.Groups...),
		groups:    make([]group, len(cfg.Groups)),
		block:     cfg.Groups[0].PageTokens,
		slabBytes: slab,
		nslabs:    int(n),
	}
	for i, s := range p.specs {
		g := &p.groups[i]
		g.kind = s.Kind
		g.pageBytes = s.PageBytes()
		g.slots = int(slab / g.pageBytes)
		g.partial = make([]int32, 0, p.nslabs)
		g.live = make([]int32, 0, p.nslabs)
		g.spare = make([]int32, 0, p.nslabs)
		g.lruHead, g.lruTail = -1, -1
		p.maxSlots = max(p.maxSlots, g.slots)
	}
	p.slabOwner = make([]int16, p.nslabs)
	p.slabUsed = make([]int32, p.nslabs)
	p.slabCached = make([]int32, p.nslabs)
	p.slabFreeN = make([]int32, p.nslabs)
	p.slabPos = make([]int32, p.nslabs)
	p.livePos = make([]int32, p.nslabs)
	p.sparePos = make([]int32, p.nslabs)
	p.slabCHead = make([]int32, p.nslabs)
	p.slabCTail = make([]int32, p.nslabs)
	p.freeSlabs = make([]int32, p.nslabs)
	for s := range p.nslabs {
		p.slabOwner[s] = -1
		p.slabPos[s] = -1
		p.livePos[s], p.sparePos[s] = -1, -1
		p.slabCHead[s], p.slabCTail[s] = -1, -1
		p.freeSlabs[s] = int32(p.nslabs - 1 - s)
	}
	pages := p.nslabs * p.maxSlots
	p.slotStack = make([]uint16, pages)
	p.ref = make([]int32, pages)
	p.owner = make([]int32, pages)
	p.lruPrev = make([]int32, pages)
	p.lruNext = make([]int32, pages)
	p.slabPrev = make([]int32, pages)
	p.slabNext = make([]int32, pages)
	for i := range p.owner {
		p.owner[i] = -1
		p.lruPrev[i], p.lruNext[i] = -1, -1
		p.slabPrev[i], p.slabNext[i] = -1, -1
	}
	p.cache.init(len(p.specs), pages)
	if cfg.MaxSeqs > 0 {
		p.addSeqs(cfg.MaxSeqs)
	}
	return p, nil
}

// Groups returns the pool's cache groups, in the order their indices refer to.
func (p *Pool) Groups() []GroupSpec { return p.specs }

// BlockTokens is the number of tokens per block, shared by every group.
func (p *Pool) BlockTokens() int { return p.block }

// SlabBytes is the size of one slab.
func (p *Pool) SlabBytes() int64 { return p.slabBytes }

// Slabs is the number of slabs in the arena.
func (p *Pool) Slabs() int { return p.nslabs }

// Arena returns the memory the pool cuts.
func (p *Pool) Arena() Arena { return p.arena }

// PageOffset is the byte offset of page id of group g in the arena (see the package doc).
func (p *Pool) PageOffset(g int, id PageID) int64 {
	return int64(id.Slab())*p.slabBytes + int64(id.Slot())*p.groups[g].pageBytes
}

// PageBytes returns the bytes of page id of group g when the arena is host memory.
func (p *Pool) PageBytes(g int, id PageID) ([]byte, error) {
	if g < 0 || g >= len(p.groups) {
		return nil, fmt.Errorf("kvslab: no cache group %d", g)
	}
	h, ok := p.arena.(HostMemory)
	if !ok {
		return nil, fmt.Errorf("kvslab: the arena (%T) is not host memory", p.arena)
	}
	if id == NoPage || id.Slab() >= p.nslabs || int(p.slabOwner[id.Slab()]) != g || id.Slot() >= p.groups[g].slots {
		return nil, fmt.Errorf("kvslab: page %#x is not a page of group %q", uint32(id), p.specs[g].Name)
	}
	return h.Bytes(p.PageOffset(g, id), p.groups[g].pageBytes), nil
}

func (p *Pool) meta(id PageID) int32 { return int32(id.Slab()*p.maxSlots + id.Slot()) }

func (p *Pool) pageOf(m int32) PageID {
	return PageID(int(m)/p.maxSlots)<<SlotBits | PageID(int(m)%p.maxSlots)
}

// alloc takes a page for group g, referenced once. In order it uses a free slot of a slab
// where the group has referenced pages, (with PackPages) the slot of an idle cached page on
// such a slab, a free slot of another of its slabs, a free slab, the group's least recently
// used cached page, then a slab of another group whose pages are all evictable.
func (p *Pool) alloc(g int) (PageID, bool) {
	gr := &p.groups[g]
	if len(gr.live) == 0 {
		switch {
		case p.pack && len(gr.spare) > 0:
			p.evict(p.slabCHead[gr.spare[len(gr.spare)-1]]) // its slot is now free and live
		case len(gr.partial) > 0:
		case len(p.freeSlabs) > 0:
			p.lend(g)
		case gr.lruHead >= 0:
			p.evict(gr.lruHead)
		case !p.reclaimSlab():
			return NoPage, false
		}
		if len(gr.partial) == 0 {
			p.lend(g) // an eviction above emptied a whole slab
		}
	}
	var s int32
	if n := len(gr.live); n > 0 {
		s = gr.live[n-1]
	} else {
		s = gr.partial[len(gr.partial)-1]
	}
	p.slabFreeN[s]--
	slot := p.slotStack[int(s)*p.maxSlots+int(p.slabFreeN[s])]
	if p.slabFreeN[s] == 0 {
		p.dropPartial(s)
	}
	p.slabUsed[s]++
	p.syncLists(s)
	id := PageID(s)<<SlotBits | PageID(slot)
	m := p.meta(id)
	p.ref[m] = 1
	gr.used++
	return id, true
}

// PackPages switches how a group that is out of free slots on the slabs where it has
// referenced (live) pages grows. Off (the default), it takes a free slab while there is
// one, and the idle cached pages next to its live ones stay for later prefix hits. On, it
// first evicts those cached pages and reuses their slots, so that each group's live pages
// stay on as few slabs as they fill.
//
// Packing is what makes a lone sequence fit a pool Size counted for it, whatever its groups'
// pages churn (sliding windows, checkpoints): a slab with a live page cannot go to another
// group, so a group that grew into a free slab while its own slabs held idle cached pages
// may leave the next group with none. With one group nothing is stranded that way. The
// engine turns it on while a request that an emptied pool was given to runs alone.
func (p *Pool) PackPages(on bool) { p.pack = on }

// lend moves a free slab to group g.
func (p *Pool) lend(g int) {
	s := p.freeSlabs[len(p.freeSlabs)-1]
	p.freeSlabs = p.freeSlabs[:len(p.freeSlabs)-1]
	gr := &p.groups[g]
	p.slabOwner[s] = int16(g)
	p.slabUsed[s], p.slabCached[s] = 0, 0
	base := int(s) * p.maxSlots
	for i := range gr.slots {
		p.slotStack[base+i] = uint16(gr.slots - 1 - i) // slot 0 is taken first
	}
	p.slabFreeN[s] = int32(gr.slots)
	p.slabPos[s] = int32(len(gr.partial))
	gr.partial = append(gr.partial, s)
	gr.slabs++
}

func (p *Pool) dropPartial(s int32) {
	gr := &p.groups[p.slabOwner[s]]
	i := p.slabPos[s]
	last := gr.partial[len(gr.partial)-1]
	gr.partial[i] = last
	p.slabPos[last] = i
	gr.partial = gr.partial[:len(gr.partial)-1]
	p.slabPos[s] = -1
}

// release drops one reference to page id of group g. An unreferenced page goes to the LRU
// when the prefix cache holds it and back to its slab otherwise.
func (p *Pool) release(g int, id PageID) {
	m := p.meta(id)
	p.ref[m]--
	if p.ref[m] > 0 {
		return
	}
	p.groups[g].used--
	if p.owner[m] >= 0 {
		p.lruPush(g, m)
		return
	}
	p.freeSlot(g, id)
}

// hold adds a reference to a page, taking it out of the LRU if it was idle in the cache.
func (p *Pool) hold(g int, id PageID) {
	m := p.meta(id)
	if p.ref[m] == 0 {
		p.lruRemove(g, m)
		p.groups[g].used++
	}
	p.ref[m]++
}

func (p *Pool) freeSlot(g int, id PageID) {
	s := int32(id.Slab())
	p.slotStack[int(s)*p.maxSlots+int(p.slabFreeN[s])] = uint16(id.Slot())
	p.slabFreeN[s]++
	if p.slabFreeN[s] == 1 {
		gr := &p.groups[g]
		p.slabPos[s] = int32(len(gr.partial))
		gr.partial = append(gr.partial, s)
	}
	p.slabUsed[s]--
	p.syncLists(s)
	if p.slabUsed[s] == 0 {
		p.dropPartial(s)
		p.slabOwner[s] = -1
		p.slabFreeN[s] = 0
		p.groups[g].slabs--
		p.freeSlabs = append(p.freeSlabs, s)
	}
}

// evict removes an unreferenced cached page from the prefix cache and frees it.
func (p *Pool) evict(m int32) {
	id := p.pageOf(m)
	g := int(p.slabOwner[id.Slab()])
	p.stats.evictions++
	p.cache.detach(p, g, m)
}

// reclaimSlab empties the slab, lent to any group, whose pages are all unreferenced cached
// pages and that holds the fewest of them. It reports whether a slab was freed.
func (p *Pool) reclaimSlab() bool {
	best, bestN := int32(-1), int32(0)
	for s := range p.nslabs {
		if p.slabOwner[s] < 0 || p.slabUsed[s] != p.slabCached[s] {
			continue
		}
		if best < 0 || p.slabCached[s] < bestN {
			best, bestN = int32(s), p.slabCached[s]
		}
	}
	if best < 0 {
		return false
	}
	g := int(p.slabOwner[best])
	base := int32(int(best) * p.maxSlots)
	for slot := range int32(p.groups[g].slots) {
		m := base + slot
		if p.owner[m] >= 0 && p.ref[m] == 0 && p.slabOwner[best] >= 0 {
			p.evict(m)
		}
	}
	return p.slabOwner[best] < 0
}

func (p *Pool) lruPush(g int, m int32) {
	gr := &p.groups[g]
	p.lruPrev[m], p.lruNext[m] = gr.lruTail, -1
	if gr.lruTail >= 0 {
		p.lruNext[gr.lruTail] = m
	} else {
		gr.lruHead = m
	}
	gr.lruTail = m
	gr.cached++
	s := int32(int(m) / p.maxSlots)
	p.slabPrev[m], p.slabNext[m] = p.slabCTail[s], -1
	if p.slabCTail[s] >= 0 {
		p.slabNext[p.slabCTail[s]] = m
	} else {
		p.slabCHead[s] = m
	}
	p.slabCTail[s] = m
	p.slabCached[s]++
	p.syncLists(s)
}

func (p *Pool) lruRemove(g int, m int32) {
	gr := &p.groups[g]
	prev, next := p.lruPrev[m], p.lruNext[m]
	if prev >= 0 {
		p.lruNext[prev] = next
	} else {
		gr.lruHead = next
	}
	if next >= 0 {
		p.lruPrev[next] = prev
	} else {
		gr.lruTail = prev
	}
	p.lruPrev[m], p.lruNext[m] = -1, -1
	gr.cached--
	s := int32(int(m) / p.maxSlots)
	prev, next = p.slabPrev[m], p.slabNext[m]
	if prev >= 0 {
		p.slabNext[prev] = next
	} else {
		p.slabCHead[s] = next
	}
	if next >= 0 {
		p.slabPrev[next] = prev
	} else {
		p.slabCTail[s] = prev
	}
	p.slabPrev[m], p.slabNext[m] = -1, -1
	p.slabCached[s]--
	p.syncLists(s)
}

// syncLists puts slab s on its group's live and spare lists, or takes it off, after its
// counts changed: a slab is live while it holds a referenced page and has a free slot,
// and spare while it holds both referenced and idle cached pages.
func (p *Pool) syncLists(s int32) {
	o := p.slabOwner[s]
	if o < 0 {
		return
	}
	gr := &p.groups[o]
	held := p.slabUsed[s] > p.slabCached[s]
	syncSet(&gr.live, p.livePos, s, held && p.slabFreeN[s] > 0)
	syncSet(&gr.spare, p.sparePos, s, held && p.slabCached[s] > 0)
}

// syncSet adds slab s to the set list (pos: each slab's index in it, or -1) or removes
// it, so that it is in the set exactly when in is true.
func syncSet(list *[]int32, pos []int32, s int32, in bool) {
	switch i := pos[s]; {
	case in && i < 0:
		pos[s] = int32(len(*list))
		*list = append(*list, s)
	case !in && i >= 0:
		l := *list
		last := l[len(l)-1]
		l[i] = last
		pos[last] = i
		*list = l[:len(l)-1]
		pos[s] = -1
	}
}
