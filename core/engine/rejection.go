package engine

import "math"

// The streams of random draws per (seed, position). Stream 0 is the plain sampler's
// (uniform), so a bonus token after accepted drafts is drawn as without drafts; the
// others are independent of it and of each other.
const (
	streamAccept   = 1 // the accept test of a sampled draft (VerifyDraft)
	streamResidual = 2 // the draw from the residual after a rejection (VerifyDraft)
	streamDraft    = 3 // a drafter's own draw of its draft (DraftUniform)
)

// uniformStream returns a number in [0, 1) that depends only on (seed, pos, stream);
// stream 0 is uniform(seed, pos).
func uniformStream(seed uint64, pos int, stream uint64) float64 {
	x := mix64(seed ^ mix64(uint64(pos)))
	if stream != 0 {
		x = mix64(x ^ stream*0x9E3779B97F4A7C15)
	}
	return float64(x>>11) / (1 << 53)
}

// DraftUniform returns the number in [0, 1) a drafter that samples its drafts (DSpark)
// should draw the draft for position pos of a request seeded seed with: it depends only
// on (seed, pos), never on the batch, and it is independent of the draws the sampler and
// VerifyDraft make at any position, which exact verification needs. A position drafted
// again after a rejection may reuse it: a discarded draft never reaches the output.
func DraftUniform(seed uint64, pos int) float64 {
	return uniformStream(seed, pos, streamDraft)
}

// Distribution writes into dst (resized to len(logits)) the probabilities Sample draws
// the token at position pos from: the row's logit bias, min-tokens gate, penalties and
// grammar mask, then temperature, top-k, min-p and top-p, normalized. A greedy row
// (temperature 0 or top-k 1) gives its argmax probability 1. This is the target
// distribution p that VerifyDraft checks a sampled draft against.
func (s *Sampler) Distribution(logits []float32, row SamplingRow, pos int, dst []float32) []float32 {
	choose := logits
	if row.adjusts(pos) {
		choose = s.adjust(logits, &row, pos)
	}
	if row.Mask != nil {
		choose = s.applyMask(logits, choose, &row)
	}
	n := len(logits)
	if cap(dst) < n {
		dst = make([]float32, n)
	}
	dst = dst[:n]
	clear(dst)
	if row.Temperature == 0 || row.TopK == 1 {
		dst[argmax(choose)] = 1
		return dst
	}
	sum := s.candidates(choose, row)
	if !(sum > 0) || math.IsInf(sum, 1) {
		// Every candidate weighs nothing (a row of NaN): no distribution to speak
		// of; choose takes the argmax as greedy does, and so does this.
		dst[argmax(choose)] = 1
		return dst
	}
	for k, p := range s.probs {
		dst[s.idx[k]] = float32(float64(p) / sum)
	}
	return dst
}

// VerifyDraft is speculative sampling's step at one position (Leviathan et al., Chen et
// al.): p is the target's distribution there (Distribution), draft the token a drafter
// sampled from its distribution q, both over the vocabulary. It accepts the draft when
// u < min(1, p[draft]/q[draft]) and returns it; otherwise it returns a token drawn from
// normalize(max(0, p − q)). u and the residual's draw depend only on (seed, pos), on
// streams of their own. Accepted or not, the returned token is distributed as p when the
// draft is distributed as q; the caller emits it and, if the draft was accepted and
// another draft follows, verifies that one at pos+1, else samples the bonus token from
// p at pos+1 as without drafts. p and q must be as long (the vocabulary) and draft index
// them, which VerifyDraft does not check (cpurunner's verification does); q[draft] must
// be positive, and a draft q gives no weight is rejected.
func VerifyDraft(p, q []float32, draft int32, seed uint64, pos int) (tok int32, accepted bool) {
	pd, qd := float64(p[draft]), float64(q[draft])
	if qd > 0 && uniformStream(seed, pos, streamAccept)*qd < pd {
		return draft, true
	}
	var sum float64
	for t, pt := range p {
		if r := float64(pt) - float64(q[t]); r > 0 {
			sum += r
		}
	}
	if !(sum > 0) {
		// p ≤ q everywhere and p[draft] < q[draft]: only rounding gets here (both sum
		// to 1); draw from p itself.
		return drawFrom(p, nil, uniformStream(seed, pos, streamResidual)), false
	}
	return drawFrom(p, q, uniformStream(seed, pos, streamResidual)*sum), false
}

// drawFrom returns the token where the running sum of max(0, p − q) (p alone for a nil
// q) first passes u, or the last token of positive weight.
func drawFrom(p, q []float32, u float64) int32 {
	var acc float64
	last := int32(-1)
	for t, pt := range p {
		r := float64(pt)
		if q != nil {
			r -= float64(q[t])
		}
		if !(r > 0) {
			continue
		}
		acc += r
		last = int32(t)
		if u < acc {
			return last
		}
	}
	if last < 0 {
		return argmax(p)
	}
	return last
}
