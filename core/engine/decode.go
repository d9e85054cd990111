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
	scheduled, drafts := p.Scheduled[b0:b0+n], p.NumDrafts[b0:b0+n]
	queryStart, logitsStart := p.QueryStart[b0+1:b0+1+n], p.LogitsStart[b0+1:b0+1+n]
	tokens, positions := p.Tokens[t0:t0+n], p.Positions[t0:t0+n]
	logits := p.LogitsIndices[l0 : l0+n]
	async := s.cfg.Async
	k := 0
	for ; k < len(rs); k++ {
		r := rs[k]
		at := r.computed + r.aheadN
		have := len(r.tokens) + int(r.aheadOut)
		if have != at+1 || len(r.drafts) > 0 || at >= r.reserved || !r.tablesValid ||
			r.aheadOut > 0 && have >= r.end || at >= s.info.MaxContext {
			break
		}
		if ids[k] != r.handle {
			s.writeSampling(p, b0+k, r)
		}
		if r.logprobs >= 0 {
			p.anyLogprobs = true
		}
		computed[k] = int32(at)
		scheduled[k] = 1
		drafts[k] = 0
		tok := r.last
		if r.aheadOut > 0 {
			tok = PendingToken // sampled by the plan in flight
		}
		tokens[k] = tok
		positions[k] = int32(at)
		queryStart[k] = int32(t0 + k + 1)
		logits[k] = int32(t0 + k)
		logitsStart[k] = int32(l0 + k + 1)
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
	c.b, c.t, c.l = b0+k, t0+k, l0+k
	return k
}
