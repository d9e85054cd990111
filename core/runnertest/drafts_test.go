package runnertest

import (
	"context"
	"testing"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/engine/enginetest"
	"github.com/resin-llm/resin/core/kvslab"
)

// draftConfig is the engine's test runner with two drafts per step, wrong at every third
// position.
func draftConfig() enginetest.Config {
	return enginetest.Config{VocabSize: 300, MaxContext: 256, BlockTokens: 4, Pages: 256, Window: 6,
		MaxDrafts: 2, WrongDraft: func(pos, j int) bool { return (pos+j)%3 == 0 }}
}

// TestDraftsCheck runs the suite on a drafting runner, with the same runner without
// drafts as Plain.
func TestDraftsCheck(t *testing.T) {
	plain := draftConfig()
	plain.MaxDrafts, plain.WrongDraft = 0, nil
	Run(t, openTest(draftConfig()), Options{MaxTokens: 9, Plain: openTest(plain)})
}

// blind accepts every draft whatever the model says.
type blind struct{ *enginetest.Runner }

func (b blind) Execute(ctx context.Context, p *engine.BatchPlan) (engine.StepResult, error) {
	res, err := b.Runner.Execute(ctx, p)
	if err != nil {
		return res, err
	}
	out := engine.StepResult{NumNextDrafts: res.NumNextDrafts, Drafts: res.Drafts, Logprobs: res.Logprobs[:0]}
	tok := 0
	for i := range p.ReqIDs {
		a := int(res.Accepted[i])
		k := int(p.NumDrafts[i])
		got := res.Tokens[tok : tok+a]
		tok += a
		if a == 0 {
			out.Accepted = append(out.Accepted, 0)
			continue
		}
		// The drafts as fed, then the runner's last token.
		toks, _ := p.Seq(i)
		acc := append(append([]int32(nil), toks[len(toks)-k:]...), got[len(got)-1])
		out.Accepted = append(out.Accepted, int32(len(acc)))
		out.Tokens = append(out.Tokens, acc...)
		for range acc {
			out.Logprobs = append(out.Logprobs, 0)
		}
	}
	return out, nil
}

// TestDraftsCheckFails checks that the Drafts check catches a runner that accepts wrong
// drafts.
func TestDraftsCheckFails(t *testing.T) {
	plain := draftConfig()
	plain.MaxDrafts, plain.WrongDraft = 0, nil
	s := New(t, openTest(draftConfig()), Options{MaxTokens: 9, TopLogprobs: -1, Plain: openTest(plain)})
	s.Open = func(t testing.TB) (engine.Runner, *kvslab.Pool) {
		r, err := enginetest.New(draftConfig())
		if err != nil {
			t.Fatal(err)
		}
		return blind{r}, r.Pool()
	}
	rec := &recorder{TB: t}
	done := make(chan struct{})
	go func() { defer close(done); checkDrafts(rec, s) }()
	<-done
	if !rec.Failed() {
		t.Fatal("the Drafts check passed a runner that accepts every draft")
	}
	t.Log(rec.msgs[0])
}
