package kvslab

import "fmt"

// GroupSizing is what one group gets from a budget.
type GroupSizing struct {
	Name         string
	PageBytes    int64
	PagesPerSlab int
	// MaxPages is the number of pages the group could hold if it had every slab.
	MaxPages int
	// PagesPerSeq is the pages one sequence of ContextTokens tokens holds in this group.
	PagesPerSeq int
}

// Sizing is how a byte budget serves a model's cache groups.
type Sizing struct {
	Budget    int64
	SlabBytes int64
	Slabs     int
	Groups    []GroupSizing
	// Batch is the number of sequences the sizing was asked for, and ContextTokens the
	// longest context each of them can hold at the same time.
	Batch         int
	ContextTokens int
}

// Size reports what a budget of bytes holds for the groups of cfg: the pages of each group,
// and the context that each of batch concurrent sequences can reach while reserving up to
// cfg.ChunkTokens tokens ahead with cfg.InFlightTokens in flight. It rejects a budget below one slab and one that cannot hold
// a single sequence of one token.
func Size(cfg Config, budget int64, batch int) (Sizing, error) {
	slab, err := cfg.slabBytes()
	if err != nil {
		return Sizing{}, err
	}
	if batch < 1 {
		return Sizing{}, fmt.Errorf("kvslab: size for a batch of %d sequences: need at least one", batch)
	}
	if budget < slab {
		return Sizing{}, fmt.Errorf("%w: a budget of %d bytes is below one slab of %d bytes", ErrInvalidSpec, budget, slab)
	}
	z := Sizing{Budget: budget, SlabBytes: slab, Slabs: int(min(budget/slab, MaxSlabs)), Batch: batch}
	for _, g := range cfg.Groups {
		pps := int(slab / g.PageBytes())
		z.Groups = append(z.Groups, GroupSizing{Name: g.Name, PageBytes: g.PageBytes(), PagesPerSlab: pps, MaxPages: pps * z.Slabs})
	}
	if cfg.ChunkTokens < 0 || cfg.InFlightTokens < 0 {
		return Sizing{}, fmt.Errorf("%w: %d chunk tokens, %d in flight", ErrInvalidSpec, cfg.ChunkTokens, cfg.InFlightTokens)
	}
	ahead := reach{chunk: max(cfg.ChunkTokens, 1), inFlight: cfg.InFlightTokens}
	fits := func(tokens, batch int) bool { return slabsFor(cfg.Groups, z.Groups, tokens, ahead, batch) <= z.Slabs }
	if !fits(1, 1) {
		return Sizing{}, fmt.Errorf("%w: a budget of %d bytes (%d slabs of %d bytes) cannot hold one sequence: it needs %d slabs",
			ErrInvalidSpec, budget, z.Slabs, slab, slabsFor(cfg.Groups, z.Groups, 1, ahead, 1))
	}
	// Largest context that fits for the whole batch (0 if the batch does not fit at all).
	lo, hi := 0, 1
	for fits(hi, batch) && hi < 1<<40 {
		lo, hi = hi, hi*2
	}
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		if fits(mid, batch) {
			lo = mid
		} else {
			hi = mid
		}
	}
	z.ContextTokens = lo
	for i, g := range cfg.Groups {
		z.Groups[i].PagesPerSeq = pagesFor(g, lo, ahead)
	}
	return z, nil
}

// reach is how far ahead of its computed tokens a sequence reserves: a chunk of at least
// one token, with up to inFlight more still being computed.
type reach struct{ chunk, inFlight int }

// pagesFor is the most pages one sequence of n tokens holds in group g.
func pagesFor(g GroupSpec, n int, ahead reach) int {
	if n <= 0 {
		return 0
	}
	blocks := (n + g.PageTokens - 1) / g.PageTokens
	switch g.Kind {
	case SlidingWindow:
		// The blocks the first token in flight sees and those written up to the chunk's
		// end: Window+inFlight+chunk-1 tokens, from anywhere in a block.
		return min(blocks, (g.Window+ahead.inFlight+ahead.chunk-2+g.PageTokens-1)/g.PageTokens+1)
	case Recurrent:
		// The state and the checkpoints: the quota, those the tokens in flight reach, and
		// until the first step after a prefix hit has run the checkpoint its state was
		// restored from (the copy's source).
		if g.Checkpoints == 0 {
			return 1
		}
		inFlight := min(g.Checkpoints, (ahead.inFlight+g.PageTokens-1)/g.PageTokens)
		return 1 + min(g.Checkpoints+inFlight+1, n/g.PageTokens)
	default:
		return blocks
	}
}

func slabsFor(groups []GroupSpec, z []GroupSizing, tokens int, ahead reach, batch int) int {
	n := 0
	for i, g := range groups {
		pages := pagesFor(g, tokens, ahead) * batch
		n += (pages + z[i].PagesPerSlab - 1) / z[i].PagesPerSlab
	}
	return n
}

// String renders the sizing as a short table.
func (z Sizing) String() string {
	s := fmt.Sprintf("budget %d bytes: %d slabs of %d bytes; %d sequences of up to %d tokens\n",
		z.Budget, z.Slabs, z.SlabBytes, z.Batch, z.ContextTokens)
	for _, g := range z.Groups {
		s += fmt.Sprintf("  %-16s page %9d bytes  %6d pages/slab  %9d pages max  %6d pages/seq\n",
			g.Name, g.PageBytes, g.PagesPerSlab, g.MaxPages, g.PagesPerSeq)
	}
	return s
}
