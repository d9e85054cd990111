package cpurunner_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/cpurunner"
	"github.com/resin-llm/resin/core/cpurunner/cpurunnertest"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/core/runnertest"
)

const vocab = 97

// tokenLogits is the fake model: the logits after reading tok at pos depend on nothing
// else, which makes every row easy to check.
func tokenLogits(dst []float32, tok, pos int32) {
	for v := range dst {
		x := uint64(tok)*0x9E3779B97F4A7C15 ^ uint64(pos)*0xBF58476D1CE4E5B9 ^ uint64(v)*0x94D049BB133111EB
		x ^= x >> 29
		x *= 0xBF58476D1CE4E5B9
		dst[v] = float32(x>>40)/(1<<24)*8 - 4
	}
}

// fake is a Forwarder computing tokenLogits for the rows the plan asks.
type fake struct {
	calls int
	err   error
}

func (f *fake) Forward(p *engine.BatchPlan, logits []float32) error {
	f.calls++
	if f.err != nil {
		return f.err
	}
	if len(logits) != len(p.LogitsIndices)*vocab {
		return fmt.Errorf("logits buffer of %d for %d rows", len(logits), len(p.LogitsIndices))
	}
	for j, k := range p.LogitsIndices {
		tokenLogits(logits[j*vocab:(j+1)*vocab], p.Tokens[k], p.Positions[k])
	}
	return nil
}

func info() engine.RunnerInfo {
	return engine.RunnerInfo{
		Name: "fake", VocabSize: vocab, MaxContext: 256, EOS: []int32{-1, 5, vocab + 3},
		CacheGroups: []kvslab.GroupSpec{{Name: "kv", Kind: kvslab.Full, Layers: 1, BytesPerToken: 8, PageTokens: 4}},
		MaxDrafts:   2,
	}
}

func TestInfo(t *testing.T) {
	got := cpurunner.New(info(), &fake{}).Info()
	want := info()
	want.EOS, want.MaxDrafts, want.TokenMasks = []int32{5}, 0, true
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Info() = %+v, want %+v", got, want)
	}
}

// legacy is the Execute every scaffolded runner.go carried before this package, kept
// verbatim (but for the forwarder) as the behaviour Runner must reproduce.
type legacy struct {
	f       cpurunner.Forwarder
	sampler engine.Sampler
	logits  []float32
	res     engine.StepResult
	top     []engine.TopLogprob
}

func (r *legacy) Execute(ctx context.Context, plan *engine.BatchPlan) (engine.StepResult, error) {
	n := len(plan.LogitsIndices) * vocab
	if cap(r.logits) < n {
		r.logits = make([]float32, n)
	}
	r.logits = r.logits[:n]
	if err := r.f.Forward(plan, r.logits); err != nil {
		return engine.StepResult{}, err
	}
	b := plan.NumSeqs()
	res := &r.res
	res.Reset(b)
	anyLP := false
	for _, lp := range plan.Logprobs {
		anyLP = anyLP || lp >= 0
	}
	for i := 0; i < b; i++ {
		lo, hi := int(plan.LogitsStart[i]), int(plan.LogitsStart[i+1])
		if lo == hi {
			continue
		}
		row := hi - 1
		pos := int(plan.Positions[plan.LogitsIndices[row]]) + 1
		tok, lp, top := r.sampler.Sample(r.logits[row*vocab:(row+1)*vocab], plan.SamplingOf(i), pos, r.top[:0])
		r.top = top
		res.Accepted[i] = 1
		res.Tokens = append(res.Tokens, tok)
		if anyLP {
			res.Logprobs = append(res.Logprobs, lp)
		}
		for _, t := range top {
			res.TopTokens = append(res.TopTokens, t.Token)
			res.TopLogprobs = append(res.TopLogprobs, t.Logprob)
		}
	}
	return *res, nil
}

func newPool(t testing.TB) *kvslab.Pool {
	pool, err := engine.NewHostPool(info().CacheGroups, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	return pool
}

// TestMatchesLegacyExecute runs the same plans (prefill chunks, decodes, mixed sampling
// rows, with and without logprobs) through Runner, capturing or not, and through the
// runner.go code it replaces, and wants identical step results.
func TestMatchesLegacyExecute(t *testing.T) {
	rows := []engine.SamplingRow{
		{Logprobs: -1},
		{Temperature: 0.8, Seed: 7, Logprobs: -1},
		{Temperature: 1, TopK: 5, Seed: 3, Logprobs: 0},
		{Temperature: 0.7, TopP: 0.9, MinP: 0.05, Seed: 11, Logprobs: 4},
	}
	for _, capture := range []bool{false, true} {
		pool := newPool(t)
		var seqs []*runnertest.Seq
		var promptLen []int
		for i := range rows {
			promptLen = append(promptLen, 9+3*i)
			// The prompt, then tokens standing for what decodes feed.
			seqs = append(seqs, runnertest.OpenSeq(t, pool, runnertest.Prompt(9+3*i+4, vocab, i)))
		}
		r, old := cpurunner.New(info(), &fake{}), &legacy{f: &fake{}}
		if capture {
			r.CaptureLogits(func(cpurunner.LogitsRow) {})
		}
		for step, n := range [][]int{{5, 9, 2, 1}, {4, 3, 13, 17}, {1, 1, 1, 1}, {1, 1, 1, 1}} {
			p := runnertest.Plan(t, pool, seqs, n, false)
			midPrompt(p, seqs, promptLen)
			for i, row := range rows {
				p.Temperature[i], p.TopP[i], p.TopK[i], p.MinP[i] = row.Temperature, row.TopP, int32(row.TopK), row.MinP
				p.Seed[i], p.Logprobs[i] = row.Seed, int32(row.Logprobs)
			}
			want, err := old.Execute(context.Background(), p)
			if err != nil {
				t.Fatal(err)
			}
			got, err := r.Execute(context.Background(), p)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("capture=%v step %d: got %+v\nwant %+v", capture, step, got, want)
			}
		}
	}
}

// midPrompt drops the logits row of every sequence of p still inside its prompt after
// the step, as the engine's plans do.
func midPrompt(p *engine.BatchPlan, seqs []*runnertest.Seq, promptLen []int) {
	idx := p.LogitsIndices[:0]
	for i, s := range seqs {
		lo, hi := p.LogitsStart[i], p.LogitsStart[i+1]
		keep := s.Computed >= promptLen[i]
		p.LogitsStart[i] = int32(len(idx))
		if keep {
			idx = append(idx, p.LogitsIndices[lo:hi]...)
		}
	}
	p.LogitsStart[len(seqs)] = int32(len(idx))
	p.LogitsIndices = idx
}

// TestEngine drives the runner through the real engine and checks every sampled token,
// its logprob and its top alternatives against the fake model sampled directly.
func TestEngine(t *testing.T) {
	r := cpurunner.New(info(), &fake{})
	e, stop := startEngine(t, r, engine.Config{MaxBatchTokens: 16})
	defer stop()
	type req struct {
		prompt []int32
		sp     engine.SamplingParams
	}
	reqs := []req{
		{runnertest.Prompt(7, vocab, 1), engine.SamplingParams{MaxTokens: 9, IgnoreEOS: true}},
		{runnertest.Prompt(30, vocab, 2), engine.SamplingParams{MaxTokens: 6, Temperature: 0.9, Seed: 5, HasSeed: true, Logprobs: true, TopLogprobs: 3, IgnoreEOS: true}},
		{runnertest.Prompt(3, vocab, 3), engine.SamplingParams{MaxTokens: 12, Temperature: 1, TopK: 4, Seed: 9, HasSeed: true, Logprobs: true, IgnoreEOS: true}},
	}
	streams := make([]*engine.Stream, len(reqs))
	for i, q := range reqs {
		s, err := e.Submit(context.Background(), engine.Request{Prompt: q.prompt, Sampling: q.sp})
		if err != nil {
			t.Fatal(err)
		}
		streams[i] = s
	}
	for i, q := range reqs {
		toks, lps := collect(t, streams[i])
		// The direct reference: row after the last fed token, sampled at the next position.
		var s engine.Sampler
		row := engine.SamplingRow{Temperature: q.sp.Temperature, TopK: q.sp.TopK, Seed: q.sp.Seed, Logprobs: -1}
		if q.sp.Logprobs {
			row.Logprobs = q.sp.TopLogprobs
		}
		logits := make([]float32, vocab)
		seq := slices.Clone(q.prompt)
		for k := 0; k < q.sp.MaxTokens; k++ {
			tokenLogits(logits, seq[len(seq)-1], int32(len(seq)-1))
			tok, lp, top := s.Sample(logits, row, len(seq), nil)
			if k >= len(toks) || toks[k] != tok {
				t.Fatalf("request %d: tokens %v, want %d at %d", i, toks, tok, k)
			}
			if q.sp.Logprobs {
				got := lps[k]
				if got.Logprob != lp || len(got.Top) != len(top) {
					t.Fatalf("request %d token %d: logprob %+v, want %v with %d alternatives", i, k, got, lp, len(top))
				}
				for j := range top {
					if got.Top[j] != top[j] {
						t.Fatalf("request %d token %d: top %+v, want %+v", i, k, got.Top, top)
					}
				}
			}
			seq = append(seq, tok)
		}
		if len(toks) != q.sp.MaxTokens {
			t.Fatalf("request %d: %d tokens, want %d", i, len(toks), q.sp.MaxTokens)
		}
	}
}

// TestCapture checks that a capturing runner reports every token row exactly once, with
// the logits the model computes for it, across chunked prefills and concurrent
// requests, and generates the tokens a runner that does not capture generates.
func TestCapture(t *testing.T) {
	prompts := [][]int32{runnertest.Prompt(37, vocab, 1), runnertest.Prompt(5, vocab, 2), runnertest.Prompt(20, vocab, 3)}
	const gen = 6
	run := func(capture func(cpurunner.LogitsRow)) [][]int32 {
		r := cpurunner.New(info(), &fake{})
		r.CaptureLogits(capture)
		e, stop := startEngine(t, r, engine.Config{MaxBatchTokens: 8})
		defer stop()
		var streams []*engine.Stream
		for _, p := range prompts {
			s, err := e.Submit(context.Background(), engine.Request{Prompt: p, Sampling: engine.SamplingParams{MaxTokens: gen, Temperature: 1, Seed: 4, HasSeed: true, IgnoreEOS: true}})
			if err != nil {
				t.Fatal(err)
			}
			streams = append(streams, s)
		}
		var out [][]int32
		for _, s := range streams {
			toks, _ := collect(t, s)
			out = append(out, toks)
		}
		return out
	}
	plain := run(nil)
	type key struct {
		req uint64
		pos int32
	}
	var mu sync.Mutex
	seen := map[key]int32{}
	var bad []string
	want := make([]float32, vocab)
	captured := run(func(row cpurunner.LogitsRow) {
		mu.Lock()
		defer mu.Unlock()
		k := key{row.ReqID, row.Position}
		if _, dup := seen[k]; dup {
			bad = append(bad, fmt.Sprintf("row %+v twice", k))
		}
		seen[k] = row.Token
		tokenLogits(want, row.Token, row.Position)
		if !slices.Equal(row.Logits, want) {
			bad = append(bad, fmt.Sprintf("row %+v: wrong logits", k))
		}
	})
	if len(bad) > 0 {
		t.Fatalf("%d bad rows, first: %s", len(bad), bad[0])
	}
	if !reflect.DeepEqual(captured, plain) {
		t.Fatalf("capturing changed the output: %v, want %v", captured, plain)
	}
	// Every request has one row per fed token: the prompt and all generated tokens but
	// the last, which is never fed back.
	byReq := map[uint64][]int32{}
	for k, tok := range seen {
		s := byReq[k.req]
		for int(k.pos) >= len(s) {
			s = append(s, -1)
		}
		s[k.pos] = tok
		byReq[k.req] = s
	}
	if len(byReq) != len(prompts) {
		t.Fatalf("rows of %d requests, want %d", len(byReq), len(prompts))
	}
	for _, fed := range byReq {
		i := slices.IndexFunc(prompts, func(p []int32) bool { return len(fed) >= len(p) && slices.Equal(fed[:len(p)], p) })
		if i < 0 {
			t.Fatalf("rows %v match no prompt", fed)
		}
		if want := append(slices.Clone(prompts[i]), plain[i][:gen-1]...); !slices.Equal(fed, want) {
			t.Fatalf("request %d: rows for tokens %v, want %v", i, fed, want)
		}
	}
}

// TestCaptureLeavesPlan checks that capturing never writes the engine's plan.
func TestCaptureLeavesPlan(t *testing.T) {
	pool := newPool(t)
	seqs := []*runnertest.Seq{runnertest.OpenSeq(t, pool, runnertest.Prompt(10, vocab, 1)), runnertest.OpenSeq(t, pool, runnertest.Prompt(6, vocab, 2))}
	p := runnertest.Plan(t, pool, seqs, []int{8, 4}, false)
	before, err := p.MarshalBinary() // every array of the plan, by value
	if err != nil {
		t.Fatal(err)
	}
	r := cpurunner.New(info(), &fake{})
	rows := 0
	r.CaptureLogits(func(cpurunner.LogitsRow) { rows++ })
	if _, err := r.Execute(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	if rows != 12 {
		t.Fatalf("%d rows captured, want 12", rows)
	}
	if after, err := p.MarshalBinary(); err != nil || !bytes.Equal(after, before) {
		t.Fatalf("Execute changed the plan (%v)", err)
	}
	r.CaptureLogits(nil)
	rows = 0
	if _, err := r.Execute(context.Background(), runnertest.Plan(t, pool, seqs, []int{1, 2}, false)); err != nil || rows != 0 {
		t.Fatalf("after CaptureLogits(nil): %d rows, %v", rows, err)
	}
}

func TestErrors(t *testing.T) {
	pool := newPool(t)
	seqs := []*runnertest.Seq{runnertest.OpenSeq(t, pool, runnertest.Prompt(4, vocab, 1))}
	p := runnertest.Plan(t, pool, seqs, []int{4}, false)

	_, err := cpurunner.New(info(), nil).Execute(context.Background(), p)
	if !errors.Is(err, cpurunner.ErrNotBound) || !strings.HasPrefix(err.Error(), "fake: ") {
		t.Errorf("nil forwarder: %v, want fake: %v", err, cpurunner.ErrNotBound)
	}
	unbound := cpurunnertest.NewRunner(cpurunnertest.Config{})
	if _, err := unbound.Execute(context.Background(), p); !errors.Is(err, cpurunner.ErrNotBound) {
		t.Errorf("unbound model: %v, want %v", err, cpurunner.ErrNotBound)
	}

	f := &fake{err: errors.New("bad weights")}
	if _, err := cpurunner.New(info(), f).Execute(context.Background(), p); err == nil || err.Error() != "fake: bad weights" {
		t.Errorf("failing forward: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	f = &fake{}
	if _, err := cpurunner.New(info(), f).Execute(ctx, p); !errors.Is(err, context.Canceled) || f.calls != 0 {
		t.Errorf("cancelled context: %v after %d forwards, want context.Canceled before any", err, f.calls)
	}
}

// TestEngineStepError checks that a failing forward ends the request with an error and
// leaves the engine serving.
func TestEngineStepError(t *testing.T) {
	f := &fake{}
	var mu sync.Mutex
	fail := true
	r := cpurunner.New(info(), cpurunner.ForwardFunc(func(p *engine.BatchPlan, logits []float32) error {
		mu.Lock()
		defer mu.Unlock()
		if fail {
			return errors.New("out of memory")
		}
		return f.Forward(p, logits)
	}))
	e, stop := startEngine(t, r, engine.Config{})
	defer stop()
	s, err := e.Submit(context.Background(), engine.Request{Prompt: []int32{1, 2, 3}, Sampling: engine.SamplingParams{MaxTokens: 2}})
	if err != nil {
		t.Fatal(err)
	}
	_, ev, err := s.Collect(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if ev.Finish != engine.FinishError || ev.Err == nil || !strings.Contains(ev.Err.Error(), "fake: out of memory") {
		t.Fatalf("terminal event %+v, want an error naming fake: out of memory", ev)
	}
	mu.Lock()
	fail = false
	mu.Unlock()
	s, err = e.Submit(context.Background(), engine.Request{Prompt: []int32{1, 2, 3}, Sampling: engine.SamplingParams{MaxTokens: 2, IgnoreEOS: true}})
	if err != nil {
		t.Fatal(err)
	}
	if toks, ev, err := s.Collect(context.Background()); err != nil || len(toks) != 2 || ev.Err != nil {
		t.Fatalf("after the failure: %v %+v %v", toks, ev, err)
	}
}

// TestEngineCancel checks that a cancelled engine context stops the loop while a step
// runs, with the request left to the caller (not failed).
func TestEngineCancel(t *testing.T) {
	entered := make(chan struct{}, 1)
	release := make(chan struct{})
	f := &fake{}
	r := cpurunner.New(info(), cpurunner.ForwardFunc(func(p *engine.BatchPlan, logits []float32) error {
		select {
		case entered <- struct{}{}:
		default:
		}
		<-release
		return f.Forward(p, logits)
	}))
	e, err := engine.New(r, engine.Config{CacheBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	if _, err := e.Submit(context.Background(), engine.Request{Prompt: []int32{1, 2, 3}, Sampling: engine.SamplingParams{MaxTokens: 50}}); err != nil {
		t.Fatal(err)
	}
	<-entered
	cancel()
	close(release)
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Run returned %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context was cancelled")
	}
}

// TestConformance runs core/runnertest's suite on cpurunnertest's model, a runner wired on
// this package the way a scaffolded model is.
func TestConformance(t *testing.T) {
	runnertest.Run(t, func(t testing.TB) (engine.Runner, *kvslab.Pool) {
		r := cpurunnertest.NewRunner(cpurunnertest.Config{VocabSize: 128})
		pool, err := r.NewPool(1 << 20)
		if err != nil {
			t.Fatal(err)
		}
		return r, pool
	}, runnertest.Options{})
}

// TestModelCapture checks cpurunnertest's model through a capturing runner: every row's
// logits are Logits of the tokens fed up to it.
func TestModelCapture(t *testing.T) {
	cfg := cpurunnertest.Config{VocabSize: 50}
	open := cpurunnertest.Open(cfg)
	er, pool, err := open("", 0)
	if err != nil {
		t.Fatal(err)
	}
	r := er.(*cpurunnertest.Runner)
	prompt := runnertest.Prompt(23, 50, 4)
	var fed []int32
	var got []float32
	r.CaptureLogits(func(row cpurunner.LogitsRow) {
		if int(row.Position) != len(fed) {
			t.Errorf("row at position %d after %d rows", row.Position, len(fed))
		}
		fed = append(fed, row.Token)
		got = append(got, row.Logits...)
	})
	e, stop := startEngine(t, r, engine.Config{Pool: pool, MaxBatchTokens: 5})
	defer stop()
	s, err := e.Submit(context.Background(), engine.Request{Prompt: prompt, Sampling: engine.SamplingParams{MaxTokens: 7, IgnoreEOS: true}})
	if err != nil {
		t.Fatal(err)
	}
	toks, _ := collect(t, s)
	if want := cpurunnertest.Reference(50, prompt, 7, engine.SamplingRow{Logprobs: -1}); !slices.Equal(toks, want) {
		t.Fatalf("generated %v, want %v", toks, want)
	}
	if want := append(slices.Clone(prompt), toks[:6]...); !slices.Equal(fed, want) {
		t.Fatalf("rows for %v, want %v", fed, want)
	}
	if !slices.Equal(got, cpurunnertest.Logits(50, fed)) {
		t.Fatal("captured logits differ from the model's")
	}
}

func startEngine(t testing.TB, r engine.Runner, cfg engine.Config) (*engine.Engine, func()) {
	t.Helper()
	if cfg.Pool == nil {
		cfg.CacheBytes = 1 << 20
	}
	e, err := engine.New(r, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	return e, func() {
		e.Close()
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("engine loop: %v", err)
		}
	}
}

func collect(t testing.TB, s *engine.Stream) ([]int32, []engine.TokenLogprob) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var toks []int32
	var lps []engine.TokenLogprob
	for {
		ev, err := s.Recv(ctx)
		if err == io.EOF {
			return toks, lps
		}
		if err != nil {
			t.Fatal(err)
		}
		toks = append(toks, ev.Tokens...)
		lps = append(lps, ev.Logprobs...)
		if ev.Finish != engine.FinishNone && ev.Err != nil {
			t.Fatalf("request failed: %v", ev.Err)
		}
	}
}
