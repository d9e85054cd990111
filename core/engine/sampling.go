package engine

import (
	"math"
	"slices"

	"github.com/resin-llm/resin/core/kernels/ref"
)

// SamplingRow is one sequence's sampling parameters as a runner sees them in a BatchPlan.
type SamplingRow struct {
	Temperature float32
	TopP        float32
	TopK        int
	MinP        float32
	Seed        uint64
	// Logprobs is -1 for none, else the number of top alternatives wanted.
	Logprobs int

	// Penalties: 0, 0 and 1 (or 0) are off. See BatchPlan for the semantics.
	PresencePenalty   float32
	FrequencyPenalty  float32
	RepetitionPenalty float32
	// PromptLen splits History into prompt and output; MinTokens masks StopIDs while the
	// sampled position is below PromptLen+MinTokens.
	PromptLen int
	MinTokens int
	StopIDs   []int32
	// BiasTokens and BiasValues are the logit bias, in parallel.
	BiasTokens []int32
	BiasValues []float32
	// History is the sequence's tokens before the sampled position (prompt, then
	// output); it is needed only with a penalty. Ids outside the vocabulary (such as
	// PendingToken) are skipped.
	History []int32
	// Mask, when not nil, is the grammar's bitmask of allowed tokens (bit t%32 of word
	// t/32 for token t; ids past the mask are not allowed): the others are never
	// sampled. See BatchPlan.TokenMask.
	Mask []uint32
}

// adjusts reports whether the row changes the logits before sampling.
func (row *SamplingRow) adjusts(pos int) bool {
	return len(row.BiasTokens) > 0 || len(row.History) > 0 && row.penalized() ||
		len(row.StopIDs) > 0 && pos < row.PromptLen+row.MinTokens
}

func (row *SamplingRow) penalized() bool {
	return penalizes(row.PresencePenalty, row.FrequencyPenalty, row.RepetitionPenalty)
}

// penalizes reports whether penalties of these values change logits (the repetition
// penalty is off at 0 and 1), so that the token history is needed.
func penalizes(presence, frequency, repetition float32) bool {
	return presence != 0 || frequency != 0 || repetition != 0 && repetition != 1
}

// Sampler chooses tokens from logits for CPU runners: greedy, temperature, top-k, top-p,
// min-p, seeded per request. Its random draw depends only on (seed, position), so a seed
// reproduces the same tokens whatever the batch, chunking or preemption. A Sampler keeps
// scratch buffers and is not safe for concurrent use; one per runner goroutine.
type Sampler struct {
	idx   []int32
	probs []float32
	w     []float32 // nucleus's weights of the whole vocabulary
	exps  []float32 // logSumExp's exponentials
	adj   []float32 // the logits after bias, min-tokens mask and penalties
	count []int32   // per token: output count, plus inPrompt for a prompt token
}

// inPrompt marks a prompt token in Sampler.count.
const inPrompt = 1 << 30

// Sample picks the token for logits (one row, length = vocabulary) of a sequence whose
// sampled token lands at position pos. When the row asks for logprobs (row.Logprobs >= 0)
// it returns the token's log probability under the model's distribution (log-softmax of
// the raw logits, before biases and penalties), and when row.Logprobs > 0 appends the most
// likely alternatives to top, which is returned; a row that asks for none gets 0 for the
// logprob, and its normalizer, a pass of exp over the whole vocabulary, is not computed
// (a greedy row then costs one argmax). logits is not modified: a row with a bias, a
// penalty or an active min-tokens gate is adjusted in a copy; one without costs nothing
// more.
func (s *Sampler) Sample(logits []float32, row SamplingRow, pos int, top []TopLogprob) (int32, float32, []TopLogprob) {
	choose := logits
	if row.adjusts(pos) {
		choose = s.adjust(logits, &row, pos)
	}
	if row.Mask != nil {
		choose = s.applyMask(logits, choose, &row)
	}
	tok := s.choose(choose, row, pos)
	if row.Logprobs < 0 {
		return tok, 0, top
	}
	lse := s.logSumExp(logits)
	if row.Logprobs > 0 {
		top = s.topLogprobs(logits, lse, row.Logprobs, top)
	}
	return tok, logits[tok] - lse, top
}

// applyMask sets the logits of the tokens row.Mask does not allow to -inf, in the
// adjusted copy (made now if choose is logits itself). When the min-tokens gate masked
// every token the grammar allows (the grammar can only end), the grammar wins: the
// allowed tokens keep their logits. When no allowed token has a usable logit even then
// (every one -inf or NaN), the allowed tokens weigh alike: a draw stays within the
// grammar (without it, the -inf of every masked token weighed as the maximum, and a
// draw chose any token of the vocabulary).
func (s *Sampler) applyMask(logits, choose []float32, row *SamplingRow) []float32 {
	if &choose[0] == &logits[0] {
		s.adj = append(s.adj[:0], logits...)
		choose = s.adj
	}
	neg := float32(math.Inf(-1))
	any := false
	for t := range choose {
		w := t >> 5
		if w >= len(row.Mask) || row.Mask[w]&(1<<(t&31)) == 0 {
			choose[t] = neg
		} else if l := choose[t]; l == l && l != neg {
			any = true
		}
	}
	if any {
		return choose
	}
	// The rare rows left: every allowed token's logit is -inf or NaN.
	usable := func(l float32) bool { return l == l && l != neg }
	allowed := func(t int) bool { w := t >> 5; return w < len(row.Mask) && row.Mask[w]&(1<<(t&31)) != 0 }
	for t := range choose {
		if allowed(t) {
			choose[t] = logits[t]
			any = any || usable(logits[t])
		}
	}
	if !any {
		for t := range choose {
			if allowed(t) {
				choose[t] = 0
			}
		}
	}
	return choose
}

// adjust returns a copy of logits with the row's logit bias, min-tokens mask and
// penalties applied, in that order (vLLM v1's).
func (s *Sampler) adjust(logits []float32, row *SamplingRow, pos int) []float32 {
	n := len(logits)
	s.adj = append(s.adj[:0], logits...)
	adj := s.adj
	for k, t := range row.BiasTokens {
		if t >= 0 && int(t) < n {
			adj[t] += row.BiasValues[k]
		}
	}
	if pos < row.PromptLen+row.MinTokens {
		for _, t := range row.StopIDs {
			if t >= 0 && int(t) < n {
				adj[t] = float32(math.Inf(-1))
			}
		}
	}
	if len(row.History) == 0 || !row.penalized() {
		return adj
	}
	if len(s.count) < n {
		s.count = make([]int32, n)
	}
	count := s.count[:n]
	split := min(row.PromptLen, len(row.History))
	for _, t := range row.History[:split] {
		if t >= 0 && int(t) < n {
			count[t] |= inPrompt
		}
	}
	for _, t := range row.History[split:] {
		if t >= 0 && int(t) < n {
			count[t]++
		}
	}
	rep := row.RepetitionPenalty
	if rep == 0 {
		rep = 1
	}
	// Each distinct token once: its entry is cleared as it is applied, which also leaves
	// count all zero for the next call.
	for _, t := range row.History {
		if t < 0 || int(t) >= n || count[t] == 0 {
			continue
		}
		c := count[t] &^ inPrompt
		count[t] = 0
		l := adj[t]
		if rep != 1 {
			if l > 0 {
				l /= rep
			} else {
				l *= rep
			}
		}
		if c > 0 {
			l -= row.FrequencyPenalty*float32(c) + row.PresencePenalty
		}
		adj[t] = l
	}
	return adj
}

func (s *Sampler) choose(logits []float32, row SamplingRow, pos int) int32 {
	if row.Temperature == 0 || row.TopK == 1 {
		return argmax(logits)
	}
	sum := s.candidates(logits, row)
	u := uniform(row.Seed, pos) * sum
	var acc float64
	last := int32(-1)
	for k, p := range s.probs {
		if p == 0 {
			continue
		}
		acc += float64(p)
		last = s.idx[k]
		if u < acc {
			return last
		}
	}
	if last < 0 {
		// Every candidate weighs nothing (a row of NaN): the argmax, as greedy and
		// Distribution take, instead of an index outside the row.
		return argmax(logits)
	}
	return last
}

// candidates fills s.idx and s.probs with the tokens a sampled (not greedy) row may draw
// and their unnormalized weights, after temperature, top-k, min-p and top-p, and returns
// the weights' sum.
//
// The candidates of a top-k or top-p row are in sampling order: logits descending (NaN
// last), ties by id. A top-k row with k well below the vocabulary has its k selected
// with a heap rather than the whole vocabulary sorted (the same tokens in the same order,
// for a fraction of the cost: a sort of 32000 logits took most of a sampled step).
func (s *Sampler) candidates(logits []float32, row SamplingRow) float64 {
	n := len(logits)
	topP := row.TopP > 0 && row.TopP < 1
	switch {
	case row.TopK > 0 && row.TopK <= n/8:
		s.selectTop(logits, row.TopK)
	case topP && (row.TopK <= 0 || row.TopK >= n):
		if sum, ok := s.nucleus(logits, row); ok {
			return sum
		}
		fallthrough // the rare row the shortcut does not settle: the whole vocabulary sorted
	case row.TopK > 0 || topP:
		s.idx = s.idx[:0]
		for i := 0; i < n; i++ {
			s.idx = append(s.idx, int32(i))
		}
		sortCandidates(s.idx, logits)
		if row.TopK > 0 && row.TopK < n {
			s.idx = s.idx[:row.TopK]
		}
	default:
		s.idx = s.idx[:0]
		for i := 0; i < n; i++ {
			s.idx = append(s.idx, int32(i))
		}
	}
	return s.weigh(logits, row)
}

// nucleus is candidates for a top-p row without top-k, sorting only the tokens that can
// be in the nucleus instead of the whole vocabulary: every token's weight (temperature,
// min-p) in vocabulary order, then the tokens from the best down to the lowest logit
// weighing at least (1−TopP)·sum/(2n) sorted. The tokens below that bound hold less than
// half of the 1−TopP the cut leaves out, so the cut falls among those sorted, which come
// first in sampling order: the nucleus, its order and its sum are those of the whole
// sort. The one difference is the sum the cut compares with, added here in
// vocabulary order rather than in sampling order, which can move the cut only when it
// lands within float64 rounding of a boundary. It reports false, leaving the row to the
// whole sort, when the weights sum to nothing usable or the bound did not hold.
func (s *Sampler) nucleus(logits []float32, row SamplingRow) (float64, bool) {
	n := len(logits)
	s.idx = s.idx[:0]
	for i := 0; i < n; i++ {
		s.idx = append(s.idx, int32(i))
	}
	plain := row
	plain.TopP = 0
	sum := s.weigh(logits, plain) // s.probs[i] is token i's weight
	if !(sum > 0) || math.IsInf(sum, 1) {
		return 0, false
	}
	s.w, s.probs = s.probs, s.w[:0]
	w := s.w
	// The tokens at or above the lowest logit that weighs at least thr: a prefix of
	// sampling order even where float32 weights are not monotone to the last ulp.
	thr := (1 - float64(row.TopP)) * sum / float64(2*n)
	low := float32(math.Inf(1))
	for i, p := range w {
		if p > 0 && float64(p) >= thr {
			low = min(low, logits[i])
		}
	}
	s.idx = s.idx[:0]
	for i, l := range logits {
		if l >= low {
			s.idx = append(s.idx, int32(i))
		}
	}
	sortCandidates(s.idx, logits)
	target := float64(row.TopP) * sum
	var acc float64
	for k, i := range s.idx {
		acc += float64(w[i])
		if acc < target {
			continue
		}
		s.idx = s.idx[:k+1]
		sum = 0
		for _, i := range s.idx {
			s.probs = append(s.probs, w[i])
			sum += float64(w[i])
		}
		return sum, true
	}
	return 0, false
}

// ranks reports whether token a comes before token b in sampling order: a higher logit,
// NaN below everything, ties by lower id.
func ranks(logits []float32, a, b int32) bool {
	return better(logits[a], logits[b]) || !better(logits[b], logits[a]) && a < b
}

// sortCandidates sorts idx in sampling order.
func sortCandidates(idx []int32, logits []float32) {
	slices.SortFunc(idx, func(a, b int32) int {
		switch {
		case better(logits[a], logits[b]):
			return -1
		case better(logits[b], logits[a]):
			return 1
		}
		return int(a - b)
	})
}

// selectTop sets s.idx to the k tokens first in sampling order, in that order: a heap of
// the k best so far, its root the last of them, then a sort of the k. Sampling order is a
// strict total order, so these are exactly the first k of the whole vocabulary sorted.
func (s *Sampler) selectTop(logits []float32, k int) {
	h := s.idx[:0]
	for i := range int32(k) {
		h = append(h, i)
		// Sift up: the root is the one ranked last.
		for c := len(h) - 1; c > 0; {
			p := (c - 1) / 2
			if !ranks(logits, h[p], h[c]) {
				break
			}
			h[p], h[c] = h[c], h[p]
			c = p
		}
	}
	for i := int32(k); int(i) < len(logits); i++ {
		if !ranks(logits, i, h[0]) {
			continue
		}
		h[0] = i
		for p := 0; ; {
			c := 2*p + 1
			if c >= k {
				break
			}
			if c+1 < k && ranks(logits, h[c], h[c+1]) {
				c++
			}
			if !ranks(logits, h[p], h[c]) {
				break
			}
			h[p], h[c] = h[c], h[p]
			p = c
		}
	}
	sortCandidates(h, logits)
	s.idx = h
}

// weigh fills s.probs with the weights of the candidates in s.idx (temperature, then
// min-p, then top-p over them in their order, which cuts s.idx too) and returns their sum.
func (s *Sampler) weigh(logits []float32, row SamplingRow) float64 {
	// Softmax with temperature over the candidates.
	inv := 1 / float64(row.Temperature)
	maxL := math.Inf(-1)
	if len(s.idx) == len(logits) { // every token, in some order
		maxL = float64(ref.Max(logits))
	} else {
		for _, i := range s.idx {
			if l := float64(logits[i]); l > maxL {
				maxL = l
			}
		}
	}
	s.probs = s.probs[:0]
	var sum float64
	if len(s.idx) >= minVectorExp {
		// Many candidates: their weights in float32, 8 at a time (ref.ExpSum), from
		// arguments computed as below. A NaN or an infinity among them (a NaN logit, a
		// +Inf one, a temperature so small that 1/T is +Inf) makes the sum NaN or
		// infinite, and the row is weighed again one candidate at a time, as the few are.
		for _, i := range s.idx {
			s.probs = append(s.probs, float32((float64(logits[i])-maxL)*inv))
		}
		if sum = ref.ExpSum(s.probs); sum <= math.MaxFloat64 {
			return s.cut(row, sum)
		}
		s.probs, sum = s.probs[:0], 0
	}
	for _, i := range s.idx {
		// The best candidate weighs 1, also when it is +inf (inf - inf is NaN); a NaN
		// logit weighs nothing (sampling.cu does the same).
		l, p := float64(logits[i]), 0.0
		switch {
		case l == maxL:
			p = 1
		case l == l:
			p = math.Exp((l - maxL) * inv)
		}
		s.probs = append(s.probs, float32(p))
		sum += p
	}
	return s.cut(row, sum)
}

// minVectorExp is the fewest candidates weigh computes the weights of with ref.ExpSum
// (float32, 8 at a time, several times faster than math.Exp's float64): a top-k row's
// few keep the float64 form.
const minVectorExp = 64

// cut applies min-p and top-p to the weighed candidates (s.idx, s.probs, summing to sum),
// in that order, and returns the sum of those left.
func (s *Sampler) cut(row SamplingRow, sum float64) float64 {
	// Min-p: drop candidates below MinP times the best one's probability.
	if row.MinP > 0 {
		var best float32
		for _, p := range s.probs {
			best = max(best, p)
		}
		cut := row.MinP * best
		sum = 0
		for k, p := range s.probs {
			if p < cut {
				s.probs[k] = 0
			}
			sum += float64(s.probs[k])
		}
	}
	// Top-p over the (sorted) candidates.
	if row.TopP > 0 && row.TopP < 1 {
		var acc float64
		keep := len(s.probs)
		for k, p := range s.probs {
			acc += float64(p)
			if acc >= float64(row.TopP)*sum {
				keep = k + 1
				break
			}
		}
		s.idx, s.probs = s.idx[:keep], s.probs[:keep]
		sum = 0
		for _, p := range s.probs {
			sum += float64(p)
		}
	}
	return sum
}

// uniform returns a number in [0, 1) that depends only on (seed, pos).
func uniform(seed uint64, pos int) float64 {
	x := mix64(seed ^ mix64(uint64(pos)))
	return float64(x>>11) / (1 << 53)
}

// Score returns the log probability of tok under logits (log-softmax, as a runner scores
// a prompt row) and appends the k most likely alternatives to top.
func (s *Sampler) Score(logits []float32, tok int32, k int, top []TopLogprob) (float32, []TopLogprob) {
	lse := s.logSumExp(logits)
	if k > 0 {
		top = s.topLogprobs(logits, lse, k, top)
	}
	return logits[tok] - lse, top
}

func (s *Sampler) topLogprobs(logits []float32, lse float32, n int, top []TopLogprob) []TopLogprob {
	n = min(n, len(logits))
	start := len(top)
	for i, l := range logits {
		c := TopLogprob{Token: int32(i), Logprob: l - lse}
		k := len(top)
		if k-start < n {
			top = append(top, c)
		} else if !better(c.Logprob, top[k-1].Logprob) {
			continue
		} else {
			k--
			top[k] = c
		}
		// Insertion into the descending run top[start:] (NaN last, ties by id).
		for ; k > start && better(top[k].Logprob, top[k-1].Logprob); k-- {
			top[k], top[k-1] = top[k-1], top[k]
		}
	}
	return top
}

// better orders logits for sampling and alternatives: a above b, NaN below everything.
func better(a, b float32) bool {
	return a > b || (b != b && a == a)
}

// argmax returns the first maximal element's index, NaN skipped; 0 for a row of NaN (as
// sampling.cu).
//
// The maximum comes from ref.Max (8 at a time), then the first index holding it: a greedy
// token is this one pass and a half over the vocabulary.
func argmax(x []float32) int32 {
	m := ref.Max(x)
	for i, v := range x {
		if v == m {
			return int32(i)
		}
	}
	return 0
}

// logSumExp returns log Σ e^x, the log-softmax's normalizer: max(x) + log Σ e^(x−max),
// the exponentials in float32 (ref.ExpSum, 8 at a time; within 2 ulp of float64's) and
// their sum in float64, in the sampler's scratch.
func (s *Sampler) logSumExp(x []float32) float32 {
	m := x[argmax(x)]
	e := s.exps[:0]
	for _, v := range x {
		e = append(e, v-m)
	}
	s.exps = e
	return m + float32(math.Log(ref.ExpSum(e)))
}
