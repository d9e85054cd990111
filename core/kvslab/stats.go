package kvslab

// GroupStats is one cache group's share of the pool.
type GroupStats struct {
	Name        string
	Kind        Kind
	PageBytes   int64
	Slabs       int   // slabs lent to the group
	PagesUsed   int   // pages held by sequences
	PagesCached int   // unreferenced pages kept by the prefix cache (evictable)
	PagesFree   int   // free pages on the group's slabs
	Bytes       int64 // bytes of the slabs lent to the group
}

// Stats is a snapshot of the pool.
type Stats struct {
	Groups    []GroupStats
	SlabBytes int64
	Slabs     int // slabs in the arena
	FreeSlabs int // slabs lent to no group
	Sequences int // open sequences
	// CachedBlocks is the number of blocks the prefix cache holds.
	CachedBlocks int
	// Prefix-cache lookups made by Open, the tokens they offered and the tokens served.
	PrefixQueries     int64
	PrefixQueryTokens int64
	PrefixHitTokens   int64
	// Evictions counts cached pages evicted to make room.
	Evictions int64
}

// Stats returns a snapshot of the pool.
func (p *Pool) Stats() Stats {
	var s Stats
	p.StatsInto(&s)
	return s
}

// StatsInto fills s, reusing its Groups slice, so that a metrics loop allocates nothing.
func (p *Pool) StatsInto(s *Stats) {
	s.Groups = s.Groups[:0]
	for g, gr := range p.groups {
		s.Groups = append(s.Groups, GroupStats{
			Name:        p.specs[g].Name,
			Kind:        gr.kind,
			PageBytes:   gr.pageBytes,
			Slabs:       gr.slabs,
			PagesUsed:   gr.used,
			PagesCached: gr.cached,
			PagesFree:   gr.slabs*gr.slots - gr.used - gr.cached,
			Bytes:       int64(gr.slabs) * p.slabBytes,
		})
	}
	s.SlabBytes = p.slabBytes
	s.Slabs = p.nslabs
	s.FreeSlabs = len(p.freeSlabs)
	s.Sequences = p.open
	s.CachedBlocks = len(p.cache.byHash)
	s.PrefixQueries = p.stats.queries
	s.PrefixQueryTokens = p.stats.queryTokens
	s.PrefixHitTokens = p.stats.hitTokens
	s.Evictions = p.stats.evictions
}

// Whole reports whether every slab is free: no sequence and no cached page holds memory.
func (p *Pool) Whole() bool { return len(p.freeSlabs) == p.nslabs }
