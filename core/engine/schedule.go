package engine

import (
	"errors"
	"fmt"
	"slices"

	"github.com/resin-llm/resin/core/kvslab"
)

// Schedule builds the next step's BatchPlan, or returns nil when there is nothing to run
// or the previous plan has not been given to Update yet. With Config.Async one plan may
// be pending: Schedule then builds the next one ahead, continuing each request where the
// pending plan leaves it (a token that plan samples appears as PendingToken). The plan is
// frozen: it stays unchanged until the Schedule call after next.
//
// The rule: every running request is offered wanted − computed tokens (its unfed tokens
// plus drafts), capped by the remaining token budget; then waiting requests are admitted
// in queue order, each with its prefix-cache hit, while budget and sequence slots remain.
// When the pool runs out of pages a running request is preempted by recompute, and no
// request is admitted in that step. A request alone in the pool gets a smaller chunk, waits
// for a plan in flight to let go of its pages, and as a last resort starts over in an
// emptied pool (see restartAlone), where it runs alone, in chunks with which its length
// fits (lonePlan), until it ends, before it fails with ErrCache.
//
// With a runner that proposes drafts, no plan is built ahead of a pending one that
// samples (Schedule returns nil until it is updated): how many drafts that step accepts
// decides where its sequences continue, and the drafts it proposes are their next
// tokens. (Planning them anyway would need positions the runner corrects from the
// previous step's acceptance, as vLLM's GPU-side bookkeeping does; the plan keeps
// absolute positions instead.) Steps that only feed prompt chunks still overlap.
//
// The plan carries the page copies the pool recorded since the last plan (CacheOps) and
// the requests released since then (Released); see BatchPlan.
func (s *Scheduler) Schedule() *BatchPlan {
	if limit := 1 + b2i(s.cfg.Async); len(s.pending) >= limit {
		return nil
	}
	if len(s.pending) > 0 && s.info.MaxDrafts > 0 && len(s.pending[0].LogitsIndices) > 0 {
		// The plan in flight samples: how many drafts it accepts decides where its
		// sequences continue, and the drafts it proposes are their next tokens. Plan the
		// next step once it is known (so a drafting runner overlaps prompt chunks only).
		return nil
	}
	p := &s.plans[s.flip]
	reqs := s.planReqs[s.flip][:0]
	epochs := s.planEpochs[s.flip][:0]
	p.reset(len(s.groups))
	p.begin(s.cfg.MaxSeqs, s.cfg.MaxBatchTokens)
	var c cursor
	budget := s.cfg.MaxBatchTokens
	preempted := false

	for i := 0; i < len(s.running) && budget > 0 && len(reqs) < s.cfg.MaxSeqs; i++ {
		// Most rows of a step decode one token with their pages already reserved: take
		// the run of such requests from i on in one tight loop.
		if k := s.addDecodes(p, &c, s.running[i:i+min(len(s.running)-i, budget, s.cfg.MaxSeqs-len(reqs))]); k > 0 {
			rows := s.running[i : i+k]
			reqs = append(reqs, rows...)
			if s.cfg.Async {
				for _, r := range rows {
					epochs = append(epochs, r.epoch)
				}
			}
			budget -= k
			i += k - 1
			continue
		}
		r := s.running[i]
		// With a plan in flight (Config.Async) the request continues where that plan
		// leaves it: aheadN more tokens computed and aheadOut more sampled.
		at, have := r.computed+r.aheadN, len(r.tokens)+int(r.aheadOut)
		if r.aheadOut > 0 && have >= r.end {
			continue // the token in flight completes the request
		}
		n := min(have+len(r.drafts)-at, budget, s.info.MaxContext-at)
		if n <= 0 {
			continue
		}
		if s.startedOver(r) {
			n = min(n, s.loneChunk) // the chunk its length fits with (lonePlan)
		}
		wait := false
		for {
			err := s.reserve(r, at+n)
			if err == nil {
				break
			}
			if errors.Is(err, kvslab.ErrNoSpace) && len(s.running) > 1 {
				v := s.victim(i)
				s.preempt(v)
				preempted = true
				if v == r {
					r = nil
					break
				}
				continue
			}
			if errors.Is(err, kvslab.ErrNoSpace) && n > 1 {
				// Alone in the pool: a smaller chunk needs fewer pages (a sliding window
				// holds the chunk's blocks besides the window; the context cap counts a
				// chunk of one token, poolContext).
				n /= 2
				continue
			}
			if errors.Is(err, kvslab.ErrNoSpace) && len(s.pending) > 0 {
				// A plan in flight still holds pages it will let go: wait for it.
				wait = true
				break
			}
			if errors.Is(err, kvslab.ErrNoSpace) && s.restartAlone(r) {
				r = nil // back in the queue, first, for the admission below
				break
			}
			// Nothing left to preempt: the request cannot fit in this pool at all.
			s.finish(r, FinishError, fmt.Errorf("%w: reserve %d tokens for %q: %w", ErrCache, n, r.id, err))
			r = nil
			break
		}
		if wait {
			continue
		}
		if r == nil {
			i-- // running[i] is now the next request
			continue
		}
		reqs = append(reqs, r)
		if s.cfg.Async {
			epochs = append(epochs, r.epoch)
		}
		s.addToPlan(p, &c, r, n)
		budget -= n
	}

admission:
	for !preempted && budget > 0 && s.waiting.len() > 0 && len(s.running) < s.cfg.MaxSeqs && len(reqs) < s.cfg.MaxSeqs && !s.startedOverRuns() {
		r := s.waiting.front()
		n, how := s.admit(r, budget)
		switch how {
		case noRoom:
			break admission
		case failed:
			continue // r was finished and left the queue
		}
		s.waiting.popFront()
		r.state, r.planned = stateRunning, true
		s.addRunning(r)
		reqs = append(reqs, r)
		if s.cfg.Async {
			epochs = append(epochs, r.epoch)
		}
		s.addToPlan(p, &c, r, n)
		budget -= n
	}

	s.planReqs[s.flip] = reqs
	s.planEpochs[s.flip] = epochs
	p.end(c.b, c.t, c.l)
	if s.extraReqs > 0 {
		s.addExtras(p, reqs)
	}
	if len(reqs) == 0 {
		return nil
	}
	s.addCacheOps(p)
	s.flip ^= 1
	s.step++
	p.Step = s.step
	p.GraphBatch = s.graphBatch(p)
	s.pending = append(s.pending, p)
	return p
}

// addRunning appends r to the running list; under PolicyPriority it goes after every
// request that sorts before or with it by (priority, arrival order). Schedule offers pages
// in list order and preempts from the rest of it, so a list kept in priority order is what
// makes the preempted request the lowest-priority one, not one admitted later than a
// lower-priority request. (The list has room: admission stops at MaxSeqs.)
func (s *Scheduler) addRunning(r *request) {
	i := len(s.running)
	if s.cfg.Policy == PolicyPriority {
		for i > 0 && (s.running[i-1].priority > r.priority || s.running[i-1].priority == r.priority && s.running[i-1].order > r.order) {
			i--
		}
	}
	s.running = slices.Insert(s.running, i, r)
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

type admission uint8

const (
	admitted admission = iota
	noRoom             // the pool has no room now; the request stays waiting
	failed             // the request can never fit and was finished with an error
)

// admit opens r in the pool with its prefix-cache hit and reserves its first chunk, which
// it returns (a request alone in the pool gets a smaller chunk when the whole one does
// not fit).
func (s *Scheduler) admit(r *request, budget int) (int, admission) {
	known := r.tokens[:len(r.tokens)-1]
	if r.scoringPrompt() {
		known = known[:0] // every prompt row must be computed to be scored
	}
open:
	seq, hit, err := s.pool.Open(known)
	if err != nil {
		if errors.Is(err, kvslab.ErrNoSpace) && (len(s.running) > 0 || len(s.pending) > 0) {
			return 0, noRoom // others hold pages they will let go
		}
		if errors.Is(err, kvslab.ErrNoSpace) && s.restartAlone(r) {
			goto open
		}
		s.finish(r, FinishError, fmt.Errorf("%w: open %q: %w", ErrCache, r.id, err))
		return 0, failed
	}
	s.opens++
	// Pages pack while the pool is r's alone since it was emptied for it (see restartAlone).
	s.pool.PackPages(s.startedOver(r))
	r.seq, r.open, r.computed, r.committed, r.reserved = seq, true, hit, hit, hit
	r.tablesGen = 0
	n := min(len(r.tokens)-r.computed, budget)
	if s.startedOver(r) {
		n = min(n, s.loneChunk) // the chunk its length fits with (lonePlan)
	}
	for {
		err := s.reserve(r, r.computed+n)
		if err == nil {
			break
		}
		alone := errors.Is(err, kvslab.ErrNoSpace) && len(s.running) == 0 && len(s.pending) == 0
		if alone && n > 1 {
			n /= 2 // as in Schedule: alone, a smaller chunk needs fewer pages
			continue
		}
		if alone && s.restartAlone(r) {
			goto open
		}
		s.release(r, ReleaseAborted) // (announces nothing: no plan had the sequence)
		if !errors.Is(err, kvslab.ErrNoSpace) || alone {
			s.finish(r, FinishError, fmt.Errorf("%w: reserve %d tokens for %q: %w", ErrCache, n, r.id, err))
			return 0, failed
		}
		return 0, noRoom
	}
	s.metrics.prefixQueries += uint64(len(known))
	s.metrics.prefixHits += uint64(hit)
	if !r.admitted {
		r.admitted, r.cached = true, min(hit, r.promptLen)
		r.scheduledNs = s.sinceEpoch()
		s.metrics.promptTokens += uint64(r.promptLen)
	}
	return n, admitted
}

// cursor is how far Schedule has filled the plan: sequences, tokens, logits rows.
type cursor struct{ b, t, l int }

// addToPlan writes r's next n tokens (unfed tokens, then drafts) into the plan at the
// cursor. The pool has reserved them.
func (s *Scheduler) addToPlan(p *BatchPlan, c *cursor, r *request, n int) {
	at, have := r.computed+r.aheadN, len(r.tokens)+int(r.aheadOut)
	b, t := c.b, c.t
	if p.ReqIDs[b] != r.handle {
		s.writeSampling(p, b, r)
	}
	if r.logprobs >= 0 {
		p.anyLogprobs = true
	}
	p.Computed[b] = int32(at)
	p.Scheduled[b] = int32(n)
	sample := true
	if n == 1 && at+1 == have {
		// Decode: one known token, one logits row.
		p.NumDrafts[b] = 0
		tok := r.last
		if r.aheadOut > 0 {
			tok = PendingToken // sampled by the plan in flight
		}
		p.Tokens[t] = tok
		p.Positions[t] = int32(at)
		p.LogitsIndices[c.l] = int32(t)
		c.l++
	} else {
		sample = s.addChunk(p, c, r, n, at, have)
	}
	p.QueryStart[b+1] = int32(t + n)
	p.LogitsStart[b+1] = int32(c.l)

	if r.tablesGen == 0 {
		s.loadTables(r)
	}
	for g := range p.Groups {
		gp := &p.Groups[g]
		table := r.tables[g]
		gp.PageTable = append(gp.PageTable, table...)
		gp.PageTableStart[b+1] = int32(len(gp.PageTable))
		if n == 1 && s.groups[g].Kind == kvslab.Full {
			blk, off := s.blockOf(at)
			gp.SlotMapping[t] = int64(table[blk])*int64(s.bt) + int64(off)
		} else {
			s.mapSlots(gp, g, r, table, t, n, at)
		}
	}
	if s.cfg.Async {
		r.aheadN += n
		if sample {
			r.aheadOut++
		}
	}
	c.b++
	c.t += n
}

// writeSampling writes the rows of sequence b that never change for a request: its id,
// prompt length and sampling row. Callers skip it when row b already holds r's handle:
// the plans alternate, so the row still has what was written two plans ago.
func (s *Scheduler) writeSampling(p *BatchPlan, b int, r *request) {
	p.ReqIDs[b] = r.handle
	p.PromptLen[b] = int32(r.promptLen)
	p.Temperature[b] = r.temp
	p.TopP[b] = r.topP
	p.TopK[b] = r.topK
	p.MinP[b] = r.minP
	p.Seed[b] = r.seed
	p.Logprobs[b] = int32(r.logprobs)
	p.PresencePenalty[b] = r.presence
	p.FrequencyPenalty[b] = r.frequency
	p.RepetitionPenalty[b] = r.repeat
	p.MinTokens[b] = r.minTokens
}

// addExtras writes the sampling CSR arrays of a built plan whose requests in flight
// include some with a logit bias, a min-tokens gate or a penalty: each array that one of
// the plan's rows needs gets offsets for every row. (The arrays were cut by reset.)
func (s *Scheduler) addExtras(p *BatchPlan, reqs []*request) {
	var need extraKind
	for _, r := range reqs {
		need |= r.extras
	}
	if need == 0 {
		return
	}
	if need&extraBias != 0 {
		p.LogitBiasStart = append(p.LogitBiasStart, 0)
	}
	if need&extraStops != 0 {
		p.StopIDsStart = append(p.StopIDsStart, 0)
	}
	if need&extraHistory != 0 {
		p.HistoryStart = append(p.HistoryStart, 0)
	}
	if need&extraPrompt != 0 {
		p.PromptLogprobs = grow(p.PromptLogprobs, len(reqs))
		p.PromptNext = grow(p.PromptNext, len(reqs))
	}
	for b, r := range reqs {
		if need&extraPrompt != 0 {
			// Rows at positions below PromptLen-1 are scored against the prompt token
			// after them: the next row's, or for the chunk's last row PromptNext.
			p.PromptLogprobs[b], p.PromptNext[b] = -1, -1
			if r.scoringPrompt() && int(p.Computed[b]) < r.promptLen-1 {
				p.PromptLogprobs[b] = int32(r.logprobs)
				if end := int(p.Computed[b] + p.Scheduled[b]); end < r.promptLen {
					p.PromptNext[b] = r.tokens[end]
				}
			}
		}
		if need&extraBias != 0 {
			p.LogitBiasTokens = append(p.LogitBiasTokens, r.biasToks...)
			p.LogitBiasValues = append(p.LogitBiasValues, r.biasVals...)
			p.LogitBiasStart = append(p.LogitBiasStart, int32(len(p.LogitBiasTokens)))
		}
		if need&extraStops != 0 {
			p.StopIDs = append(p.StopIDs, r.stopMask...)
			p.StopIDsStart = append(p.StopIDsStart, int32(len(p.StopIDs)))
		}
		if need&extraHistory != 0 {
			if r.extras&extraHistory != 0 && p.LogitsStart[b+1] > p.LogitsStart[b] {
				// The tokens before the first sampled position; those a plan in flight
				// samples are not known yet (Config.Async).
				n := int(p.Computed[b] + p.Scheduled[b] - p.NumDrafts[b])
				known := min(n, len(r.tokens))
				p.History = append(p.History, r.tokens[:known]...)
				for k := known; k < n; k++ {
					p.History = append(p.History, PendingToken)
				}
			}
			p.HistoryStart = append(p.HistoryStart, int32(len(p.History)))
		}
	}
}

// addChunk writes the tokens of a prompt chunk, or of a decode token followed by drafts,
// at the cursor, and their logits rows when the chunk reaches the last known token, which
// it reports.
func (s *Scheduler) addChunk(p *BatchPlan, c *cursor, r *request, n, at, have int) bool {
	known := min(n, have-at)
	nd := n - known
	t := c.t
	p.NumDrafts[c.b] = int32(nd)
	for k := t + copy(p.Tokens[t:t+known], r.tokens[at:]); k < t+known; k++ {
		p.Tokens[k] = PendingToken // sampled by the plan in flight
	}
	copy(p.Tokens[t+known:t+n], r.drafts[:nd])
	pos := p.Positions[t : t+n]
	for j := range pos {
		pos[j] = int32(at + j)
	}
	if at+known < have {
		return false // mid-prompt: no logits
	}
	// The chunk reaches the last known token: sample after it and after each draft.
	for j := known - 1; j < n; j++ {
		p.LogitsIndices[c.l] = int32(t + j)
		c.l++
	}
	return true
}

// mapSlots writes the slot mapping of group g for r's n tokens from position at (plan
// rows t..t+n-1), given the group's page table.
func (s *Scheduler) mapSlots(gp *GroupPlan, g int, r *request, table []kvslab.PageID, t, n, at int) {
	slots := gp.SlotMapping[t : t+n]
	switch spec := &s.groups[g]; spec.Kind {
	case kvslab.Full, kvslab.SlidingWindow:
		// One run of consecutive slots per block.
		for j := 0; j < n; {
			blk, off := s.blockOf(at + j)
			slot := int64(table[blk])*int64(s.bt) + int64(off)
			run := slots[j:min(n, j+s.bt-off)]
			for k := range run {
				run[k] = slot + int64(k)
			}
			j += len(run)
		}
	case kvslab.Compressed:
		per := int64(s.bt / spec.Ratio)
		for j := range slots {
			blk, off := s.blockOf(at + j)
			slots[j] = int64(table[blk])*per + int64(off/spec.Ratio)
		}
	default:
		for j := range slots {
			slots[j] = NoSlot
		}
		gp.StatePage = append(gp.StatePage, s.pool.StatePage(r.seq, g))
	}
}

// blockOf splits a position into its block and the offset inside it, with a shift and a
// mask when the block size is a power of two.
func (s *Scheduler) blockOf(pos int) (int, int) {
	if s.btShift >= 0 {
		return pos >> s.btShift, pos & (s.bt - 1)
	}
	return pos / s.bt, pos % s.bt
}

// graphBatch returns the smallest declared graph bucket that holds the plan when every
// sequence decodes the same number of tokens, else 0 (eager). A row that feeds a prompt's
// last token is prefill, even alone: it samples as a decode does, but it is no decode.
func (s *Scheduler) graphBatch(p *BatchPlan) int32 {
	if len(s.info.GraphBuckets) == 0 {
		return 0
	}
	b := len(p.ReqIDs)
	per := p.Scheduled[0]
	for i := 0; i < b; i++ {
		if p.Scheduled[i] != per || p.LogitsStart[i+1]-p.LogitsStart[i] != per || p.Computed[i] < p.PromptLen[i] {
			return 0
		}
	}
	g, _ := PickBucket(s.info.GraphBuckets, b)
	return int32(g)
}

// PickBucket returns the smallest of buckets (ascending) that holds n, and false when n
// exceeds them all (run that step eagerly). It is the one rule by which graph buckets are
// chosen: the scheduler's GraphBatch, a runner's prefill graphs, a graph cache's key.
func PickBucket(buckets []int, n int) (int, bool) {
	for _, b := range buckets {
		if b >= n {
			return b, true
		}
	}
	return 0, false
}

// Rollback undoes a plan whose step did not run (the runner was cancelled), and any plan
// built after it: the reservations are returned and the requests stay where they were.
// The plans' CacheOps and Released come again in the next plan, before anything newer
// (a runner may so see an op twice, which gives the same bytes: see kvslab.DeferCopies).
// Like Update it refuses a plan that is not the oldest one handed out.
func (s *Scheduler) Rollback(p *BatchPlan) error {
	if p == nil || len(s.pending) == 0 || p != s.pending[0] {
		return errors.New("engine: Rollback with a plan that is not the oldest one Schedule handed out")
	}
	s.reissue(s.pending...)
	s.rollback()
	return nil
}

// rollback undoes every plan handed out and not updated, once reissue has taken their
// cache ops and releases back.
func (s *Scheduler) rollback() {
	for k := len(s.pending) - 1; k >= 0; k-- {
		q := s.pending[k]
		idx := s.planIndex(q)
		for i, r := range s.planReqs[idx] {
			if !s.current(r, s.planEpochs[idx], i) {
				continue
			}
			if s.cfg.Async {
				r.aheadN -= int(q.Scheduled[i])
				if q.LogitsStart[i+1] > q.LogitsStart[i] {
					r.aheadOut--
				}
			}
			if err := s.trim(r); err != nil {
				s.finish(r, FinishError, fmt.Errorf("%w: roll back %q: %w", ErrCache, r.id, err))
			}
		}
	}
	s.pending = s.pending[:0]
}

// addCacheOps fills the plan's CacheOps with the pool's page copies not yet handed out,
// and its Released with the releases since the last plan.
func (s *Scheduler) addCacheOps(p *BatchPlan) {
	if s.pool.PendingCopies() > 0 {
		s.copies = s.pool.TakeCopies(s.copies[:0])
		for _, c := range s.copies {
			p.CacheOps = append(p.CacheOps, CacheOp{Kind: OpCopyPage, Group: int32(c.Group), Src: c.Src, Dst: c.Dst})
		}
	}
	if len(s.released) > 0 {
		p.Released = append(p.Released, s.released...)
		s.released = s.released[:0]
	}
}

// reissue takes back the cache ops and releases of plans that failed or did not run: the
// pool hands the copies out again (their sources are still held), and the releases go in
// front of those since.
func (s *Scheduler) reissue(plans ...*BatchPlan) {
	s.pool.ReissueCopies()
	n := 0
	for _, q := range plans {
		n += len(q.Released)
	}
	if n == 0 {
		return
	}
	rel := make([]Release, 0, n+len(s.released))
	for _, q := range plans {
		rel = append(rel, q.Released...)
	}
	s.released = append(rel, s.released...)
}

// Pending reports whether p was handed out by Schedule and still waits for Update.
func (s *Scheduler) Pending(p *BatchPlan) bool {
	for _, q := range s.pending {
		if q == p {
			return true
		}
	}
	return false
}

// rollbackAll rolls back every plan handed out and not yet updated.
func (s *Scheduler) rollbackAll() {
	if len(s.pending) > 0 {
		_ = s.Rollback(s.pending[0])
	}
}

// current reports whether plan row i, built for r at epochs[i], still refers to r's present
// sequence (r was not finished, preempted or aborted since). Without Config.Async a plan
// is updated before the next is built, so a running request is always the same one.
func (s *Scheduler) current(r *request, epochs []uint32, i int) bool {
	return r.state == stateRunning && (!s.cfg.Async || r.epoch == epochs[i])
}

// loadTables fetches r's page tables from the pool. They stay valid until the next call
// that changes the sequence (Open, Reserve, Truncate, Commit clear tablesGen), so a
// decoding sequence asks the pool only when it grows a block.
func (s *Scheduler) loadTables(r *request) {
	for i := range r.tables {
		r.tables[i] = s.pool.PageTable(r.seq, i)
	}
	r.loads++
	if r.loads == 0 {
		r.loads = 1
	}
	r.tablesGen = r.loads
}

// reserve makes the pool hold at least need tokens of r. When every cache group keeps
// whole blocks (full attention, compressed) it reserves up to the end of the block, so a
// decoding sequence calls the pool once per block rather than once per token; sliding
// windows and recurrent states depend on the exact length and get exactly need.
func (s *Scheduler) reserve(r *request, need int) error {
	if need <= r.reserved {
		return nil
	}
	target := need
	if s.wholeBlocks {
		target = (need + s.bt - 1) / s.bt * s.bt
	}
	r.tablesGen = 0
	// Tokens of a plan in flight are not committed yet: their sliding-window blocks stay
	// until Update commits them.
	if err := s.pool.ReserveInFlight(r.seq, target-r.reserved, r.aheadN); err != nil {
		return err
	}
	r.reserved = target
	return nil
}

// trim returns what r holds beyond its computed tokens and those of a plan in flight
// (rejected drafts, a step that did not run) to the pool with Truncate: down to that length
// exactly, or, with whole-block reservations, down to the end of the block it reaches.
func (s *Scheduler) trim(r *request) error {
	keep := r.computed + r.aheadN // a plan in flight still needs its tokens
	if s.wholeBlocks {
		keep = (keep + s.bt - 1) / s.bt * s.bt
	}
	if r.reserved <= keep {
		return nil
	}
	r.tablesGen = 0
	if err := s.pool.Truncate(r.seq, r.reserved-keep); err != nil {
		return err
	}
	r.reserved = keep
	return nil
}

func (s *Scheduler) planIndex(p *BatchPlan) int {
	if p == &s.plans[0] {
		return 0
	}
	return 1
}

// queueLens implements gaugeSource.
func (s *Scheduler) queueLens() (int, int) { return len(s.running), s.waiting.len() }

// cacheUsage implements gaugeSource: the share of the arena each group's pages use.
func (s *Scheduler) cacheUsage(fn func(string, float64)) {
	s.pool.StatsInto(&s.stats)
	total := float64(s.stats.Slabs) * float64(s.stats.SlabBytes)
	for _, g := range s.stats.Groups {
		fn(g.Name, float64(g.PagesUsed)*float64(g.PageBytes)/total)
	}
}

// scoringPrompt reports whether r asked for prompt logprobs and does not have them all.
func (r *request) scoringPrompt() bool {
	return r.extras&extraPrompt != 0 && len(r.promptLps) < r.promptLen-1
}
