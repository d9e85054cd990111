package cpurunner_test

import (
	"context"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/cpurunner"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
)

// smallVocab is the vocabulary of the models below: small enough that the joint
// distribution of three generated tokens can be counted.
const smallVocab = 4

// small is the fake target over smallVocab tokens: smallLogits of the row's token and
// position.
type small struct{}

// smallLogits is tokenLogits halved, so that no token is all but ruled out.
func smallLogits(dst []float32, tok, pos int32) {
	tokenLogits(dst, tok, pos)
	for t := range dst {
		dst[t] /= 2
	}
}

func (small) Forward(p *engine.BatchPlan, logits []float32) error {
	if len(logits) != len(p.LogitsIndices)*smallVocab {
		return fmt.Errorf("logits buffer of %d for %d rows", len(logits), len(p.LogitsIndices))
	}
	for j, k := range p.LogitsIndices {
		smallLogits(logits[j*smallVocab:(j+1)*smallVocab], p.Tokens[k], p.Positions[k])
	}
	return nil
}

func smallInfo() engine.RunnerInfo {
	return engine.RunnerInfo{
		Name: "small", VocabSize: smallVocab, MaxContext: 64,
		CacheGroups: []kvslab.GroupSpec{{Name: "kv", Kind: kvslab.Full, Layers: 1, BytesPerToken: 8, PageTokens: 4}},
	}
}

// draftQ is the fake drafter's distribution for the token after tok at pos: the softmax
// of logits unrelated to the target's (another token's), so that drafts are rejected as
// well as accepted.
func draftQ(dst []float32, tok, pos int32) {
	tokenLogits(dst, tok+11, pos)
	var sum float64
	m := dst[argmax(dst)]
	for t, l := range dst {
		dst[t] = float32(math.Exp(float64(l - m)))
		sum += float64(dst[t])
	}
	for t := range dst {
		dst[t] = float32(float64(dst[t]) / sum)
	}
}

// sampler is a DraftSampler on small: after each step it draws two drafts per sequence
// from draftQ with engine.DraftUniform, and keeps them with their q rows for
// DraftDistribution. With lie set it reports a uniform q instead of the one it drew from:
// the deliberately wrong drafter the statistical test must catch.
type sampler struct {
	small
	lie    bool
	drafts map[uint64]*proposal
	calls  int // DraftDistribution calls
}

type proposal struct {
	drafts []int32
	q      [][]float32
}

func (*sampler) MaxDrafts() int { return 2 }

func (d *sampler) Draft(p *engine.BatchPlan, res *engine.StepResult) error {
	if d.drafts == nil {
		d.drafts = map[uint64]*proposal{}
	}
	tok := 0
	for i, id := range p.ReqIDs {
		a := int(res.Accepted[i])
		tok += a
		if a == 0 {
			continue
		}
		row := p.LogitsIndices[int(p.LogitsStart[i])+a-1]
		last, pos := res.Tokens[tok-1], p.Positions[row]+1 // last lands at pos
		pr := d.drafts[id]
		if pr == nil {
			pr = &proposal{}
			d.drafts[id] = pr
		}
		pr.drafts, pr.q = pr.drafts[:0], pr.q[:0]
		for m := range d.MaxDrafts() {
			q := make([]float32, smallVocab)
			draftQ(q, last, pos+int32(m))
			at := int(pos) + m + 1
			last = inverseCDF(q, engine.DraftUniform(p.Seed[i], at))
			pr.drafts, pr.q = append(pr.drafts, last), append(pr.q, q)
		}
		res.NumNextDrafts[i] = int32(len(pr.drafts))
		res.Drafts = append(res.Drafts, pr.drafts...)
	}
	return nil
}

func (d *sampler) DraftDistribution(p *engine.BatchPlan, i, j int) ([]float32, error) {
	d.calls++
	pr := d.drafts[p.ReqIDs[i]]
	fed := p.Tokens[int(p.QueryStart[i+1])-int(p.NumDrafts[i]) : p.QueryStart[i+1]]
	if pr == nil || j >= len(pr.drafts) || !slices.Equal(fed[:j+1], pr.drafts[:j+1]) {
		return nil, fmt.Errorf("drafts %v fed, not the ones proposed", fed)
	}
	if d.lie {
		return []float32{0.25, 0.25, 0.25, 0.25}, nil
	}
	return pr.q[j], nil
}

var _ cpurunner.DraftSampler = (*sampler)(nil)

func inverseCDF(p []float32, u float64) int32 {
	var acc float64
	for t, pt := range p {
		acc += float64(pt)
		if u < acc {
			return int32(t)
		}
	}
	return int32(len(p) - 1)
}

// parity is a Constraint over smallVocab tokens that allows, after n generated tokens,
// the tokens t with t+n even: two of the four, a different two at each position.
type parity struct{ n int }

func allowed(n int) uint32 {
	var m uint32
	for t := range smallVocab {
		if (t+n)%2 == 0 {
			m |= 1 << t
		}
	}
	return m
}

func (*parity) Words() int { return 1 }
func (c *parity) FillMask(mask []uint32) error {
	mask[0] = allowed(c.n)
	return nil
}
func (c *parity) Accept(tok int32) error {
	if allowed(c.n)&(1<<tok) == 0 {
		return fmt.Errorf("token %d not allowed after %d tokens", tok, c.n)
	}
	c.n++
	return nil
}
func (c *parity) Rollback(n int) error { c.n -= n; return nil }
func (*parity) Ended() bool            { return false }

// runSmall submits one request per sampling params (prompt {1, 2}) to an engine on r, a
// wave of at most 256 at a time, and returns their tokens.
func runSmall(t *testing.T, r engine.Runner, sps []engine.SamplingParams) ([][]int32, engine.Counters) {
	t.Helper()
	e, stop := startEngine(t, r, engine.Config{MaxBatchTokens: 1024, MaxSeqs: 256})
	defer stop()
	out := make([][]int32, 0, len(sps))
	for lo := 0; lo < len(sps); lo += 256 {
		var streams []*engine.Stream
		for _, sp := range sps[lo:min(lo+256, len(sps))] {
			s, err := e.Submit(context.Background(), engine.Request{Prompt: []int32{1, 2}, Sampling: sp})
			if err != nil {
				t.Fatal(err)
			}
			streams = append(streams, s)
		}
		for _, s := range streams {
			toks, _ := collect(t, s)
			out = append(out, toks)
		}
	}
	return out, e.Counters()
}

// jointChiSquare counts the first three tokens of outs against their exact joint
// distribution under the target small with row's sampling (and, when constrained, the
// parity masks), and returns Pearson's statistic and its failure threshold: the value a
// correct sampler exceeds with probability about 1e-6 (Wilson-Hilferty's approximation
// of the chi-square quantile, for the cells' degrees of freedom).
func jointChiSquare(t *testing.T, outs [][]int32, row engine.SamplingRow, constrained bool) (x, bound float64) {
	var s engine.Sampler
	logits := make([]float32, smallVocab)
	dist := func(tok, pos int32, n int) []float32 {
		smallLogits(logits, tok, pos)
		r := row
		if constrained {
			r.Mask = []uint32{allowed(n)}
		}
		return slices.Clone(s.Distribution(logits, r, int(pos)+1, nil))
	}
	counts := map[[3]int32]int{}
	for _, o := range outs {
		if len(o) < 3 {
			t.Fatalf("%d tokens %v, want at least 3", len(o), o)
		}
		counts[[3]int32(o[:3])]++
	}
	n := float64(len(outs))
	// Cells expecting fewer than 5 draws are pooled into one (the statistic's
	// approximation needs it).
	var poolE, poolGot float64
	cells := 0
	p1 := dist(2, 1, 0)
	for a := range int32(smallVocab) {
		p2 := dist(a, 2, 1)
		for b := range int32(smallVocab) {
			p3 := dist(b, 3, 2)
			for c := range int32(smallVocab) {
				e := float64(p1[a]) * float64(p2[b]) * float64(p3[c]) * n
				got := float64(counts[[3]int32{a, b, c}])
				if e == 0 {
					if got != 0 {
						t.Errorf("tokens %d %d %d generated %v times, the target gives them probability 0", a, b, c, got)
					}
					continue
				}
				if e < 5 {
					poolE, poolGot = poolE+e, poolGot+got
					continue
				}
				x += (got - e) * (got - e) / e
				cells++
			}
		}
	}
	if poolE > 0 {
		x += (poolGot - poolE) * (poolGot - poolE) / poolE
		cells++
	}
	df := float64(cells - 1)
	const z = 4.75 // the normal quantile of 1 - 1e-6
	h := 2 / (9 * df)
	return x, df * math.Pow(1-h+z*math.Sqrt(h), 3)
}

// TestSampledDraftsKeepDistribution runs 20,000 seeded requests of four tokens through
// the engine on small with the sampling drafter (two drafts after the first token) and
// wants the joint distribution of the first three tokens to be the target's (chi-square below jointBound) at temperature 1, with
// top-k and temperature 0.7, and under the parity grammar (whose masks rule out half the
// tokens at every position, the drafts' included); drafts are both accepted and rejected.
// The same requests with a drafter that reports a wrong q fail the bound. The seeds are
// fixed, so a test that passes keeps passing.
func TestSampledDraftsKeepDistribution(t *testing.T) {
	const n = 20_000
	cases := []struct {
		name        string
		row         engine.SamplingRow
		constrained bool
	}{
		{"T=1", engine.SamplingRow{Temperature: 1}, false},
		{"T=0.7 top-k 3", engine.SamplingRow{Temperature: 0.7, TopK: 3}, false},
		{"T=1 grammar", engine.SamplingRow{Temperature: 1}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sps := make([]engine.SamplingParams, n)
			for k := range sps {
				sps[k] = engine.SamplingParams{MaxTokens: 4, Temperature: tc.row.Temperature, TopK: tc.row.TopK, Seed: uint64(k)*7919 + 1, HasSeed: true}
				if tc.constrained {
					sps[k].Constraint = &parity{}
				}
			}
			d := &sampler{}
			outs, c := runSmall(t, cpurunner.New(smallInfo(), d), sps)
			x, bound := jointChiSquare(t, outs, tc.row, tc.constrained)
			t.Logf("chi-square %.1f (bound %.1f); %d drafts, %d accepted", x, bound, c.DraftsProposed, c.DraftsAccepted)
			if !(x < bound) {
				t.Errorf("chi-square %.1f over %d requests, want below %.1f", x, n, bound)
			}
			if c.DraftsAccepted == 0 || c.DraftsAccepted == c.DraftsProposed || d.calls == 0 {
				t.Errorf("%d drafts, %d accepted, %d q rows asked: want some accepted and some rejected", c.DraftsProposed, c.DraftsAccepted, d.calls)
			}
			if tc.constrained {
				for k, o := range outs {
					for j, tok := range o {
						if allowed(j)&(1<<tok) == 0 {
							t.Fatalf("request %d: token %d (%d) outside the grammar's mask", k, j, tok)
						}
					}
				}
			}
			for k := range sps {
				if tc.constrained {
					sps[k].Constraint = &parity{}
				}
			}
			liar, _ := runSmall(t, cpurunner.New(smallInfo(), &sampler{lie: true}), sps)
			if x, bound := jointChiSquare(t, liar, tc.row, tc.constrained); x < bound {
				t.Errorf("a drafter reporting a wrong q gives chi-square %.1f, below the bound %.1f that should catch it", x, bound)
			} else {
				t.Logf("lying drafter: chi-square %.1f", x)
			}
		})
	}
}

// TestSampledDraftsGreedyAndBatch: greedy requests with the sampling drafter give plain
// greedy decoding's tokens (with penalties too), and every request, sampled or greedy,
// gives the same tokens alone as in a batch with the others.
func TestSampledDraftsGreedyAndBatch(t *testing.T) {
	sps := []engine.SamplingParams{
		{MaxTokens: 9},
		{MaxTokens: 7, PresencePenalty: 0.6, FrequencyPenalty: 0.3},
		{MaxTokens: 8, Temperature: 0.9, Seed: 3, HasSeed: true},
		{MaxTokens: 11, Temperature: 1.2, TopP: 0.9, Seed: 8, HasSeed: true, RepetitionPenalty: 1.2},
		{MaxTokens: 6, Temperature: 0.8, MinP: 0.1, Seed: 4, HasSeed: true, Constraint: &parity{}},
		{MaxTokens: 10, TopK: 1, Temperature: 1, Seed: 2, HasSeed: true},
	}
	fresh := func(sp engine.SamplingParams) engine.SamplingParams {
		if sp.Constraint != nil {
			sp.Constraint = &parity{}
		}
		return sp
	}
	batch, c := runSmall(t, cpurunner.New(smallInfo(), &sampler{}), sps)
	if c.DraftsAccepted == 0 || c.DraftsAccepted == c.DraftsProposed {
		t.Fatalf("%d drafts, %d accepted: want some of each", c.DraftsProposed, c.DraftsAccepted)
	}
	for k, sp := range sps {
		alone, _ := runSmall(t, cpurunner.New(smallInfo(), &sampler{}), []engine.SamplingParams{fresh(sp)})
		if !reflect.DeepEqual(alone[0], batch[k]) {
			t.Errorf("request %d: tokens %v alone, %v in a batch", k, alone[0], batch[k])
		}
		if sp.Temperature == 0 || sp.TopK == 1 {
			plain, _ := runSmall(t, cpurunner.New(smallInfo(), small{}), []engine.SamplingParams{fresh(sp)})
			if !reflect.DeepEqual(plain[0], batch[k]) {
				t.Errorf("greedy request %d: tokens %v with sampled drafts, %v without", k, batch[k], plain[0])
			}
		}
	}
}

// badQ is a sampling drafter whose q rows are wrong in shape or give a draft no weight.
type badQ struct {
	sampler
	q []float32
}

func (b *badQ) DraftDistribution(*engine.BatchPlan, int, int) ([]float32, error) { return b.q, nil }

// TestSampledDraftsBadQ: a q of the wrong length, one giving the draft probability 0, or
// one that does not sum to 1 fails the step with an error that says so.
func TestSampledDraftsBadQ(t *testing.T) {
	for _, tc := range []struct {
		q    []float32
		want string
	}{
		{[]float32{0.5, 0.5}, "over 2 tokens"},
		{[]float32{0, 0, 0, 0}, "draft probability 0"},
		{[]float32{0.5, 0.5, 0.5, 0.5}, "sums to 2, not 1"},
		{[]float32{0.3, 0.3, 0.3, 0.3}, "sums to 1.2"},
	} {
		r := cpurunner.New(smallInfo(), &badQ{q: tc.q})
		e, stop := startEngine(t, r, engine.Config{})
		s, err := e.Submit(context.Background(), engine.Request{Prompt: []int32{1, 2}, Sampling: engine.SamplingParams{MaxTokens: 4, Temperature: 1}})
		if err != nil {
			t.Fatal(err)
		}
		_, ev, err := s.Collect(context.Background())
		stop()
		if err != nil {
			t.Fatal(err)
		}
		if ev.Finish != engine.FinishError || ev.Err == nil || !strings.Contains(ev.Err.Error(), tc.want) {
			t.Errorf("q %v: terminal event %+v, want an error saying %q", tc.q, ev, tc.want)
		}
	}
}
