package kvslab

import (
	"fmt"
	"slices"
)

// seqState is one open sequence: its length and, per group, a page per block.
type seqState struct {
	open      bool
	length    int        // tokens reserved
	committed int        // leading blocks registered in the prefix cache
	hashes    []uint64   // chained hash of each committed block
	tables    [][]PageID // per group: page per block, NoPage where none is held
	state     []PageID   // per group: the live recurrent state (NoPage for other kinds)
	held      []int      // per group: first block that may hold a page (windows, checkpoints)
}

// initialBlocks is the page-table capacity a new sequence starts with, so that ordinary
// sequences grow without allocating; sequence slots are reused with their capacity.
const initialBlocks = 64

type undoEntry struct {
	group, block int32
}

func (p *Pool) seq(id SeqID) (*seqState, error) {
	if id < 0 || int(id) >= len(p.seqs) || !p.seqs[id].open {
		return nil, fmt.Errorf("%w: %d", ErrUnknownSeq, id)
	}
	return &p.seqs[id], nil
}

func (p *Pool) newSeq() SeqID {
	if len(p.freeSeqs) == 0 {
		p.addSeqs(max(1, len(p.seqs)))
	}
	id := p.freeSeqs[len(p.freeSeqs)-1]
	p.freeSeqs = p.freeSeqs[:len(p.freeSeqs)-1]
	s := &p.seqs[id]
	s.open = true
	s.length, s.committed = 0, 0
	s.hashes = s.hashes[:0]
	for g := range s.tables {
		s.tables[g] = s.tables[g][:0]
		s.state[g] = NoPage
		s.held[g] = 0
	}
	p.open++
	return id
}

// addSeqs prepares n more sequence slots, each with room for initialBlocks blocks per
// group, carved from a few shared arrays. The free list keeps room for every slot, so
// freeing never allocates.
func (p *Pool) addSeqs(n int) {
	ng := len(p.specs)
	tables := make([][]PageID, n*ng)
	pages := make([]PageID, n*ng*initialBlocks)
	state := make([]PageID, n*ng)
	held := make([]int, n*ng)
	hashes := make([]uint64, n*initialBlocks)
	first := len(p.seqs)
	p.seqs = slices.Grow(p.seqs, n)
	for i := range n {
		for g := range ng {
			k := (i*ng + g) * initialBlocks
			tables[i*ng+g] = pages[k : k : k+initialBlocks]
		}
		p.seqs = append(p.seqs, seqState{
			tables: tables[i*ng : (i+1)*ng : (i+1)*ng],
			state:  state[i*ng : (i+1)*ng : (i+1)*ng],
			held:   held[i*ng : (i+1)*ng : (i+1)*ng],
			hashes: hashes[i*initialBlocks : i*initialBlocks : (i+1)*initialBlocks],
		})
	}
	p.freeSeqs = slices.Grow(p.freeSeqs, len(p.seqs)-len(p.freeSeqs))
	for id := len(p.seqs) - 1; id >= first; id-- {
		p.freeSeqs = append(p.freeSeqs, SeqID(id))
	}
}

// Open opens a sequence and attaches the longest prefix of prompt that the prefix cache can
// serve for every group; it returns the number of tokens attached (whole blocks), which is
// the sequence's length. Pass only the tokens that may match: an engine that must compute at
// least one token passes prompt[:len(prompt)-1]. A recurrent group's state is restored from
// the checkpoint at the hit point (a copy recorded instead, with DeferCopies). Open fails with ErrNoSpace when the recurrent states of a
// new sequence do not fit.
func (p *Pool) Open(prompt []int32) (SeqID, int, error) {
	p.stats.queries++
	p.stats.queryTokens += int64(len(prompt))
	n := p.lookup(prompt)
	id := p.newSeq()
	s := &p.seqs[id]
	c := &p.cache
	// Hold the hit's pages first so that allocating the recurrent states cannot evict them.
	for g, spec := range p.specs {
		start := 0
		switch spec.Kind {
		case SlidingWindow:
			start = p.windowStart(g, n*p.block)
		case Recurrent:
			start = n
		}
		s.held[g] = start
		for b := range n {
			page := NoPage
			if b >= start {
				page = c.entryPages(c.chain[b])[g]
				p.hold(g, page)
			}
			s.tables[g] = append(s.tables[g], page)
		}
		if spec.Kind == Recurrent && n > 0 {
			p.hold(g, c.entryPages(c.chain[n-1])[g])
		}
	}
	for b := range n {
		s.hashes = append(s.hashes, c.hash[c.chain[b]])
	}
	s.length, s.committed = n*p.block, n
	var err error
	for g, spec := range p.specs {
		if spec.Kind != Recurrent {
			continue
		}
		page, ok := p.alloc(g)
		if !ok {
			err = fmt.Errorf("%w: no page for the state of recurrent group %q", ErrNoSpace, spec.Name)
			break
		}
		s.state[g] = page
		if n > 0 {
			ckpt := c.entryPages(c.chain[n-1])[g]
			if cerr := p.copyPage(id, g, page, ckpt); cerr != nil {
				err = fmt.Errorf("kvslab: restore recurrent group %q from its checkpoint: %w", spec.Name, cerr)
				break
			}
		}
	}
	for g, spec := range p.specs {
		if spec.Kind == Recurrent && n > 0 {
			p.release(g, c.entryPages(c.chain[n-1])[g])
		}
	}
	if err != nil {
		p.free(id)
		return -1, 0, err
	}
	p.stats.hitTokens += int64(n * p.block)
	return id, n * p.block, nil
}

// Reserve makes room for n more tokens of the sequence in every group, or changes nothing
// and returns ErrNoSpace. It first releases the sliding-window pages that the next token can
// no longer see. A recurrent group gets a checkpoint page for each block end the n tokens
// reach (the last Checkpoints of them) and lets go of older checkpoints beyond its quota,
// before it takes the new ones. (What a refused Reserve let go it does not take back: those
// pages the sequence no longer needed either way.)
func (p *Pool) Reserve(seq SeqID, n int) error { return p.ReserveInFlight(seq, n, 0) }

// ReserveInFlight is Reserve for a sequence whose last inFlight tokens are still being
// computed by a step that has not finished (an engine that builds step N+1 while N
// runs): sliding-window pages are released only behind the window of the first of
// them, and recurrent checkpoints at the block ends they reach are kept beyond the
// quota, so that the blocks that step completes keep their pages until they are
// committed to the prefix cache (a later Reserve releases them, cached).
func (p *Pool) ReserveInFlight(seq SeqID, n, inFlight int) error {
	s, err := p.seq(seq)
	if err != nil {
		return err
	}
	if n < 0 || inFlight < 0 || inFlight > s.length {
		return fmt.Errorf("kvslab: reserve %d tokens with %d in flight of %d", n, inFlight, s.length)
	}
	if n == 0 {
		return nil
	}
	for g, spec := range p.specs {
		if spec.Kind == SlidingWindow {
			w := p.windowStart(g, s.length-inFlight)
			p.releaseBlocks(s, g, s.held[g], min(w, len(s.tables[g])))
			s.held[g] = max(s.held[g], w)
		}
	}
	end := s.length + n
	blocks := (end + p.block - 1) / p.block
	// Checkpoints at the block ends the tokens in flight reach are kept beyond the quota
	// too, until a later Reserve after their commit lets them go into the prefix cache.
	inFlightFrom := (s.length - inFlight) / p.block
	p.undo = p.undo[:0]
	for g, spec := range p.specs {
		t := s.tables[g]
		if spec.Kind == Recurrent {
			for len(t) < blocks {
				t = append(t, NoPage)
			}
			s.tables[g] = t
			if spec.Checkpoints == 0 {
				continue
			}
			// Block b ends at (b+1)*block; the n tokens reach the ends in (length, end].
			first, last := s.length/p.block, end/p.block-1
			first = max(first, last-spec.Checkpoints+1)
			if first <= last {
				// The older checkpoints the new ones push past the quota go first, so
				// that the sequence never holds more than its quota (the pages a
				// context was sized for); a refused Reserve does not take them back
				// (they stay in the prefix cache).
				p.trimCheckpoints(s, g, max(spec.Checkpoints-(last-first+1), 0), inFlightFrom)
				s.held[g] = min(s.held[g], first)
			}
			for b := first; b <= last; b++ {
				if !p.grow(s, g, b) {
					return p.abortReserve(s, spec.Name)
				}
			}
			continue
		}
		for b := len(t); b < blocks; b++ {
			s.tables[g] = append(s.tables[g], NoPage)
			if !p.grow(s, g, b) {
				return p.abortReserve(s, spec.Name)
			}
		}
	}
	s.length = end
	for g, spec := range p.specs {
		if spec.Kind == Recurrent && spec.Checkpoints > 0 {
			p.trimCheckpoints(s, g, spec.Checkpoints, inFlightFrom)
		}
	}
	return nil
}

func (p *Pool) grow(s *seqState, g, b int) bool {
	id, ok := p.alloc(g)
	if !ok {
		return false
	}
	s.tables[g][b] = id
	p.undo = append(p.undo, undoEntry{int32(g), int32(b)})
	return true
}

func (p *Pool) abortReserve(s *seqState, group string) error {
	for i := len(p.undo) - 1; i >= 0; i-- {
		u := p.undo[i]
		p.release(int(u.group), s.tables[u.group][u.block])
		s.tables[u.group][u.block] = NoPage
	}
	blocks := (s.length + p.block - 1) / p.block
	for g := range s.tables {
		s.tables[g] = s.tables[g][:min(len(s.tables[g]), blocks)]
	}
	return fmt.Errorf("%w: group %q", ErrNoSpace, group)
}

// trimCheckpoints keeps the sequence's newest k checkpoints, and any at block keepFrom or
// later, and lets go of the rest.
func (p *Pool) trimCheckpoints(s *seqState, g, k, keepFrom int) {
	t := s.tables[g]
	kept := 0
	for b := len(t) - 1; b >= s.held[g]; b-- {
		if t[b] == NoPage {
			continue
		}
		if kept < k || b >= keepFrom {
			kept++
			continue
		}
		p.release(g, t[b])
		t[b] = NoPage
	}
	// Nothing below the oldest kept checkpoint is held any more.
	for s.held[g] < len(t) && t[s.held[g]] == NoPage && kept > 0 {
		s.held[g]++
	}
}

// releaseBlocks lets go of the group's pages for blocks [from, to), newest first, so that
// the LRU evicts a prefix's tail before its head.
func (p *Pool) releaseBlocks(s *seqState, g, from, to int) {
	t := s.tables[g]
	for b := to - 1; b >= from; b-- {
		if t[b] != NoPage {
			p.release(g, t[b])
			t[b] = NoPage
		}
	}
}

// Truncate drops the last n tokens of the sequence (rejected speculative tokens). Blocks
// that no longer hold a token are released; a block cut into is taken out of the sequence's
// committed prefix, and if the prefix cache or another sequence shares its page, the
// sequence gets a private copy first (so the cached block stays intact; with DeferCopies
// the copy is recorded, and the sequence's page table names the copy at once). A recurrent state
// cannot be rolled back by the pool: the runner keeps it consistent with the new length;
// the pool only drops checkpoints past it. Truncating a sliding-window group behind the
// pages it has already released is an error.
func (p *Pool) Truncate(seq SeqID, n int) error {
	s, err := p.seq(seq)
	if err != nil {
		return err
	}
	if n < 0 || n > s.length {
		return fmt.Errorf("kvslab: truncate %d tokens of a sequence of %d", n, s.length)
	}
	if n == 0 {
		return nil
	}
	end := s.length - n
	for g, spec := range p.specs {
		if spec.Kind == SlidingWindow && p.windowStart(g, end) < s.held[g] {
			return fmt.Errorf("kvslab: truncate to %d tokens: group %q already released the pages before token %d",
				end, spec.Name, s.held[g]*p.block)
		}
	}
	blocks := (end + p.block - 1) / p.block
	cut := end / p.block // first block that loses tokens or disappears
	if end%p.block != 0 && cut < s.committed {
		if err := p.privatize(seq, s, cut); err != nil {
			return err
		}
	}
	for g, spec := range p.specs {
		keep := blocks
		if spec.Kind == Recurrent {
			keep = cut // a checkpoint is valid only at a block end the sequence still reaches
		}
		p.releaseBlocks(s, g, max(s.held[g], keep), len(s.tables[g]))
		s.tables[g] = s.tables[g][:blocks]
		s.held[g] = min(s.held[g], keep)
	}
	s.committed = min(s.committed, cut)
	s.hashes = s.hashes[:s.committed]
	s.length = end
	return nil
}

// privatize gives the sequence its own copy of block b's shared or cached pages.
func (p *Pool) privatize(seq SeqID, s *seqState, b int) error {
	for g, spec := range p.specs {
		if spec.Kind == Recurrent || b >= len(s.tables[g]) || s.tables[g][b] == NoPage {
			continue
		}
		old := s.tables[g][b]
		m := p.meta(old)
		if p.owner[m] < 0 && p.ref[m] == 1 {
			continue
		}
		id, ok := p.alloc(g)
		if !ok {
			return fmt.Errorf("%w: copy of a shared block of group %q", ErrNoSpace, spec.Name)
		}
		if err := p.copyPage(seq, g, id, old); err != nil {
			p.release(g, id)
			return fmt.Errorf("kvslab: copy a shared block of group %q: %w", spec.Name, err)
		}
		s.tables[g][b] = id
		p.release(g, old)
	}
	return nil
}

// Free releases the sequence. Its committed blocks stay in the prefix cache until evicted.
func (p *Pool) Free(seq SeqID) error {
	if _, err := p.seq(seq); err != nil {
		return err
	}
	p.free(seq)
	return nil
}

func (p *Pool) free(seq SeqID) {
	p.dropCopies(seq)
	s := &p.seqs[seq]
	for g := range p.specs {
		p.releaseBlocks(s, g, s.held[g], len(s.tables[g]))
		s.tables[g] = s.tables[g][:0]
		if s.state[g] != NoPage {
			p.release(g, s.state[g])
			s.state[g] = NoPage
		}
	}
	s.open = false
	p.freeSeqs = append(p.freeSeqs, seq)
	p.open--
}

// Len is the number of tokens reserved for the sequence (0 for an unknown one).
func (p *Pool) Len(seq SeqID) int {
	s, err := p.seq(seq)
	if err != nil {
		return 0
	}
	return s.length
}

// PageTable is the sequence's page per block in group g: block b covers tokens
// [b*BlockTokens, (b+1)*BlockTokens). NoPage marks a block a sliding window released, or,
// for a recurrent group, a block end without a checkpoint: the runner writes the state as of
// the end of block b into table[b] when the step reaches that end. The slice is the pool's:
// read it, do not keep it past the next call that changes the sequence.
func (p *Pool) PageTable(seq SeqID, g int) []PageID {
	s, err := p.seq(seq)
	if err != nil || g < 0 || g >= len(s.tables) {
		return nil
	}
	return s.tables[g]
}

// StatePage is the live state page of recurrent group g (NoPage for other kinds).
func (p *Pool) StatePage(seq SeqID, g int) PageID {
	s, err := p.seq(seq)
	if err != nil || g < 0 || g >= len(s.state) {
		return NoPage
	}
	return s.state[g]
}

// OpenSeqs is the number of open sequences.
func (p *Pool) OpenSeqs() int { return p.open }
