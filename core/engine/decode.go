package engine

import "github.com/resin-llm/resin/core/kvslab"

// addDecodes writes plan rows for the leading requests of rs that decode exactly one
// known token: no drafts, the token's page already reserved, the page tables cached.
// That is almost every row of a steady decode step, and it gets one loop over flat
// slices instead of addToPlan's general case. It stops at the first request that needs
// more (a prompt chunk, drafts, a new block, a token in flight that ends it) and returns
// how many it added; Schedule takes that one through the general path.
//
// The rows are exactly what addToPlan would write: sequence b0+k feeds token t0+k at its
// next position and samples logits row l0+k. A run that starts the plan skips what the
// previous build of the same buffer left in place: the request-independent columns of
// its decode rows, and the page tables of the leading rows that hold the same request
// with the same tables as then.
func (s *Scheduler) addDecodes(p *BatchPlan, c *cursor, rs []*request) int {
	if !s.decodeSlots {
		return 0
	}
	b0, t0, l0 := c.b, c.t, c.l
	n := len(rs)
	ids, computed := p.ReqIDs[b0:b0+n], p.Computed[b0:b0+n]
	tokens, positions := p.Tokens[t0:t0+n], p.Positions[t0:t0+n]
	gens := p.tableGens[b0 : b0+n]
	reuse := 0 // leading rows still laid out as the previous build left them
	if b0 == 0 {
		reuse = min(p.lastDecodeRows, n)
	}
	samePages := reuse > 0 // every row so far kept its page tables in place
	async, drafts := s.cfg.Async, s.info.MaxDrafts > 0
	k := 0
	for ; k < len(rs); k++ {
		r := rs[k]
		// (The fields for async scheduling and drafts are read only when they can be set:
		// a synchronous decode step touches only the request's first two cache lines.)
		at, have, pending := r.computed, len(r.tokens), false
		if async {
			at += r.aheadN
			have += int(r.aheadOut)
			pending = r.aheadOut > 0
		}
		if have != at+1 || drafts && len(r.drafts) > 0 || at >= r.reserved || r.tablesGen == 0 ||
			pending && have >= r.end || at >= s.info.MaxContext {
			break
		}
		same := ids[k] == r.handle
		if !same {
			s.writeSampling(p, b0+k, r)
		}
		if samePages && (k >= reuse || !same || gens[k] != r.tablesGen) {
			// From here on the page tables are copied: cut them where this row starts.
			samePages = false
			for g := range p.Groups {
				gp := &p.Groups[g]
				gp.PageTable = gp.PageTable[:gp.PageTableStart[k]]
			}
		}
		gens[k] = r.tablesGen
		if r.logprobs >= 0 {
			p.anyLogprobs = true
		}
		computed[k] = int32(at)
		tok := r.last
		if pending {
			tok = PendingToken // sampled by the plan in flight
		}
		tokens[k] = tok
		positions[k] = int32(at)
		blk, off := s.blockOf(at)
		for g := range p.Groups {
			gp := &p.Groups[g]
			var page kvslab.PageID
			if samePages {
				// The row's copy, contiguous with its neighbours', rather than the pool's.
				page = gp.PageTable[:cap(gp.PageTable)][int(gp.PageTableStart[k])+blk]
			} else {
				table := r.tables[g]
				gp.PageTable = append(gp.PageTable, table...)
				gp.PageTableStart[b0+k+1] = int32(len(gp.PageTable))
				page = table[blk]
			}
			gp.SlotMapping[t0+k] = int64(page)*int64(s.bt) + int64(off)
		}
		if async {
			r.aheadN++
			r.aheadOut++
		}
	}
	if samePages {
		for g := range p.Groups {
			gp := &p.Groups[g]
			gp.PageTable = gp.PageTable[:gp.PageTableStart[k]]
		}
	}
	if b0 == 0 {
		p.decodeRows = k
	}
	// What does not depend on the request: one token, no drafts, one logits row each.
	// The first reuse rows have it from the previous build.
	from := min(reuse, k)
	scheduled, numDrafts := p.Scheduled[b0+from:b0+k], p.NumDrafts[b0+from:b0+k]
	for j := range scheduled {
		scheduled[j] = 1
	}
	clear(numDrafts)
	queryStart, logitsStart := p.QueryStart[b0+1+from:b0+1+k], p.LogitsStart[b0+1+from:b0+1+k]
	for j := range queryStart {
		queryStart[j] = int32(t0 + from + j + 1)
	}
	for j := range logitsStart {
		logitsStart[j] = int32(l0 + from + j + 1)
	}
	logits := p.LogitsIndices[l0+from : l0+k]
	for j := range logits {
		logits[j] = int32(t0 + from + j)
	}
	c.b, c.t, c.l = b0+k, t0+k, l0+k
	return k
}
