package cpurunner

import "github.com/resin-llm/resin/core/engine"

// Drafter is a Forwarder whose model also proposes draft tokens for speculative decoding
// (an MTP head, a draft model). Runner declares its MaxDrafts to the engine, verifies the
// drafts a plan feeds against the tokens it samples from their logits rows, and then
// hands the outcome to Draft.
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

// verify samples sequence i's logits rows lo..hi-1, the last fed token's and one per
// draft, and appends the tokens it accepts to the result: each draft that equals the
// token sampled before it, then the first sampled token that differs (or the one after
// the last draft). It returns how many tokens it accepted.
func (r *Runner) verify(plan *engine.BatchPlan, i, lo, hi int, anyLP bool) int32 {
	vocab := r.info.VocabSize
	k := int(plan.NumDrafts[i])
	drafts := plan.Tokens[int(plan.QueryStart[i+1])-k : plan.QueryStart[i+1]]
	row := plan.SamplingOf(i)
	hist := row.History
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
		tok, lp, top := r.sampler.Sample(r.logits[buf*vocab:(buf+1)*vocab], row, pos, r.top[:0])
		r.top = top
		a++
		r.appendSampled(tok, lp, top, anyLP)
		if d >= k || tok != drafts[d] {
			break
		}
	}
	return a
}
