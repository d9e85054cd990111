package engine

import (
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
)

// Constraint restricts the tokens a request may generate: a grammar's matcher (core/grammar
// provides them for JSON Schema, regular expressions, GBNF and choices). The engine asks
// it for the mask of allowed tokens of each row the request samples, tells it each token
// the request generates, and rolls it back over the drafts it tried while building a
// verifying row's masks. A Constraint belongs to one request and is used by the engine's
// goroutine only.
type Constraint interface {
	// Words is the length of a mask: (vocabulary size + 31) / 32.
	Words() int
	// FillMask writes the tokens allowed next: bit t%32 of mask[t/32] for token t.
	FillMask(mask []uint32) error
	// Accept advances past tok, which the last mask allowed; EOS ends the output.
	Accept(tok int32) error
	// Rollback undoes the last n accepted tokens.
	Rollback(n int) error
	// Ended reports whether the output ended (EOS accepted): nothing is allowed after it,
	// so the request stops there even before its min_tokens.
	Ended() bool
}

// checkConstraint refuses a constrained request the runner cannot serve.
func checkConstraint(info RunnerInfo, sp *SamplingParams) error {
	c := sp.Constraint
	if c == nil {
		return nil
	}
	switch {
	case !info.TokenMasks:
		return fmt.Errorf("%w: runner %q does not apply token masks, so it cannot constrain the output to a grammar", ErrInvalidRequest, info.Name)
	case c.Words() != (info.VocabSize+31)/32:
		return fmt.Errorf("%w: the constraint's masks have %d words for a vocabulary of %d tokens", ErrInvalidRequest, c.Words(), info.VocabSize)
	case sp.IgnoreEOS:
		return fmt.Errorf("%w: ignore_eos cannot be combined with a grammar constraint (nothing is allowed once the grammar ends)", ErrInvalidRequest)
	}
	return nil
}

// FillTokenMasks writes the token masks of p's constrained rows (BatchPlan.TokenMask),
// and leaves p without masks when none of its rows is constrained. It must run after
// the plans before p were updated, since a mask depends on every token the request
// generated (with Config.Async a plan is built before the previous step's tokens are
// known, so its masks are filled once they are), and before p runs: the Engine does both.
// A caller that drives a Scheduler itself calls it on each plan it runs.
//
// Row j of a sequence that verifies drafts gets the mask after its first j drafts: the
// constraint accepts the drafts one by one and is rolled back over them afterwards. A
// draft the previous mask refuses can never be accepted, so the rows after it repeat the
// last mask. A constraint that fails (its grammar's state limit) finishes its request
// with the error; the row then gets a mask allowing everything, its result ignored. The
// rows' masks are computed in parallel, up to GOMAXPROCS at once, but only rows of
// distinct grammars run at the same time: core/grammar's matchers of one compiled grammar
// share its runtime, whose mutex is held for a whole mask walk, so the rows of requests
// under one grammar (json_object, or many clients sending one schema) fill one by one.
func (s *Scheduler) FillTokenMasks(p *BatchPlan) {
	p.TokenMaskStart, p.TokenMask = p.TokenMaskStart[:0], p.TokenMask[:0]
	idx := s.planIndex(p)
	reqs, epochs := s.planReqs[idx], s.planEpochs[idx]
	n := 0
	for _, r := range reqs {
		if r.constraint != nil {
			n++
		}
	}
	if n == 0 {
		return
	}
	words := (s.info.VocabSize + 31) / 32
	total := 0
	p.TokenMaskStart = append(p.TokenMaskStart, 0)
	rows := make([]int, 0, n) // the constrained rows still current
	for i, r := range reqs {
		if k := int(p.LogitsStart[i+1] - p.LogitsStart[i]); r.constraint != nil && k > 0 {
			if s.current(r, epochs, i) {
				rows = append(rows, i)
			}
			total += k * words
		}
		p.TokenMaskStart = append(p.TokenMaskStart, int32(total))
	}
	p.TokenMask = slices.Grow(p.TokenMask, total)[:total]
	fillOnes(p.TokenMask) // stale rows allow everything; their results are dropped
	masks := func(i int) []uint32 { return p.TokenMask[p.TokenMaskStart[i]:p.TokenMaskStart[i+1]] }
	errs := make([]error, len(rows))
	fill := func(k int) {
		i := rows[k]
		errs[k] = rowMasks(p, i, reqs[i].constraint, masks(i), words)
	}
	// Rows are independent (each constraint is one request's; grammars shared between
	// requests lock their own state, which serializes their rows), so a batch's cold
	// masks of distinct grammars are walked in parallel.
	if workers := min(len(rows), runtime.GOMAXPROCS(0)); workers <= 1 {
		for k := range rows {
			fill(k)
		}
	} else {
		var next atomic.Int32
		var wg sync.WaitGroup
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for k := int(next.Add(1)) - 1; k < len(rows); k = int(next.Add(1)) - 1 {
					fill(k)
				}
			}()
		}
		wg.Wait()
	}
	for k, err := range errs {
		if err != nil {
			r := reqs[rows[k]]
			s.finish(r, FinishError, fmt.Errorf("%w: grammar constraint of %q: %w", ErrInvalidRequest, r.id, err))
			fillOnes(masks(rows[k]))
		}
	}
}

// rowMasks fills the masks of sequence i's logits rows (see FillTokenMasks).
func rowMasks(p *BatchPlan, i int, c Constraint, masks []uint32, words int) error {
	if err := c.FillMask(masks[:words]); err != nil {
		return err
	}
	rows := len(masks) / words
	if rows == 1 {
		return nil
	}
	q1 := int(p.QueryStart[i+1])
	drafts := p.Tokens[q1-int(p.NumDrafts[i]) : q1]
	accepted, ok := 0, true
	for j := 1; j < rows; j++ {
		prev, m := masks[(j-1)*words:j*words], masks[j*words:(j+1)*words]
		if d := drafts[j-1]; ok && d >= 0 && int(d)>>5 < words && prev[d>>5]&(1<<(d&31)) != 0 && c.Accept(d) == nil {
			accepted++
			if err := c.FillMask(m); err != nil {
				_ = c.Rollback(accepted)
				return err
			}
			continue
		}
		ok = false
		copy(m, prev)
	}
	return c.Rollback(accepted)
}

func fillOnes(m []uint32) {
	for k := range m {
		m[k] = ^uint32(0)
	}
}

// acceptConstrained tells r's constraint the token r generated; a token the grammar
// refuses (a runner that ignored the mask) finishes r with the error.
func (s *Scheduler) acceptConstrained(r *request, t int32) bool {
	if err := r.constraint.Accept(t); err != nil {
		s.finish(r, FinishError, fmt.Errorf("%w: the runner sampled a token its grammar constraint refuses: %w", ErrBadResult, err))
		return false
	}
	return true
}
