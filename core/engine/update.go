package engine

import (
	"errors"
	"fmt"
	"slices"
	"time"
)

// Update applies the runner's result for plan (the one the last Schedule returned): it
// appends accepted tokens, checks stop conditions, commits full blocks to the prefix
// cache, rolls back rejected drafts and frees finished requests. A runner error, or a
// result that does not match the plan, fails that step's requests (finish reason error)
// and nothing else.
//
// Plans are updated in the order Schedule handed them out. When the step failed, a plan
// built after p (Config.Async) is rolled back too and must not run: Pending reports it. Update returns an error, and
// changes nothing, only when p is not the oldest plan not yet updated.
func (s *Scheduler) Update(p *BatchPlan, res StepResult, runErr error) error {
	if p == nil || len(s.pending) == 0 || p != s.pending[0] {
		return errors.New("engine: Update with a plan that is not the oldest one Schedule handed out")
	}
	idx := s.planIndex(p)
	reqs, epochs := s.planReqs[idx], s.planEpochs[idx]
	if runErr == nil {
		runErr = res.check(p, s.info.MaxDrafts, s.info.VocabSize)
	} else {
		runErr = fmt.Errorf("%w: step %d: %w", ErrRunner, p.Step, runErr)
	}
	if runErr != nil {
		s.metrics.runnerErrors++
		// The step's cache ops may not have run, and a plan built after it continued
		// from its results: that plan is void, and both plans' ops and releases come
		// again in the next plan (before the pages of the requests failed here are freed,
		// which forgets the copies meant for them).
		s.reissue(s.pending...)
		s.pending = append(s.pending[:0], s.pending[1:]...)
		for i, r := range reqs {
			if s.current(r, epochs, i) {
				s.finish(r, FinishError, runErr)
			}
		}
		s.rollback()
		return nil
	}
	s.pending = append(s.pending[:0], s.pending[1:]...)
	if len(p.CacheOps) > 0 {
		// The step ran its copies: their sources may go. (It cannot fail: the plan took
		// at least as many.)
		_ = s.pool.RetireCopies(len(p.CacheOps))
	}
	u := stepUpdate{s: s, p: p, res: &res, epochs: epochs, now: s.now()}
	u.nowNs = u.now.Sub(s.epoch).Nanoseconds()
	accepted, nextDrafts := res.Accepted[:len(reqs)], res.NumNextDrafts[:len(reqs)]
	scheduled := p.Scheduled[:len(reqs)]
	async, drafts, bt := s.cfg.Async, s.info.MaxDrafts > 0, s.bt
	plain := !p.anyLogprobs
	for i, r := range reqs {
		if accepted[i] != 1 || nextDrafts[i] != 0 || scheduled[i] != 1 || !plain || r.constraint != nil || !s.current(r, epochs, i) {
			u.apply(i, r)
			continue
		}
		// The common row, kept out of apply: one token fed, its successor sampled, no
		// drafts either way, no logprobs.
		t := res.Tokens[u.tok]
		u.tok++
		if async {
			r.aheadN--
			r.aheadOut--
		}
		r.computed++
		if r.computed >= r.committed+bt && !s.commit(r) {
			continue
		}
		if r.lastToken == u.itlFrom && len(r.tokens) != r.promptLen {
			u.itlN++ // observeToken's common case, inline
			r.lastToken = u.nowNs
		} else {
			u.observeToken(r)
		}
		r.tokens = append(r.tokens, t)
		r.last = t
		u.generated++
		r.out.Token(t, nil)
		if (r.stops || len(r.tokens) >= r.end) && s.stopped(r, t) {
			continue
		}
		r.flush()
		if drafts && len(r.drafts) > 0 {
			r.drafts = r.drafts[:0]
		}
	}
	u.done()
	return nil
}

// stepUpdate is Update's walk through one plan's rows: where each row's tokens, drafts
// and top logprobs start in the result, and the inter-token latencies being gathered.
type stepUpdate struct {
	s      *Scheduler
	p      *BatchPlan
	res    *StepResult
	epochs []uint32
	now    time.Time
	nowNs  int64 // now, in nanoseconds since the scheduler's epoch

	tok, draft, lpTop   int
	promptLp, promptTop int // offsets into the result's prompt logprobs
	generated           uint64
	// Requests that got their last token in the same step share one inter-token latency;
	// they are counted together and recorded once.
	itlFrom int64
	itlN    uint64
}

// apply applies the result of row i, planned for r, in the general case: prompt chunks,
// drafts, logprobs, rows whose request changed since the plan was built.
func (u *stepUpdate) apply(i int, r *request) {
	s, p, res := u.s, u.p, u.res
	a, nd := int(res.Accepted[i]), int(res.NumNextDrafts[i])
	t0, d0, top0 := u.tok, u.draft, u.lpTop
	u.tok += a
	u.draft += nd
	if p.Logprobs[i] > 0 {
		u.lpTop += a * int(p.Logprobs[i])
	}
	pr := p.PromptRows(i)
	pl0, pt0 := u.promptLp, u.promptTop
	if pr > 0 {
		u.promptLp += pr
		u.promptTop += pr * int(p.PromptLogprobs[i])
	}
	if !s.current(r, u.epochs, i) {
		return // finished, aborted or preempted since the plan was built
	}
	if pr > 0 && r.scoringPrompt() {
		u.takePromptLogprobs(i, r, pr, pl0, pt0)
	}
	n, k := int(p.Scheduled[i]), int(p.NumDrafts[i])
	// The plan's tokens are no longer ahead of the request; they are applied now.
	// (A request finished below, or above on a failed step, is reset by release.)
	if s.cfg.Async {
		r.aheadN -= n
		if a > 0 {
			r.aheadOut--
		}
	}
	if a == 0 {
		r.computed += n
	} else {
		// The fed tokens and the a-1 accepted drafts are in the cache now; the
		// rejected drafts' entries are rolled back.
		r.computed += n - k + a - 1
		if reject := k - (a - 1); reject > 0 {
			if err := s.trim(r); err != nil {
				s.finish(r, FinishError, fmt.Errorf("%w: roll back %d drafts of %q: %w", ErrCache, reject, r.id, err))
				return
			}
		}
		if k > 0 {
			s.metrics.observeDrafts(k, a-1)
		}
	}
	if r.computed >= r.committed+s.bt && !s.commit(r) {
		return
	}
	if a == 0 {
		return
	}
	u.observeToken(r)
	if r.extras&extraPrompt != 0 && len(r.tokens) == r.promptLen {
		if po, ok := r.out.(PromptLogprobsOutput); ok {
			po.PromptLogprobs(r.promptLps)
		}
	}
	if r.logprobs >= 0 {
		s.emitLogprobs(r, res.Tokens[t0:u.tok], res.Logprobs[t0:u.tok], res.TopTokens[top0:u.lpTop], res.TopLogprobs[top0:u.lpTop])
	} else {
		s.emit(r, res.Tokens[t0:u.tok])
	}
	if r.state == stateRunning && nd > 0 {
		// Keep only the drafts that can still become output.
		room := r.end - len(r.tokens) - 1
		r.drafts = append(r.drafts[:0], res.Drafts[d0:d0+max(0, min(nd, room))]...)
	} else if len(r.drafts) > 0 {
		r.drafts = r.drafts[:0]
	}
}

// takePromptLogprobs appends the scores of row i's pr prompt rows (from offsets pl and pt
// of the result) to r's prompt logprobs, skipping positions already scored (a preempted
// request recomputes its prompt).
func (u *stepUpdate) takePromptLogprobs(i int, r *request, pr, pl, pt int) {
	p, res := u.p, u.res
	k := int(p.PromptLogprobs[i])
	// Row j scores position Computed+j; the first unscored position is len(r.promptLps).
	j0 := len(r.promptLps) - int(p.Computed[i])
	if j0 < 0 {
		return
	}
	for j := j0; j < pr; j++ {
		lp := TokenLogprob{Token: p.PromptTarget(i, j), Logprob: res.PromptLogprobs[pl+j]}
		if k > 0 {
			lp.Top = make([]TopLogprob, k)
			for a := range lp.Top {
				lp.Top[a] = TopLogprob{Token: res.PromptTopTokens[pt+j*k+a], Logprob: res.PromptTopLogprobs[pt+j*k+a]}
			}
		}
		r.promptLps = append(r.promptLps, lp)
	}
}

// observeToken records the latency of r's new tokens of this step (time to first token,
// or the inter-token latency since r's previous step) and notes the step's time as r's
// latest token.
func (u *stepUpdate) observeToken(r *request) {
	switch {
	case len(r.tokens) == r.promptLen:
		u.s.metrics.ttft.observe(u.now.Sub(r.arrival).Seconds())
		r.firstTokenNs = u.nowNs
	case r.lastToken == u.itlFrom:
		u.itlN++ // the same latency as the previous row's
	default:
		if u.itlN > 0 {
			u.s.metrics.itl.observeN(float64(u.nowNs-u.itlFrom)*1e-9, u.itlN)
		}
		u.itlFrom, u.itlN = r.lastToken, 1
	}
	r.lastToken = u.nowNs
}

// done records what the walk gathered.
func (u *stepUpdate) done() {
	if u.itlN > 0 {
		u.s.metrics.itl.observeN(float64(u.nowNs-u.itlFrom)*1e-9, u.itlN)
	}
	u.s.metrics.generationTokens += u.generated
}

// commit registers r's full computed blocks in the prefix cache; on failure it finishes
// r and reports false. Only tokens already in r.tokens count: accepted drafts are
// computed before Update appends them, and a block keyed by what lies beyond the slice's
// length would serve wrong entries to a prompt that holds those bytes (the block is
// committed on a later step instead).
func (s *Scheduler) commit(r *request) bool {
	r.tablesGen = 0
	n := min(r.computed, len(r.tokens))
	if err := s.pool.Commit(r.seq, r.tokens[:n]); err != nil {
		s.finish(r, FinishError, fmt.Errorf("%w: commit %q: %w", ErrCache, r.id, err))
		return false
	}
	r.committed = n - n%s.bt
	return true
}

// emit appends r's new tokens, sends them to its output and finishes r at a stop token,
// at max tokens or at the end of the context.
func (s *Scheduler) emit(r *request, toks []int32) {
	defer r.flush()
	for _, t := range toks {
		if r.constraint != nil && !s.acceptConstrained(r, t) {
			return
		}
		r.tokens = append(r.tokens, t)
		r.last = t
		s.metrics.generationTokens++
		r.out.Token(t, nil)
		if (r.stops || len(r.tokens) >= r.end) && s.stopped(r, t) {
			return
		}
	}
}

// emitLogprobs is emit for a request that asked for logprobs.
func (s *Scheduler) emitLogprobs(r *request, toks []int32, lps []float32, topToks []int32, topLps []float32) {
	defer r.flush()
	top := int(r.logprobs)
	for j, t := range toks {
		if r.constraint != nil && !s.acceptConstrained(r, t) {
			return
		}
		r.tokens = append(r.tokens, t)
		r.last = t
		s.metrics.generationTokens++
		lp := TokenLogprob{Token: t, Logprob: lps[j]}
		if top > 0 {
			lp.Top = make([]TopLogprob, top)
			for k := range lp.Top {
				lp.Top[k] = TopLogprob{Token: topToks[j*top+k], Logprob: topLps[j*top+k]}
			}
		}
		r.out.Token(t, &lp)
		if s.stopped(r, t) {
			return
		}
	}
}

// flush hands out what r's output holds, when it is a FlushOutput.
func (r *request) flush() {
	if r.flusher != nil {
		r.flusher.Flush()
	}
}

// stopped finishes r when t is a stop token generated after min_tokens, r's grammar
// ended (it overrides min_tokens: the sampler let the grammar's EOS through, and nothing
// may follow it), or r reached its last allowed token (max tokens; Add made sure that
// this is within the context).
func (s *Scheduler) stopped(r *request, t int32) bool {
	if r.stops && len(r.tokens)-r.promptLen > int(r.minTokens) && (!r.ignoreEOS && slices.Contains(s.eos, t) || slices.Contains(r.stopIDs, t)) {
		s.finish(r, FinishStop, nil)
		return true
	}
	if r.constraint != nil && r.constraint.Ended() {
		s.finish(r, FinishStop, nil)
		return true
	}
	if len(r.tokens) >= r.end {
		s.finish(r, FinishLength, nil)
		return true
	}
	return false
}
