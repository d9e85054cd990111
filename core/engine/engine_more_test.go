package engine_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/engine/enginetest"
)

func TestRunnerErrorFailsOnlyThatStep(t *testing.T) {
	var failNext atomic.Bool
	h := start(t, enginetest.Config{Fail: func(uint64) bool { return failNext.Swap(false) }}, engine.Config{})
	failNext.Store(true)
	_, ev := h.generate(engine.Request{ID: "doomed", Prompt: prompt(1, 10), Sampling: engine.SamplingParams{MaxTokens: 5}})
	if ev.Finish != engine.FinishError || !errors.Is(ev.Err, engine.ErrRunner) || !errors.Is(ev.Err, enginetest.ErrInjected) {
		t.Fatalf("terminal %+v", ev)
	}
	toks, ev := h.generate(engine.Request{ID: "fine", Prompt: prompt(2, 10), Sampling: engine.SamplingParams{MaxTokens: 5}})
	if ev.Finish != engine.FinishLength || !slices.Equal(toks, enginetest.Reference(256, prompt(2, 10), 5, greedy())) {
		t.Fatalf("request after the failure: %v %+v", toks, ev)
	}
	if c := h.e.Counters(); c.RunnerErrors != 1 || c.Finished[engine.FinishError] != 1 {
		t.Fatalf("counters %+v", c)
	}
	h.checkWhole()
}

// badRunner wraps the test runner and breaks its answers in a chosen way.
type badRunner struct {
	*enginetest.Runner
	mode string
}

func (b *badRunner) Execute(ctx context.Context, p *engine.BatchPlan) (engine.StepResult, error) {
	res, err := b.Runner.Execute(ctx, p)
	switch b.mode {
	case "panic":
		panic("boom")
	case "short":
		res.Accepted = res.Accepted[:0]
	case "token":
		if len(res.Tokens) > 0 {
			res.Tokens[0] = 1 << 20
		}
	case "top": // an alternative outside the vocabulary
		if len(res.TopTokens) > 0 {
			res.TopTokens[0] = -3
		}
	case "prompt top":
		if len(res.PromptTopTokens) > 0 {
			res.PromptTopTokens[0] = 1 << 20
		}
	}
	return res, err
}

func TestBadRunnerResultsFailTheStepNotTheEngine(t *testing.T) {
	for _, mode := range []string{"panic", "short", "token", "top", "prompt top"} {
		r, err := enginetest.New(enginetest.Config{})
		if err != nil {
			t.Fatal(err)
		}
		br := &badRunner{Runner: r, mode: mode}
		e, err := engine.New(br, engine.Config{Pool: r.Pool()})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error)
		go func() { done <- e.Run(ctx) }()
		st, err := e.Submit(ctx, engine.Request{Prompt: prompt(1, 10), Sampling: engine.SamplingParams{MaxTokens: 3, Logprobs: true, TopLogprobs: 2, PromptLogprobs: true}})
		if err != nil {
			t.Fatal(err)
		}
		_, ev, err := st.Collect(ctx)
		if err != nil || ev.Finish != engine.FinishError {
			t.Fatalf("%s: %v %+v", mode, err, ev)
		}
		if mode != "panic" && !errors.Is(ev.Err, engine.ErrBadResult) {
			t.Fatalf("%s: error %v does not wrap ErrBadResult", mode, ev.Err)
		}
		// The engine keeps serving once the runner behaves.
		br.mode = ""
		st, _ = e.Submit(ctx, engine.Request{Prompt: prompt(2, 10), Sampling: engine.SamplingParams{MaxTokens: 3}})
		if _, ev, _ = st.Collect(ctx); ev.Finish != engine.FinishLength {
			t.Fatalf("%s: next request %+v", mode, ev)
		}
		cancel()
		<-done
		if err := r.Pool().Check(); err != nil || r.Pool().OpenSeqs() != 0 {
			t.Fatalf("%s: pool %v, %d open", mode, err, r.Pool().OpenSeqs())
		}
	}
}

func TestSubmitErrors(t *testing.T) {
	r, _ := enginetest.New(enginetest.Config{MaxContext: 100})
	e, err := engine.New(r, engine.Config{Pool: r.Pool(), MaxQueue: 2})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	sub := func(req engine.Request) error { _, err := e.Submit(ctx, req); return err }
	ok := engine.SamplingParams{MaxTokens: 10}
	for _, tc := range []struct {
		name string
		req  engine.Request
		want error
	}{
		{"empty", engine.Request{Sampling: ok}, engine.ErrInvalidRequest},
		{"vocab", engine.Request{Prompt: []int32{1, 256}, Sampling: ok}, engine.ErrInvalidRequest},
		{"negative", engine.Request{Prompt: []int32{-1}, Sampling: ok}, engine.ErrInvalidRequest},
		{"temperature", engine.Request{Prompt: []int32{1}, Sampling: engine.SamplingParams{Temperature: -1}}, engine.ErrInvalidRequest},
		{"top_p", engine.Request{Prompt: []int32{1}, Sampling: engine.SamplingParams{TopP: 1.5}}, engine.ErrInvalidRequest},
		{"top_logprobs", engine.Request{Prompt: []int32{1}, Sampling: engine.SamplingParams{Logprobs: true, TopLogprobs: 99}}, engine.ErrInvalidRequest},
		{"stop id", engine.Request{Prompt: []int32{1}, Sampling: engine.SamplingParams{StopTokenIDs: []int32{999}}}, engine.ErrInvalidRequest},
		{"too long", engine.Request{Prompt: prompt(1, 95), Sampling: ok}, engine.ErrContextTooLong},
		{"prompt fills context", engine.Request{Prompt: prompt(1, 100)}, engine.ErrContextTooLong},
	} {
		if err := sub(tc.req); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	if err := sub(engine.Request{ID: "x", Prompt: []int32{1}, Sampling: ok}); err != nil {
		t.Fatal(err)
	}
	if err := sub(engine.Request{ID: "x", Prompt: []int32{1}, Sampling: ok}); !errors.Is(err, engine.ErrDuplicateID) {
		t.Fatalf("duplicate: %v", err)
	}
	if err := sub(engine.Request{Prompt: []int32{1}}); err != nil { // MaxTokens 0: up to the context
		t.Fatal(err)
	}
	if err := sub(engine.Request{Prompt: []int32{1}, Sampling: ok}); !errors.Is(err, engine.ErrQueueFull) {
		t.Fatalf("queue full: %v", err)
	}
	ctx2, cancel := context.WithTimeout(ctx, time.Millisecond)
	defer cancel()
	if err := e.Drain(ctx2); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("drain without Run: %v", err)
	}
	if err := sub(engine.Request{Prompt: []int32{1}, Sampling: ok}); !errors.Is(err, engine.ErrDraining) {
		t.Fatalf("draining: %v", err)
	}
	e.Close()
	if err := sub(engine.Request{Prompt: []int32{1}, Sampling: ok}); !errors.Is(err, engine.ErrClosed) {
		t.Fatalf("closed: %v", err)
	}
}

func TestDrainFinishesInFlightThenClose(t *testing.T) {
	h := start(t, enginetest.Config{}, engine.Config{})
	var streams []*engine.Stream
	for i := 0; i < 5; i++ {
		st, err := h.e.Submit(context.Background(), engine.Request{Prompt: prompt(i, 20), Sampling: engine.SamplingParams{MaxTokens: 30}})
		if err != nil {
			t.Fatal(err)
		}
		streams = append(streams, st)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := h.e.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	for _, st := range streams {
		toks, ev, err := st.Collect(ctx)
		if err != nil || ev.Finish != engine.FinishLength || len(toks) != 30 {
			t.Fatalf("after drain: %d tokens, %+v, %v", len(toks), ev, err)
		}
	}
	h.e.Close()
	h.e.Close()
	h.checkWhole()
}

func TestCloseAbortsInFlight(t *testing.T) {
	block := make(chan struct{})
	var once atomic.Bool
	r, _ := enginetest.New(enginetest.Config{Fail: func(uint64) bool {
		if once.CompareAndSwap(false, true) {
			<-block // hold the first step until Close has run
		}
		return false
	}})
	e, _ := engine.New(r, engine.Config{Pool: r.Pool()})
	done := make(chan error)
	go func() { done <- e.Run(context.Background()) }()
	st, _ := e.Submit(context.Background(), engine.Request{Prompt: prompt(1, 10), Sampling: engine.SamplingParams{MaxTokens: 100}})
	waiting, _ := e.Submit(context.Background(), engine.Request{Prompt: prompt(2, 10), Sampling: engine.SamplingParams{MaxTokens: 100}})
	for !once.Load() {
		time.Sleep(time.Millisecond)
	}
	e.Close()
	close(block)
	if err := <-done; err != nil {
		t.Fatalf("Run after Close: %v", err)
	}
	for _, s := range []*engine.Stream{st, waiting} {
		_, ev, err := s.Collect(context.Background())
		if err != nil || ev.Finish != engine.FinishAbort || !errors.Is(ev.Err, engine.ErrClosed) {
			t.Fatalf("%+v %v", ev, err)
		}
	}
	if r.Pool().OpenSeqs() != 0 {
		t.Fatal("sequences left open after Close")
	}
}

func TestContextCancelAborts(t *testing.T) {
	// The steps after the first few wait until the cancel has ended the request: a greedy
	// step of the test runner takes microseconds, and on a loaded machine the request
	// could otherwise reach its 4000 tokens before the cancel's callback runs.
	var watched atomic.Pointer[engine.Stream]
	h := start(t, enginetest.Config{Fail: func(step uint64) bool {
		for step > 2 {
			if st := watched.Load(); st != nil && st.Done() {
				break
			}
			time.Sleep(time.Millisecond)
		}
		return false
	}}, engine.Config{})
	ctx, cancel := context.WithCancel(context.Background())
	st, err := h.e.Submit(ctx, engine.Request{Prompt: prompt(1, 10), Sampling: engine.SamplingParams{MaxTokens: 4000}})
	if err != nil {
		t.Fatal(err)
	}
	watched.Store(st)
	if _, err := st.Recv(context.Background()); err != nil { // at least one token
		t.Fatal(err)
	}
	cancel()
	_, ev, err := st.Collect(context.Background())
	if err != nil || ev.Finish != engine.FinishAbort || !errors.Is(ev.Err, context.Canceled) {
		t.Fatalf("%+v %v", ev, err)
	}
	if ev.Usage.CompletionTokens >= 4000 {
		t.Fatal("the request ran to the end")
	}
	// The id can be reused at once.
	st, err = h.e.Submit(context.Background(), engine.Request{ID: st.ID(), Prompt: prompt(1, 3), Sampling: engine.SamplingParams{MaxTokens: 2}})
	if err != nil {
		t.Fatal(err)
	}
	if _, ev, err := st.Collect(context.Background()); err != nil || ev.Finish != engine.FinishLength {
		t.Fatalf("reused id: %+v %v", ev, err)
	}
	h.checkWhole()
}

func TestStopTokensAndEOS(t *testing.T) {
	p := prompt(5, 12)
	ref := enginetest.Reference(256, p, 40, greedy())
	eos := ref[7]
	stop := ref[3]
	h := start(t, enginetest.Config{EOS: []int32{eos}}, engine.Config{})
	cut := slices.Index(ref, eos) + 1
	toks, ev := h.generate(engine.Request{Prompt: p, Sampling: engine.SamplingParams{MaxTokens: 40}})
	if ev.Finish != engine.FinishStop || !slices.Equal(toks, ref[:cut]) {
		t.Fatalf("eos: %v %v, want %v", toks, ev.Finish, ref[:cut])
	}
	toks, ev = h.generate(engine.Request{Prompt: p, Sampling: engine.SamplingParams{MaxTokens: 40, IgnoreEOS: true}})
	if ev.Finish != engine.FinishLength || !slices.Equal(toks, ref) {
		t.Fatalf("ignore eos: %v %v", toks, ev.Finish)
	}
	cut = slices.Index(ref, stop) + 1
	toks, ev = h.generate(engine.Request{Prompt: p, Sampling: engine.SamplingParams{MaxTokens: 40, IgnoreEOS: true, StopTokenIDs: []int32{stop}}})
	if ev.Finish != engine.FinishStop || !slices.Equal(toks, ref[:cut]) {
		t.Fatalf("stop id: %v %v", toks, ev.Finish)
	}
	h.checkWhole()
}

func TestSeededSamplingReproducesWhateverTheBatch(t *testing.T) {
	sp := engine.SamplingParams{Temperature: 0.9, TopP: 0.9, TopK: 40, MinP: 0.02, Seed: 7, HasSeed: true, MaxTokens: 30}
	row := engine.SamplingRow{Temperature: 0.9, TopP: 0.9, TopK: 40, MinP: 0.02, Seed: 7, Logprobs: -1}
	p := prompt(3, 25)
	want := enginetest.Reference(256, p, 30, row)
	h := start(t, enginetest.Config{}, engine.Config{MaxBatchTokens: 16})
	// Alone, then among other requests with a different chunking.
	alone, _ := h.generate(engine.Request{Prompt: p, Sampling: sp})
	var streams []*engine.Stream
	for i := 0; i < 4; i++ {
		other := sp
		other.Seed = uint64(100 + i)
		st, _ := h.e.Submit(context.Background(), engine.Request{Prompt: prompt(i, 9), Sampling: other})
		streams = append(streams, st)
	}
	batched, _ := h.generate(engine.Request{Prompt: p, Sampling: sp})
	if !slices.Equal(alone, want) || !slices.Equal(batched, want) {
		t.Fatalf("alone %v\nbatched %v\nwant %v", alone, batched, want)
	}
	other := sp
	other.Seed = 8
	if diff, _ := h.generate(engine.Request{Prompt: p, Sampling: other}); slices.Equal(diff, want) {
		t.Fatal("a different seed gave the same 30 tokens")
	}
	for _, st := range streams {
		st.Collect(context.Background())
	}
	h.checkWhole()
}

func TestLogprobs(t *testing.T) {
	h := start(t, enginetest.Config{}, engine.Config{})
	st, err := h.e.Submit(context.Background(), engine.Request{Prompt: prompt(1, 10),
		Sampling: engine.SamplingParams{MaxTokens: 6, Logprobs: true, TopLogprobs: 3}})
	if err != nil {
		t.Fatal(err)
	}
	var lps []engine.TokenLogprob
	var toks []int32
	for {
		ev, err := st.Recv(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		toks = append(toks, ev.Tokens...)
		lps = append(lps, ev.Logprobs...)
		if ev.Finish != engine.FinishNone {
			break
		}
	}
	if len(lps) != 6 || len(toks) != 6 {
		t.Fatalf("%d logprobs for %d tokens", len(lps), len(toks))
	}
	for i, lp := range lps {
		if lp.Token != toks[i] || lp.Logprob > 0 || len(lp.Top) != 3 {
			t.Fatalf("logprob %d: %+v", i, lp)
		}
		// Greedy: the chosen token is the most likely one.
		if lp.Top[0].Token != lp.Token || lp.Top[0].Logprob != lp.Logprob || lp.Top[1].Logprob > lp.Top[0].Logprob || lp.Top[2].Logprob > lp.Top[1].Logprob {
			t.Fatalf("top logprobs %d: %+v", i, lp)
		}
	}
	// Without logprobs the events carry none.
	st, _ = h.e.Submit(context.Background(), engine.Request{Prompt: prompt(1, 10), Sampling: engine.SamplingParams{MaxTokens: 3}})
	ev, _ := st.Recv(context.Background())
	if ev.Logprobs != nil {
		t.Fatal("logprobs without asking")
	}
	st.Collect(context.Background())
	h.checkWhole()
}

func TestGraphBucketPadding(t *testing.T) {
	type seen struct {
		b, graph int
		decode   bool
	}
	var plans []seen
	rc := enginetest.Config{GraphBuckets: []int{1, 2, 4, 8}, OnPlan: func(p *engine.BatchPlan) {
		plans = append(plans, seen{p.NumSeqs(), int(p.GraphBatch), p.IsDecode()})
	}}
	d := newDirect(t, rc, engine.Config{})
	for i := 0; i < 3; i++ {
		d.add(fmt.Sprint(i), prompt(i, 10), engine.SamplingParams{MaxTokens: 5 + i}, 0)
	}
	d.runAll()
	// Rows that feed one prompt token and sample look like decodes but are not: a prompt
	// of one token, alone and next to a decode, and a prompt whose prefix hit leaves one
	// token to compute.
	d.add("one", []int32{7}, engine.SamplingParams{MaxTokens: 3}, 0)
	d.step()
	d.add("one more", []int32{8}, engine.SamplingParams{MaxTokens: 3}, 0)
	d.runAll()
	d.add("hit", prompt(0, 17), engine.SamplingParams{MaxTokens: 2}, 0)
	d.runAll()
	d.add("hit again", prompt(0, 17), engine.SamplingParams{MaxTokens: 2}, 0)
	d.runAll()
	decodes := 0
	for _, p := range plans {
		want := 0
		if p.decode {
			decodes++
			want = map[int]int{1: 1, 2: 2, 3: 4}[p.b]
		}
		if p.graph != want {
			t.Fatalf("plan %+v: graph batch %d, want %d", p, p.graph, want)
		}
	}
	if decodes == 0 {
		t.Fatal("no decode plan")
	}
	d.checkWhole()
}

func TestMetricsAreExported(t *testing.T) {
	h := start(t, enginetest.Config{}, engine.Config{})
	h.generate(engine.Request{Prompt: prompt(1, 40), Sampling: engine.SamplingParams{MaxTokens: 5}})
	h.generate(engine.Request{Prompt: prompt(1, 40), Sampling: engine.SamplingParams{MaxTokens: 5}})
	reg := h.e.Registry()
	for name, want := range map[string]float64{
		"resin_generation_tokens_total": 10,
		"resin_prompt_tokens_total":     80,
		"resin_prefix_cache_hits_total": 32,
		"resin_requests_running":        0,
	} {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, mf := range mfs {
			if mf.GetName() == name {
				m := mf.GetMetric()[0]
				v := m.GetCounter().GetValue() + m.GetGauge().GetValue()
				if v != want {
					t.Fatalf("%s = %v, want %v", name, v, want)
				}
				found = true
			}
		}
		if !found {
			t.Fatalf("%s not exported", name)
		}
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), "resin_") && !strings.HasPrefix(mf.GetName(), "vllm:") {
			t.Fatalf("metric %s lacks the resin_ (or vLLM's vllm:) prefix", mf.GetName())
		}
		names = append(names, mf.GetName())
	}
	for _, n := range []string{"resin_time_to_first_token_seconds", "resin_inter_token_latency_seconds",
		"resin_e2e_request_latency_seconds", "resin_step_schedule_seconds", "resin_step_execute_seconds",
		"resin_kv_cache_usage_ratio", "resin_preemptions_total", "resin_spec_decode_draft_tokens_total",
		"resin_spec_decode_accepted_tokens_total", "resin_prefix_cache_queries_total", "resin_requests_waiting"} {
		if !slices.Contains(names, n) {
			t.Fatalf("metric %s missing from %v", n, names)
		}
	}
	h.checkWhole()
}
