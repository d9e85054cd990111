package engine_test

import (
	"context"
	"errors"
	"math"
	"slices"
	"testing"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/engine/enginetest"
	"github.com/resin-llm/resin/core/kvslab"
)

// penalized is a seeded sampling configuration with every penalty.
func penalized(seed uint64) (engine.SamplingParams, engine.SamplingRow) {
	sp := engine.SamplingParams{MaxTokens: 40, Temperature: 0.9, Seed: seed, HasSeed: true,
		PresencePenalty: 1.5, FrequencyPenalty: 0.75, RepetitionPenalty: 1.8}
	row := engine.SamplingRow{Temperature: 0.9, Seed: seed, Logprobs: -1,
		PresencePenalty: 1.5, FrequencyPenalty: 0.75, RepetitionPenalty: 1.8}
	return sp, row
}

// TestPenaltiesMatchReference: requests with penalties, batched with plain ones, chunked,
// and under async scheduling (history with tokens in flight), generate exactly what the
// reference sampler does with the same penalties over prompt+output, and not what it
// does without them.
func TestPenaltiesMatchReference(t *testing.T) {
	for _, async := range []bool{false, true} {
		h := start(t, enginetest.Config{Async: async}, engine.Config{Async: async, MaxBatchTokens: 24})
		var streams []*engine.Stream
		var want [][]int32
		changed := 0
		for i := 0; i < 6; i++ {
			p := prompt(60+i, 10+7*i)
			sp, row := penalized(uint64(i))
			if i%2 == 1 {
				sp = engine.SamplingParams{MaxTokens: 40, Temperature: 0.9, Seed: uint64(i), HasSeed: true}
				row = engine.SamplingRow{Temperature: 0.9, Seed: uint64(i), Logprobs: -1}
			}
			st, err := h.e.Submit(context.Background(), engine.Request{Prompt: p, Sampling: sp})
			if err != nil {
				t.Fatal(err)
			}
			streams = append(streams, st)
			ref := enginetest.Reference(256, p, 40, row)
			want = append(want, ref)
			plain := enginetest.Reference(256, p, 40, engine.SamplingRow{Temperature: 0.9, Seed: uint64(i), Logprobs: -1})
			if !slices.Equal(ref, plain) {
				changed++
			}
		}
		for i, st := range streams {
			toks, ev, err := st.Collect(context.Background())
			if err != nil || ev.Finish != engine.FinishLength {
				t.Fatalf("async %v, request %d: %+v %v", async, i, ev, err)
			}
			if !slices.Equal(toks, want[i]) {
				t.Fatalf("async %v, request %d: %v, want %v", async, i, toks, want[i])
			}
		}
		if changed != 3 {
			t.Fatalf("penalties changed %d of 3 penalized generations", changed)
		}
		h.checkWhole()
	}
}

// TestPenalizedTokensRepeatLess: a strong frequency penalty makes greedy decoding of the
// test model use many more distinct tokens than without it.
func TestPenalizedTokensRepeatLess(t *testing.T) {
	h := start(t, enginetest.Config{}, engine.Config{})
	p := prompt(3, 8)
	plain, _ := h.generate(engine.Request{Prompt: p, Sampling: engine.SamplingParams{MaxTokens: 60}})
	pen, _ := h.generate(engine.Request{Prompt: p, Sampling: engine.SamplingParams{MaxTokens: 60, FrequencyPenalty: 2}})
	distinct := func(ts []int32) int { return len(slices.Compact(slices.Sorted(slices.Values(ts)))) }
	if distinct(pen) <= distinct(plain) {
		t.Fatalf("frequency penalty: %d distinct tokens, %d without", distinct(pen), distinct(plain))
	}
	h.checkWhole()
}

func TestLogitBiasForcesAndForbids(t *testing.T) {
	h := start(t, enginetest.Config{}, engine.Config{})
	p := prompt(9, 12)
	toks, _ := h.generate(engine.Request{Prompt: p, Sampling: engine.SamplingParams{MaxTokens: 10, Temperature: 1, LogitBias: map[int32]float32{42: 100}}})
	for _, tok := range toks {
		if tok != 42 {
			t.Fatalf("+100 on token 42: got %v", toks)
		}
	}
	ref := enginetest.Reference(256, p, 10, greedy())
	toks, _ = h.generate(engine.Request{Prompt: p, Sampling: engine.SamplingParams{MaxTokens: 10, LogitBias: map[int32]float32{ref[0]: -100}}})
	if toks[0] == ref[0] || slices.Contains(toks, ref[0]) {
		t.Fatalf("-100 on token %d: got %v", ref[0], toks)
	}
	h.checkWhole()
}

// TestMinTokensSuppressesEOS: with half the vocabulary as EOS a request stops almost at
// once; with min_tokens it generates at least that many tokens, none of them EOS or a
// stop id, and may stop afterwards.
func TestMinTokensSuppressesEOS(t *testing.T) {
	eos := make([]int32, 128)
	for i := range eos {
		eos[i] = int32(2 * i)
	}
	h := start(t, enginetest.Config{EOS: eos}, engine.Config{})
	early := 0
	for i := 0; i < 8; i++ {
		p := prompt(100+i, 9)
		sp := engine.SamplingParams{MaxTokens: 30, Temperature: 1, Seed: uint64(i), HasSeed: true, StopTokenIDs: []int32{1, 3}}
		plain, _ := h.generate(engine.Request{Prompt: p, Sampling: sp})
		sp.MinTokens = 12
		toks, ev := h.generate(engine.Request{Prompt: p, Sampling: sp})
		if len(toks) < 12 {
			t.Fatalf("request %d: %d tokens (%v) with min_tokens 12", i, len(toks), ev.Finish)
		}
		for k, tok := range toks[:12] {
			if tok%2 == 0 || tok == 1 || tok == 3 {
				t.Fatalf("request %d: token %d is %d, an EOS or stop id, before min_tokens", i, k, tok)
			}
		}
		if len(plain) < 12 {
			early++
		}
	}
	if early == 0 {
		t.Fatal("no request stopped before 12 tokens without min_tokens: the test checks nothing")
	}
	h.checkWhole()
}

func TestSamplingFeaturesValidated(t *testing.T) {
	h := start(t, enginetest.Config{VocabSize: 100}, engine.Config{})
	tooMany := map[int32]float32{}
	for i := 0; i <= engine.MaxLogitBias; i++ {
		tooMany[int32(i)] = 1
	}
	for name, sp := range map[string]engine.SamplingParams{
		"presence":       {PresencePenalty: 2.5},
		"frequency":      {FrequencyPenalty: -3},
		"repetition":     {RepetitionPenalty: -1},
		"min_tokens":     {MinTokens: -1},
		"min>max":        {MinTokens: 5, MaxTokens: 4},
		"bias token":     {LogitBias: map[int32]float32{100: 1}},
		"bias value":     {LogitBias: map[int32]float32{1: 101}},
		"bias entries":   {LogitBias: tooMany},
		"bias value nan": {LogitBias: map[int32]float32{1: float32(math.NaN())}},
	} {
		if _, err := h.e.Submit(context.Background(), engine.Request{Prompt: []int32{1, 2}, Sampling: sp}); !errors.Is(err, engine.ErrInvalidRequest) {
			t.Fatalf("%s: got %v, want ErrInvalidRequest", name, err)
		}
	}
	h.checkWhole()
}

// TestPromptLogprobs: a request asking for prompt logprobs gets every prompt token after
// the first scored, once, on the event with its first token: in chunks, after another
// request put the same prompt in the prefix cache (which it must not use), and batched
// with requests that do not ask.
func TestPromptLogprobs(t *testing.T) {
	h := start(t, enginetest.Config{}, engine.Config{MaxBatchTokens: 16})
	p := prompt(77, 50)
	h.generate(engine.Request{Prompt: p, Sampling: engine.SamplingParams{MaxTokens: 3}}) // fills the prefix cache
	var streams []*engine.Stream
	for i := 0; i < 3; i++ {
		sp := engine.SamplingParams{MaxTokens: 5, PromptLogprobs: i != 1, Logprobs: true, TopLogprobs: 2}
		st, err := h.e.Submit(context.Background(), engine.Request{Prompt: p, Sampling: sp})
		if err != nil {
			t.Fatal(err)
		}
		streams = append(streams, st)
	}
	want := enginetest.PromptLogprobs(256, p, 2)
	for i, st := range streams {
		var got []engine.TokenLogprob
		events, first := 0, -1
		for {
			ev, err := st.Recv(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if ev.PromptLogprobs != nil {
				events++
				first = len(ev.Tokens)
				got = ev.PromptLogprobs
			}
			if ev.Finish != engine.FinishNone {
				break
			}
		}
		if i == 1 {
			if events != 0 {
				t.Fatal("prompt logprobs for a request that did not ask")
			}
			continue
		}
		if events != 1 || first == 0 {
			t.Fatalf("request %d: prompt logprobs on %d events (first with %d tokens)", i, events, first)
		}
		if len(got) != len(want) {
			t.Fatalf("request %d: %d prompt logprobs, want %d", i, len(got), len(want))
		}
		for k := range want {
			if got[k].Token != want[k].Token || got[k].Logprob != want[k].Logprob || !slices.Equal(got[k].Top, want[k].Top) {
				t.Fatalf("request %d, position %d: %+v, want %+v", i, k+1, got[k], want[k])
			}
		}
	}
	h.checkWhole()
}

// TestPromptLogprobsAfterPreemption: a request preempted while its prompt is scored
// recomputes it and still reports each position once.
func TestPromptLogprobsAfterPreemption(t *testing.T) {
	d := newDirect(t, enginetest.Config{BlockTokens: 16, Pages: 12}, engine.Config{MaxBatchTokens: 32})
	var outs []*plRecorder
	var prompts [][]int32
	for i := 0; i < 6; i++ {
		p := prompt(200+i, 30)
		prompts = append(prompts, p)
		o := &plRecorder{}
		if err := d.s.Add(engine.Request{ID: string(rune('a' + i)), Prompt: p, Sampling: engine.SamplingParams{MaxTokens: 40, PromptLogprobs: true, Logprobs: true}}, o); err != nil {
			t.Fatal(err)
		}
		outs = append(outs, o)
	}
	d.runAll()
	if d.s.Counters().Preemptions == 0 {
		t.Fatal("no preemption happened; the test does not exercise it")
	}
	for i, o := range outs {
		want := enginetest.PromptLogprobs(256, prompts[i], 0)
		if o.calls != 1 || len(o.lps) != len(want) {
			t.Fatalf("request %d: %d calls, %d prompt logprobs, want 1 and %d", i, o.calls, len(o.lps), len(want))
		}
		for k := range want {
			if o.lps[k].Token != want[k].Token || o.lps[k].Logprob != want[k].Logprob {
				t.Fatalf("request %d, position %d: %+v, want %+v", i, k+1, o.lps[k], want[k])
			}
		}
	}
	d.checkWhole()
}

type plRecorder struct {
	recorder
	lps   []engine.TokenLogprob
	calls int
}

func (o *plRecorder) PromptLogprobs(lps []engine.TokenLogprob) { o.lps, o.calls = lps, o.calls+1 }

// eosRunner samples EOS (token 5) for every row, ignoring the sampling rows: the engine
// itself must not stop a request at EOS before min_tokens.
type eosRunner struct{ res engine.StepResult }

func (m *eosRunner) Info() engine.RunnerInfo {
	return engine.RunnerInfo{Name: "eos", VocabSize: 16, MaxContext: 256, EOS: []int32{5},
		CacheGroups: []kvslab.GroupSpec{{Name: "kv", Kind: kvslab.Full, Layers: 1, BytesPerToken: 4, PageTokens: 16}}}
}

func (m *eosRunner) Execute(_ context.Context, p *engine.BatchPlan) (engine.StepResult, error) {
	m.res.Reset(p.NumSeqs())
	for i := 0; i < p.NumSeqs(); i++ {
		if p.LogitsStart[i+1] > p.LogitsStart[i] {
			m.res.Accepted[i] = 1
			m.res.Tokens = append(m.res.Tokens, 5)
		}
	}
	return m.res, nil
}

func TestMinTokensHoldsTheStopCheck(t *testing.T) {
	e, err := engine.New(&eosRunner{}, engine.Config{CacheBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go e.Run(ctx)
	for minTokens, want := range map[int]int{0: 1, 1: 2, 4: 5} {
		st, err := e.Submit(context.Background(), engine.Request{Prompt: []int32{1, 2}, Sampling: engine.SamplingParams{MaxTokens: 10, MinTokens: minTokens}})
		if err != nil {
			t.Fatal(err)
		}
		toks, ev, err := st.Collect(context.Background())
		if err != nil || ev.Finish != engine.FinishStop || len(toks) != want {
			t.Fatalf("min_tokens %d: %d tokens, %v %v; want %d ending at EOS", minTokens, len(toks), ev.Finish, err, want)
		}
	}
	e.Close()
}

// Prompt logprobs imply logprobs, as the doc says: PromptLogprobs with TopLogprobs > 0 and
// Logprobs unset is accepted, and the generated tokens carry their logprobs with that many
// alternatives too, a one-token prompt (nothing to score) included.
func TestPromptLogprobsImplyLogprobs(t *testing.T) {
	h := start(t, enginetest.Config{}, engine.Config{})
	for _, p := range [][]int32{prompt(5, 12), {9}} {
		st, err := h.e.Submit(context.Background(), engine.Request{Prompt: p, Sampling: engine.SamplingParams{MaxTokens: 3, PromptLogprobs: true, TopLogprobs: 2}})
		if err != nil {
			t.Fatalf("prompt of %d: %v", len(p), err)
		}
		var lps []engine.TokenLogprob
		var prompts int
		for {
			ev, err := st.Recv(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			lps = append(lps, ev.Logprobs...)
			prompts += len(ev.PromptLogprobs)
			if ev.Finish != engine.FinishNone {
				break
			}
		}
		if len(lps) != 3 || prompts != len(p)-1 {
			t.Fatalf("prompt of %d: %d generated logprobs, %d prompt logprobs; want 3 and %d", len(p), len(lps), prompts, len(p)-1)
		}
		for _, lp := range lps {
			if len(lp.Top) != 2 {
				t.Fatalf("prompt of %d: %d alternatives, want 2", len(p), len(lp.Top))
			}
		}
	}
	h.checkWhole()
}
