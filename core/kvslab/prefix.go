package kvslab

import "slices"

// prefixCache maps chained block hashes to the pages that hold the block in each group.
// Full and compressed pages are required: losing one drops the entry. Sliding-window and
// recurrent pages are optional: an entry may lack them (a window moved past the block, no
// checkpoint was taken there), and Lookup then cuts the hit short where they are needed.
type prefixCache struct {
	ngroups int
	byHash  map[uint64]int32
	hash    []uint64 // per entry
	pages   []PageID // per entry, ngroups long
	free    []int32  // free entry indices
	chain   []int32  // scratch: entries found along a lookup
}

// init sizes the cache for its most entries: every entry holds at least one page, so
// there are never more entries than pages, and adding or dropping one never allocates.
func (c *prefixCache) init(ngroups, pages int) {
	c.ngroups = ngroups
	c.byHash = make(map[uint64]int32, pages)
	c.hash = make([]uint64, 0, pages)
	c.pages = make([]PageID, 0, pages*ngroups)
	c.free = make([]int32, 0, pages)
}

func (c *prefixCache) entryPages(e int32) []PageID {
	return c.pages[int(e)*c.ngroups : int(e+1)*c.ngroups]
}

func (c *prefixCache) newEntry(h uint64) int32 {
	var e int32
	if n := len(c.free); n > 0 {
		e = c.free[n-1]
		c.free = c.free[:n-1]
		c.hash[e] = h
	} else {
		e = int32(len(c.hash))
		c.hash = append(c.hash, h)
		for range c.ngroups {
			c.pages = append(c.pages, NoPage)
		}
	}
	for i := range c.entryPages(e) {
		c.entryPages(e)[i] = NoPage
	}
	c.byHash[h] = e
	return e
}

func (c *prefixCache) dropEntry(e int32) {
	delete(c.byHash, c.hash[e])
	c.free = append(c.free, e)
}

// detach removes page m of group g from its cache entry. Losing a required page drops the
// whole entry; every page of it that no sequence holds is freed.
func (c *prefixCache) detach(p *Pool, g int, m int32) {
	e := p.owner[m]
	pages := c.entryPages(e)
	if required(p.groups[g].kind) {
		for h, id := range pages {
			if id != NoPage {
				p.uncache(h, id)
				pages[h] = NoPage
			}
		}
		c.dropEntry(e)
		return
	}
	p.uncache(g, p.pageOf(m))
	pages[g] = NoPage
	for _, id := range pages {
		if id != NoPage {
			return
		}
	}
	c.dropEntry(e)
}

func required(k Kind) bool { return k == Full || k == Compressed }

// uncache takes a page out of the prefix cache, freeing it if no sequence holds it.
func (p *Pool) uncache(g int, id PageID) {
	m := p.meta(id)
	p.owner[m] = -1
	if p.ref[m] == 0 {
		p.lruRemove(g, m)
		p.freeSlot(g, id)
	}
}

// Hash constants (64-bit golden ratio and the splitmix64 finaliser).
const (
	hashSeed = 0x9E3779B97F4A7C15
	hashMul1 = 0xBF58476D1CE4E5B9
	hashMul2 = 0x94D049BB133111EB
)

// BlockHash chains the hash of one block of tokens onto its parent's hash (0 for the
// first block). Equal hashes are taken to mean equal prefixes. It mixes two tokens per
// multiply (about 0.5 ns a token) and finishes with the splitmix64 finaliser.
func BlockHash(parent uint64, tokens []int32) uint64 {
	h := parent ^ hashSeed
	i := 0
	for ; i+1 < len(tokens); i += 2 {
		h ^= uint64(uint32(tokens[i])) | uint64(uint32(tokens[i+1]))<<32
		h *= hashMul1
		h ^= h >> 29
	}
	if i < len(tokens) {
		h ^= uint64(uint32(tokens[i]))
		h *= hashMul2
		h ^= h >> 29
	}
	h ^= uint64(len(tokens))
	h ^= h >> 30
	h *= hashMul1
	h ^= h >> 27
	h *= hashMul2
	h ^= h >> 31
	return h
}

// Lookup returns how many leading tokens of tokens (whole blocks only) the prefix cache can
// serve for every group. It changes nothing.
func (p *Pool) Lookup(tokens []int32) int {
	return p.lookup(tokens) * p.block
}

// lookup fills c.chain with the entries of the longest valid hit and returns its length in
// blocks.
func (p *Pool) lookup(tokens []int32) int {
	c := &p.cache
	c.chain = c.chain[:0]
	var h uint64
	for b := 0; (b+1)*p.block <= len(tokens); b++ {
		h = BlockHash(h, tokens[b*p.block:(b+1)*p.block])
		e, ok := c.byHash[h]
		if !ok {
			break
		}
		c.chain = append(c.chain, e)
	}
	n := len(c.chain)
	for n > 0 && !p.servable(n) {
		n--
	}
	c.chain = c.chain[:n]
	return n
}

// servable reports whether a hit of n blocks (c.chain[:n]) is valid for every group.
func (p *Pool) servable(n int) bool {
	c := &p.cache
	for g, s := range p.specs {
		switch s.Kind {
		case SlidingWindow:
			for b := p.windowStart(g, n*p.block); b < n; b++ {
				if c.entryPages(c.chain[b])[g] == NoPage {
					return false
				}
			}
		case Recurrent:
			if c.entryPages(c.chain[n-1])[g] == NoPage {
				return false
			}
		default:
			// Full and compressed pages are always present while the entry exists.
		}
	}
	return true
}

// windowStart is the first block a sliding-window group still needs when the next token to
// compute is at position pos.
func (p *Pool) windowStart(g, pos int) int {
	first := pos - p.specs[g].Window + 1
	if first <= 0 {
		return 0
	}
	return first / p.block
}

// Commit registers in the prefix cache every full block of the sequence not registered yet.
// tokens are the sequence's tokens whose cache entries are computed (prompt and output, in
// order); blocks beyond the sequence's length are ignored. A block already cached under the
// same hash keeps its pages, but takes the sequence's sliding-window or recurrent pages where
// it lacks them.
func (p *Pool) Commit(seq SeqID, tokens []int32) error {
	s, err := p.seq(seq)
	if err != nil {
		return err
	}
	n := min(len(tokens), s.length) / p.block
	c := &p.cache
	for b := s.committed; b < n; b++ {
		var parent uint64
		if b > 0 {
			parent = s.hashes[b-1]
		}
		h := BlockHash(parent, tokens[b*p.block:(b+1)*p.block])
		s.hashes = append(s.hashes[:b], h)
		e, hit := c.byHash[h]
		if !hit {
			e = c.newEntry(h)
		}
		pages := c.entryPages(e)
		for g := range p.specs {
			id := NoPage
			if b < len(s.tables[g]) {
				id = s.tables[g][b]
			}
			if id == NoPage || pages[g] != NoPage || p.owner[p.meta(id)] >= 0 {
				continue
			}
			if hit && required(p.groups[g].kind) {
				continue
			}
			pages[g] = id
			p.owner[p.meta(id)] = e
		}
		if !hit && !slices.ContainsFunc(pages, func(id PageID) bool { return id != NoPage }) {
			// Every group of the block is optional and none still holds a page (sliding
			// windows released them before the block was committed, as when the next
			// step was reserved before this one's commit): nothing to cache.
			c.dropEntry(e)
		}
	}
	s.committed = max(s.committed, n)
	return nil
}

// ClearCache evicts every unreferenced page from the prefix cache.
func (p *Pool) ClearCache() {
	for g := range p.groups {
		for p.groups[g].lruHead >= 0 {
			p.evict(p.groups[g].lruHead)
		}
	}
}
