package engine

// addDecodes writes plan rows for the leading requests of rs that decode exactly one
// known token: no drafts, the token's page already reserved, the page tables cached.
// That is almost every row of a steady decode step, and it gets one loop over flat
// slices instead of addToPlan's general case. It stops at the first request that needs
// more (a prompt chunk, drafts, a new block, a token in flight that ends it) and returns
// how many it added; Schedule takes that one through the general path.
//
// The rows are exactly what addToPlan would write: sequence b0+k feeds token t0+k at its
// next position and samples logits row l0+k.
func (s *Scheduler) addDecodes(p *BatchPlan, c *cursor, rs []*request) int {
	if !s.decodeSlots {
		return 0
	}
	b0, t0, l0 := c.b, c.t, c.l
	n := len(rs)
	ids, computed := p.ReqIDs[b0:b0+n], p.Computed[b0:b0+n]
	tokens, positions := p.Tokens[t0:t0+n], p.Positions[t0:t0+n]
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
		if have != at+1 || drafts && len(r.drafts) > 0 || at >= r.reserved || !r.tablesValid ||
			pending && have >= r.end || at >= s.info.MaxContext {
			break
		}
		if ids[k] != r.handle {
			s.writeSampling(p, b0+k, r)
		}
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
			table := r.tables[g]
			gp.PageTable = append(gp.PageTable, table...)
			gp.PageTableStart[b0+k+1] = int32(len(gp.PageTable))
			gp.SlotMapping[t0+k] = int64(table[blk])*int64(s.bt) + int64(off)
		}
		if async {
			r.aheadN++
			r.aheadOut++
		}
	}
	// What does not depend on the request: one token, no drafts, one logits row each.
	scheduled, numDrafts := p.Scheduled[b0:b0+k], p.NumDrafts[b0:b0+k]
	for j := range scheduled {
		scheduled[j] = 1
	}
	clear(numDrafts)
	queryStart, logitsStart := p.QueryStart[b0+1:b0+1+k], p.LogitsStart[b0+1:b0+1+k]
	for j := range queryStart {
		queryStart[j] = int32(t0 + j + 1)
	}
	for j := range logitsStart {
		logitsStart[j] = int32(l0 + j + 1)
	}
	logits := p.LogitsIndices[l0 : l0+k]
	for j := range logits {
		logits[j] = int32(t0 + j)
	}
	c.b, c.t, c.l = b0+k, t0+k, l0+k
	return k
}
