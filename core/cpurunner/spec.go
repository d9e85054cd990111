package cpurunner

import (
	"fmt"
	"math"

	"github.com/resin-llm/resin/core/engine"
)

// Drafter is a Forwarder whose model also proposes draft tokens for speculative decoding
// (an MTP head, a draft model). Runner declares its MaxDrafts to the engine, verifies the
// drafts a plan feeds against the tokens it samples from their logits rows, and then
// hands the outcome to Draft. A Drafter that samples its drafts from a distribution of
// its own also implements DraftSampler.
//
// Verification is vLLM's for greedy rows and exact for sampled ones: row j of a sequence
// is sampled as usual (its random draw depends only on the request's seed and the
// position), and draft j is accepted when it equals that token; the first row whose
// token differs from its draft, or the row after the last draft, gives the sequence's
// last token. Output is then the same token for token as without drafts, at any
// temperature. For drafts proposed greedily (a one-hot draft distribution) this accepts
// a draft with the target's probability of it and otherwise samples the target
// distribution without it, which is what rejection sampling does.
type Drafter interface {
	Forwarder
	// MaxDrafts is the most drafts Draft proposes per sequence (0: none; Runner then
	// never calls Draft).
	MaxDrafts() int
	// Draft is called after each successful Forward and sampling of plan, with the step's
	// result filled in but for the next drafts: for sequence i, res.Accepted[i] tokens of
	// res.Tokens (0 for a mid-prompt chunk; else the plan's accepted drafts, then the
	// token sampled after them). It must put back whatever the forward wrote into the
	// sequence's cache for the rejected drafts (the engine then truncates their slots),
	// and it sets res.NumNextDrafts[i] and appends that many drafts to res.Drafts, in
	// sequence order.
	Draft(plan *engine.BatchPlan, res *engine.StepResult) error
}

// DraftSampler is a Drafter that samples its drafts from a draft distribution q (DSpark's
// block with its Markov head) instead of proposing them greedily. Runner verifies such
// drafts exactly at any temperature by rejection sampling (engine.VerifyDraft): on a
// sampled row (temperature > 0, top-k not 1) draft j is accepted while u < min(1,
// p(d_j)/q(d_j)), where p is the target's distribution after the request's sampling
// transforms, penalties and grammar mask (engine.Sampler.Distribution), exactly what plain
// decoding samples from; the first rejected draft is replaced by a draw from
// normalize(max(0, p − q)); after the last accepted draft the bonus token is sampled from
// p as without drafts. The draws depend only on the request's seed and the position, so a
// request's tokens do not depend on its batch. Greedy rows keep the Drafter path (the
// draft is accepted when it equals the argmax), so greedy output equals plain greedy
// decoding whatever q is.
//
// A DraftSampler should draw draft d at position P from q with engine.DraftUniform(seed,
// P), seed being plan.SamplingOf(i).Seed: that draw is a function of (seed, P) only and
// independent of the verification's draws, which exactness needs.
type DraftSampler interface {
	Drafter
	// DraftDistribution returns q for draft j (0-based) of plan's sequence i, the drafts
	// the plan feeds (plan.Tokens[plan.QueryStart[i+1]-plan.NumDrafts[i]+j]), which an
	// earlier Draft proposed for that request (plan.ReqIDs[i]): the probabilities over the
	// vocabulary (length RunnerInfo.VocabSize, summing to 1) that draft was drawn from,
	// given the drafts before it. Runner calls it during Execute, after Forward and before
	// Draft, for j = 0, 1, ... up to the first rejected draft of a sampled row; it only
	// reads the slice, which must stay valid until Draft is called. The engine may feed
	// fewer drafts than Draft proposed (a prefix of them), never others. q[draft] must be
	// positive and q a distribution (no negative, NaN or infinite entry, summing to 1
	// within 1e-2), else the step fails; so does an error.
	DraftDistribution(plan *engine.BatchPlan, i, j int) ([]float32, error)
}

// verify samples sequence i's logits rows lo..hi-1, the last fed token's and one per
// draft, and appends the tokens it accepts to the result: each draft that equals the
// token sampled before it, then the first sampled token that differs (or the one after
// the last draft); with a DraftSampler a sampled row's drafts go through rejection
// sampling instead (DraftSampler). It returns how many tokens it accepted.
func (r *Runner) verify(plan *engine.BatchPlan, i, lo, hi int, anyLP bool) (int32, error) {
	vocab := r.info.VocabSize
	k := int(plan.NumDrafts[i])
	drafts := plan.Tokens[int(plan.QueryStart[i+1])-k : plan.QueryStart[i+1]]
	row := plan.SamplingOf(i)
	hist := row.History
	qs, _ := r.drafter.(DraftSampler)
	if row.Temperature == 0 || row.TopK == 1 {
		qs = nil // greedy: the compare below is exact and equals plain decoding
	}
	var a int32
	for j := lo; j < hi; j++ {
		buf := j
		if r.allRows {
			buf = int(plan.LogitsIndices[j])
		}
		d := j - lo // drafts fed before this row's position
		if len(hist) > 0 && d > 0 {
			// Penalties see the tokens before the sampled position: the drafts too, one
			// more per row.
			if d == 1 {
				r.hist = append(r.hist[:0], hist...)
			}
			r.hist = append(r.hist, drafts[d-1])
			row.History = r.hist
		}
		pos := int(plan.Positions[plan.LogitsIndices[j]]) + 1
		row.Mask = plan.TokenMaskOf(i, d) // the grammar's state after d drafts
		logits := r.logits[buf*vocab : (buf+1)*vocab]
		if qs != nil && d < k {
			tok, ok, err := r.verifySampled(qs, plan, i, d, drafts[d], logits, row, pos)
			if err != nil {
				return 0, err
			}
			lp, top := r.sampler.Score(logits, tok, row.Logprobs, r.top[:0])
			r.top = top
			a++
			r.appendSampled(tok, lp, top, anyLP)
			if !ok {
				break
			}
			continue
		}
		tok, lp, top := r.sampler.Sample(logits, row, pos, r.top[:0])
		r.top = top
		a++
		r.appendSampled(tok, lp, top, anyLP)
		if d >= k || tok != drafts[d] {
			break
		}
	}
	return a, nil
}

// verifySampled runs rejection sampling on draft d (token draft) of plan's sequence i,
// whose target logits row is logits: it returns the token to emit and whether it is the
// draft.
func (r *Runner) verifySampled(qs DraftSampler, plan *engine.BatchPlan, i, d int, draft int32, logits []float32, row engine.SamplingRow, pos int) (int32, bool, error) {
	q, err := qs.DraftDistribution(plan, i, d)
	if err != nil {
		return 0, false, fmt.Errorf("draft %d of request %d: %w", d, plan.ReqIDs[i], err)
	}
	if len(q) != len(logits) {
		return 0, false, fmt.Errorf("draft %d of request %d: draft distribution over %d tokens, the vocabulary has %d", d, plan.ReqIDs[i], len(q), len(logits))
	}
	if draft < 0 || int(draft) >= len(q) || !(q[draft] > 0) {
		return 0, false, fmt.Errorf("draft %d of request %d: token %d has draft probability 0 (or is outside the vocabulary)", d, plan.ReqIDs[i], draft)
	}
	if err := checkDistribution(q); err != nil {
		return 0, false, fmt.Errorf("draft %d of request %d: %w", d, plan.ReqIDs[i], err)
	}
	r.p = r.sampler.Distribution(logits, row, pos, r.p)
	tok, ok := engine.VerifyDraft(r.p, q, draft, row.Seed, pos)
	return tok, ok, nil
}

// checkDistribution refuses a draft distribution VerifyDraft would misuse without a
// sign: an entry negative, NaN or infinite, or a sum away from 1 (an unnormalized q
// skews the accept test and the residual, and so the output distribution). The bound
// leaves room for a float32 softmax over a large vocabulary.
func checkDistribution(q []float32) error {
	var sum float64
	for t, v := range q {
		if !(v >= 0) || math.IsInf(float64(v), 1) {
			return fmt.Errorf("draft distribution q[%d] = %g", t, v)
		}
		sum += float64(v)
	}
	if math.Abs(sum-1) > 1e-2 {
		return fmt.Errorf("draft distribution sums to %g, not 1", sum)
	}
	return nil
}
