package cpurunner_test

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"testing"

	"github.com/resin-llm/resin/core/cpurunner"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/runnertest"
)

// drafter is the fake model with a draft head: after a step it proposes, for each
// sequence that got tokens, the greedy continuation of its last token, made wrong when
// the draft's position is a multiple of 3 so that some drafts are rejected.
type drafter struct {
	fake
	calls    int
	accepted int // tokens accepted after a draft row, as Draft saw them
	logits   []float32
}

func (d *drafter) MaxDrafts() int { return 1 }

func (d *drafter) Draft(p *engine.BatchPlan, res *engine.StepResult) error {
	d.calls++
	if cap(d.logits) < vocab {
		d.logits = make([]float32, vocab)
	}
	tok := 0
	for i := range p.ReqIDs {
		a := int(res.Accepted[i])
		tok += a
		if a == 0 {
			continue
		}
		if p.NumDrafts[i] > 0 {
			d.accepted += a
		}
		// The last accepted token lands at the position after the row it was sampled
		// from; the draft is the token after it.
		row := p.LogitsIndices[int(p.LogitsStart[i])+a-1]
		last, pos := res.Tokens[tok-1], p.Positions[row]+1
		tokenLogits(d.logits, last, pos)
		draft := argmax(d.logits)
		if (pos+1)%3 == 0 {
			draft = (draft + 1) % vocab
		}
		res.NumNextDrafts[i] = 1
		res.Drafts = append(res.Drafts, draft)
	}
	return nil
}

func argmax(x []float32) int32 {
	best := 0
	for i, v := range x {
		if v > x[best] {
			best = i
		}
	}
	return int32(best)
}

// TestDrafterEqualsPlain runs requests through the engine on the fake model with and
// without its draft head, greedy and sampled (seeded, with penalties that read the
// drafts in their history, with logprobs), capturing every row, and wants the same
// tokens, logprobs and captured rows, with drafts both accepted and rejected.
func TestDrafterEqualsPlain(t *testing.T) {
	sps := []engine.SamplingParams{
		{MaxTokens: 17, IgnoreEOS: true, Logprobs: true, TopLogprobs: 2},
		{MaxTokens: 12, Temperature: 0.8, TopK: 6, Seed: 5, HasSeed: true, IgnoreEOS: true, Logprobs: true},
		{MaxTokens: 15, Temperature: 0.5, Seed: 9, HasSeed: true, IgnoreEOS: true, RepetitionPenalty: 1.3, FrequencyPenalty: 0.4},
		{MaxTokens: 9, IgnoreEOS: true, PresencePenalty: 0.7},
	}
	prompts := [][]int32{{1, 2, 3}, {40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50}, {7}, {9, 9, 9, 9, 9}}
	type out struct {
		toks [][]int32
		lps  [][]engine.TokenLogprob
		rows map[string]int32
	}
	run := func(f cpurunner.Forwarder) (out, engine.Counters) {
		r := cpurunner.New(info(), f)
		o := out{rows: map[string]int32{}}
		var mu sync.Mutex
		r.CaptureLogits(func(row cpurunner.LogitsRow) {
			mu.Lock()
			defer mu.Unlock()
			k := fmt.Sprint(row.ReqID, "@", row.Position)
			if _, dup := o.rows[k]; dup {
				t.Errorf("row %s reported twice", k)
			}
			o.rows[k] = row.Token
		})
		e, stop := startEngine(t, r, engine.Config{MaxBatchTokens: 8})
		defer stop()
		var streams []*engine.Stream
		for i, p := range prompts {
			s, err := e.Submit(context.Background(), engine.Request{Prompt: p, Sampling: sps[i]})
			if err != nil {
				t.Fatal(err)
			}
			streams = append(streams, s)
		}
		for _, s := range streams {
			toks, lps := collect(t, s)
			o.toks, o.lps = append(o.toks, toks), append(o.lps, lps)
		}
		return o, e.Counters()
	}
	plain, _ := run(&fake{})
	d := &drafter{}
	if got := cpurunner.New(info(), d).Info().MaxDrafts; got != 1 {
		t.Fatalf("Info().MaxDrafts = %d for a drafter of 1", got)
	}
	spec, c := run(d)
	if !reflect.DeepEqual(spec.toks, plain.toks) {
		t.Fatalf("tokens with drafts %v, without %v", spec.toks, plain.toks)
	}
	if !reflect.DeepEqual(spec.lps, plain.lps) {
		t.Fatal("logprobs with drafts differ from those without")
	}
	if !reflect.DeepEqual(spec.rows, plain.rows) {
		t.Fatalf("captured rows with drafts (%d) differ from those without (%d)", len(spec.rows), len(plain.rows))
	}
	if c.DraftsProposed == 0 || c.DraftsAccepted == 0 || c.DraftsAccepted == c.DraftsProposed {
		t.Fatalf("proposed %d drafts, accepted %d: want some of each", c.DraftsProposed, c.DraftsAccepted)
	}
	if want := c.DraftsProposed + c.DraftsAccepted; uint64(d.accepted) != want {
		t.Errorf("Draft saw %d tokens accepted after draft rows, the engine counts %d", d.accepted, want)
	}
	t.Logf("%d drafts, %d accepted", c.DraftsProposed, c.DraftsAccepted)
}

// TestPlainInfoHasNoDrafts checks that a Drafter proposing none leaves MaxDrafts 0.
func TestPlainInfoHasNoDrafts(t *testing.T) {
	if got := cpurunner.New(info(), &noDrafts{}).Info().MaxDrafts; got != 0 {
		t.Fatalf("MaxDrafts %d, want 0", got)
	}
}

type noDrafts struct{ drafter }

func (*noDrafts) MaxDrafts() int { return 0 }

// favours5 is a drafting model whose every row prefers token 5, then 6; it proposes no
// next drafts (the test feeds its own).
type favours5 struct{}

func (favours5) Forward(p *engine.BatchPlan, logits []float32) error {
	clear(logits)
	for j := range p.LogitsIndices {
		logits[j*vocab+5], logits[j*vocab+6] = 1, 0.5
	}
	return nil
}

func (favours5) MaxDrafts() int                                    { return 1 }
func (favours5) Draft(*engine.BatchPlan, *engine.StepResult) error { return nil }

// TestDraftJoinsPenaltyHistory: the row after an accepted draft samples with the draft
// in its history. The prompt ends in 5 (presence penalties skip the prompt), so the
// first row accepts the draft 5; the draft is output, so a presence penalty of 2 then
// turns the next row from 5 to 6.
func TestDraftJoinsPenaltyHistory(t *testing.T) {
	pool := newPool(t)
	s := runnertest.OpenSeq(t, pool, []int32{1, 2, 3, 5})
	runnertest.Plan(t, pool, []*runnertest.Seq{s}, []int{3}, false)
	s.Drafts = []int32{5}
	p := runnertest.Plan(t, pool, []*runnertest.Seq{s}, []int{1}, false)
	p.PresencePenalty, p.FrequencyPenalty, p.RepetitionPenalty, p.MinTokens = []float32{2}, []float32{0}, []float32{1}, []int32{0}
	p.HistoryStart, p.History = []int32{0, 4}, []int32{1, 2, 3, 5}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	res, err := cpurunner.New(info(), favours5{}).Execute(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	if res.Accepted[0] != 2 || !slices.Equal(res.Tokens, []int32{5, 6}) {
		t.Fatalf("accepted %d tokens %v, want 2: the draft 5, then 6 (5 penalized)", res.Accepted[0], res.Tokens)
	}
}
