package kvslab

import "fmt"

// PageCopy is a whole-page copy the pool needs before a sequence's pages are next read:
// page Src of group Group onto page Dst, for sequence Seq. Truncate records one when it
// gives a sequence a private copy of a shared block (copy-on-write), Open when it restores
// a recurrent state from a prefix-cache checkpoint.
type PageCopy struct {
	Group    int
	Src, Dst PageID
	Seq      SeqID
}

// DeferCopies switches how the pool copies pages. Off (the default), Open and Truncate
// copy through the arena at once, as a caller that runs the model on the same thread
// expects. On, they record each copy instead (TakeCopies hands them out, in order) and
// the caller has them executed before anything reads the sequences' pages: the engine
// turns this on and puts the copies in BatchPlan.CacheOps, so that a runner executes
// them on its own stream, and in order with the steps it is still running.
//
// A recorded copy holds its source page (the page cannot be evicted, freed or reused)
// until RetireCopies says the copy was executed, so executing a copy again, after a step
// that failed or never ran, gives the same bytes.
func (p *Pool) DeferCopies(on bool) { p.deferCopies = on }

// TakeCopies appends to dst, in order, the copies recorded and not yet taken, marks them
// taken and returns dst.
func (p *Pool) TakeCopies(dst []PageCopy) []PageCopy {
	dst = append(dst, p.copies[p.taken:]...)
	p.taken = len(p.copies)
	return dst
}

// RetireCopies reports that the n oldest taken copies were executed: their source pages
// are let go.
func (p *Pool) RetireCopies(n int) error {
	if n < 0 || n > p.taken {
		return fmt.Errorf("kvslab: retire %d copies of %d taken", n, p.taken)
	}
	for _, c := range p.copies[:n] {
		p.release(c.Group, c.Src)
	}
	m := copy(p.copies, p.copies[n:])
	p.copies = p.copies[:m]
	p.taken -= n
	return nil
}

// ReissueCopies reports that the taken copies not retired may not have been executed (the
// step that carried them failed or never ran): TakeCopies hands them out again, before
// any copy recorded since. A taken copy whose sequence was freed since is dropped
// instead (its source let go): its destination page went back to the pool with the
// sequence and may belong to another one by now.
func (p *Pool) ReissueCopies() {
	k := 0
	for _, c := range p.copies {
		if c.Seq == freedSeq {
			p.release(c.Group, c.Src)
			continue
		}
		p.copies[k] = c
		k++
	}
	p.copies, p.taken = p.copies[:k], 0
}

// DropCopies forgets every copy recorded and not retired, taken or not, and lets go of
// their sources: for a runner that lost its cache (a restarted process), for which no
// pending copy means anything any more. Call ClearCache after it to empty the prefix
// cache of the pages the copies held.
func (p *Pool) DropCopies() {
	for _, c := range p.copies {
		p.release(c.Group, c.Src)
	}
	p.copies, p.taken = p.copies[:0], 0
}

// PendingCopies is the number of copies recorded and not yet retired.
func (p *Pool) PendingCopies() int { return len(p.copies) }

// CopyPage copies page src of group g onto page dst of the same group through the arena:
// how a runner of a host or device arena executes a PageCopy. It checks the page ids
// against the pool's geometry only (it reads nothing that Open, Reserve or Free change,
// so a runner may call it while the scheduler works on the pool).
func (p *Pool) CopyPage(g int, dst, src PageID) error {
	if g < 0 || g >= len(p.groups) {
		return fmt.Errorf("kvslab: copy a page of group %d: the pool has %d groups", g, len(p.groups))
	}
	for _, id := range [2]PageID{src, dst} {
		if id == NoPage || id.Slab() >= p.nslabs || id.Slot() >= p.groups[g].slots {
			return fmt.Errorf("kvslab: copy a page of group %q: page %#x is outside the pool", p.specs[g].Name, uint32(id))
		}
	}
	if src == dst {
		return nil
	}
	n := p.groups[g].pageBytes
	if err := p.arena.Copy(p.PageOffset(g, dst), p.PageOffset(g, src), n); err != nil {
		return fmt.Errorf("kvslab: copy page %#x onto %#x of group %q: %w", uint32(src), uint32(dst), p.specs[g].Name, err)
	}
	return nil
}

// copyPage copies page src of group g onto dst for seq, at once or, with DeferCopies, by
// recording the copy (holding src until it is retired).
func (p *Pool) copyPage(seq SeqID, g int, dst, src PageID) error {
	if !p.deferCopies {
		return p.arena.Copy(p.PageOffset(g, dst), p.PageOffset(g, src), p.groups[g].pageBytes)
	}
	p.hold(g, src)
	p.copies = append(p.copies, PageCopy{Group: g, Src: src, Dst: dst, Seq: seq})
	return nil
}

// freedSeq marks a taken copy whose sequence was freed while the copy was out: it is
// retired as usual when its step ran, and dropped, not handed out again, when not.
const freedSeq SeqID = -1

// dropCopies forgets the copies recorded for seq and not yet taken, and marks those taken
// (the sequence is being freed, so nothing will read their destinations; a taken copy
// may be running, so its source stays held until it is retired or reissued).
func (p *Pool) dropCopies(seq SeqID) {
	for i := range p.copies[:p.taken] {
		if p.copies[i].Seq == seq {
			p.copies[i].Seq = freedSeq
		}
	}
	k := p.taken
	for _, c := range p.copies[p.taken:] {
		if c.Seq == seq {
			p.release(c.Group, c.Src)
			continue
		}
		p.copies[k] = c
		k++
	}
	p.copies = p.copies[:k]
}
