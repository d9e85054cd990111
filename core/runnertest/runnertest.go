package runnertest

import (
	"context"
	"errors"
	"math"
	"testing"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
)

// Opener returns a fresh runner and the cache pool built for its cache groups, as
// engine.New takes them. Each call must give a runner in the same state: the same weights
// and nothing cached.
type Opener func(t testing.TB) (engine.Runner, *kvslab.Pool)

// Options tune the suite. Zero values take the defaults noted.
type Options struct {
	// PromptLen is the length of the longer prompts (default 3 blocks + 3 tokens, capped
	// so that prompt and output fit the runner's context).
	PromptLen int
	// MaxTokens is the number of tokens each request generates (default 6).
	MaxTokens int
	// TopLogprobs is the number of alternatives whose log probabilities are compared at
	// every generated position (default 5; negative: compare the chosen token's only).
	TopLogprobs int
	// Tolerance bounds |a-b| <= Tolerance*(1+|b|) between log probabilities that must
	// agree (default 1e-4).
	Tolerance float64
	// Skip names checks not to run (see Checks), with the reason in the test log.
	Skip map[string]string
	// Plain, for a runner that proposes drafts (RunnerInfo.MaxDrafts > 0), opens the same
	// model without them: the Drafts check compares the two (it is skipped without it).
	Plain Opener
}

func (o Options) withDefaults(info engine.RunnerInfo, block int) Options {
	if o.MaxTokens <= 0 {
		o.MaxTokens = 6
	}
	if o.PromptLen <= 0 {
		o.PromptLen = 3*block + 3
	}
	if limit := info.MaxContext - o.MaxTokens - 1; o.PromptLen > limit {
		o.PromptLen = limit
	}
	switch {
	case o.TopLogprobs == 0:
		o.TopLogprobs = 5
	case o.TopLogprobs < 0:
		o.TopLogprobs = 0
	}
	o.TopLogprobs = min(o.TopLogprobs, engine.MaxTopLogprobs, info.VocabSize)
	if o.Tolerance <= 0 {
		o.Tolerance = 1e-4
	}
	return o
}

// Check is one conformance check.
type Check struct {
	Name string
	Doc  string
	Run  func(t testing.TB, s *Suite)
}

// Checks lists the suite's checks in the order Run runs them.
var Checks = []Check{
	{"PrefillEqualsDecode", "a one-shot prefill gives what feeding the prompt one token per step gives", checkPrefillEqualsDecode},
	{"ChunkedPrefill", "a prefill split into chunks that straddle pages gives what a one-shot prefill gives", checkChunkedPrefill},
	{"BatchInvariance", "a sequence's output does not depend on the other sequences of its batches", checkBatchInvariance},
	{"PageLayout", "a sequence's output does not depend on where its pages sit in a fragmented pool", checkPageLayout},
	{"Reproducible", "greedy and seeded sampling give the same tokens run after run", checkReproducible},
	{"PrefixCache", "a request served partly or wholly from the prefix cache gives the tokens of a cold run", checkPrefixCache},
	{"AbortFreesPages", "an aborted request, running or waiting, gives back every page it held", checkAbort},
	{"Drafts", "speculative decoding gives, greedy and seeded, what the runner without drafts gives", checkDrafts},
}

// Suite is what a check works with: the opener and the options, with defaults filled in
// from the runner's description.
type Suite struct {
	Open  Opener
	Opts  Options
	Info  engine.RunnerInfo
	Block int // the pool's block size in tokens
}

// New opens one runner to read its description and returns the suite for it.
func New(t testing.TB, open Opener, opts Options) *Suite {
	t.Helper()
	r, pool := open(t)
	if r == nil || pool == nil {
		t.Fatal("runnertest: the opener returned a nil runner or pool")
	}
	info := r.Info()
	s := &Suite{Open: open, Info: info, Block: pool.BlockTokens()}
	s.Opts = opts.withDefaults(info, s.Block)
	if s.Opts.PromptLen < 2 {
		t.Fatalf("runnertest: runner %q has a context of %d tokens: too short for %d generated tokens", info.Name, info.MaxContext, s.Opts.MaxTokens)
	}
	return s
}

// Run runs every check of the suite on the runners open returns, each as a subtest.
func Run(t *testing.T, open Opener, opts Options) {
	t.Helper()
	s := New(t, open, opts)
	for _, c := range Checks {
		t.Run(c.Name, func(t *testing.T) {
			if why, ok := s.Opts.Skip[c.Name]; ok {
				t.Skipf("skipped by the caller: %s", why)
			}
			c.Run(t, s)
		})
	}
}

// Prompt returns n deterministic token ids below vocab; salt picks a different prompt.
func Prompt(n, vocab, salt int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = int32((i*37 + salt*101 + 3) % vocab)
	}
	return out
}

// Output is what one request generated.
type Output struct {
	Tokens   []int32
	Logprobs []engine.TokenLogprob
	Finish   engine.FinishReason
}

// Engine is a runner behind a running engine loop, for the checks.
type Engine struct {
	*engine.Engine
	Pool   *kvslab.Pool
	cancel context.CancelFunc
	done   chan error
}

// Start opens a fresh runner and runs an engine over it with cfg (cfg.Pool is the
// runner's pool). Stop it with Stop, which also checks the pool.
func (s *Suite) Start(t testing.TB, cfg engine.Config) *Engine {
	t.Helper()
	r, pool := s.Open(t)
	return s.StartWith(t, r, pool, cfg)
}

// StartWith is Start for a runner and pool the caller prepared.
func (s *Suite) StartWith(t testing.TB, r engine.Runner, pool *kvslab.Pool, cfg engine.Config) *Engine {
	t.Helper()
	cfg.Pool = pool
	e, err := engine.New(r, cfg)
	if err != nil {
		t.Fatalf("engine.New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h := &Engine{Engine: e, Pool: pool, cancel: cancel, done: make(chan error, 1)}
	go func() { h.done <- e.Run(ctx) }()
	t.Cleanup(func() { h.halt() })
	return h
}

// halt stops the loop without closing the engine (Close would abort and free whatever
// is left, hiding a leak) and returns the loop's error.
func (h *Engine) halt() error {
	if h.cancel == nil {
		return nil
	}
	h.cancel()
	h.cancel = nil
	err := <-h.done
	h.Engine.Close()
	if errors.Is(err, context.Canceled) {
		err = nil
	}
	return err
}

// Stop stops the engine loop and checks that the pool is consistent, that no sequence is
// left open and no page used, and that the pool is whole once its prefix cache is
// cleared.
func (h *Engine) Stop(t testing.TB) {
	t.Helper()
	if err := h.halt(); err != nil {
		t.Errorf("engine loop: %v", err)
	}
	CheckPoolEmpty(t, h.Pool)
}

// CheckPoolEmpty checks that pool is consistent, holds no sequence and no used page, and
// is whole once its prefix cache is cleared. Call it only when nothing else uses pool.
func CheckPoolEmpty(t testing.TB, pool *kvslab.Pool) {
	t.Helper()
	if err := pool.Check(); err != nil {
		t.Errorf("pool inconsistent: %v", err)
	}
	st := pool.Stats()
	if st.Sequences != 0 {
		t.Errorf("%d sequences still open in the pool after every request ended", st.Sequences)
	}
	for _, g := range st.Groups {
		if g.PagesUsed != 0 {
			t.Errorf("group %s: %d pages still used after every request ended", g.Name, g.PagesUsed)
		}
	}
	pool.ClearCache()
	if !pool.Whole() {
		t.Errorf("pool not whole after clearing the prefix cache: %d of %d slabs free", pool.Stats().FreeSlabs, pool.Slabs())
	}
}

// Sampling returns greedy sampling of the suite's length, with log probabilities.
func (s *Suite) Sampling() engine.SamplingParams {
	return engine.SamplingParams{MaxTokens: s.Opts.MaxTokens, IgnoreEOS: true, Logprobs: true, TopLogprobs: s.Opts.TopLogprobs}
}

// Generate runs one request to its end.
func (h *Engine) Generate(t testing.TB, prompt []int32, sp engine.SamplingParams) Output {
	t.Helper()
	return h.GenerateAll(t, [][]int32{prompt}, sp)[0]
}

// GenerateAll submits every prompt at once, so that they share batches, and collects
// them.
func (h *Engine) GenerateAll(t testing.TB, prompts [][]int32, sp engine.SamplingParams) []Output {
	t.Helper()
	ctx := context.Background()
	streams := make([]*engine.Stream, len(prompts))
	for i, p := range prompts {
		st, err := h.Submit(ctx, engine.Request{Prompt: p, Sampling: sp})
		if err != nil {
			t.Fatalf("submit prompt %d: %v", i, err)
		}
		streams[i] = st
	}
	outs := make([]Output, len(prompts))
	for i, st := range streams {
		o, err := collect(ctx, st)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		outs[i] = o
	}
	return outs
}

func collect(ctx context.Context, st *engine.Stream) (Output, error) {
	var o Output
	for {
		ev, err := st.Recv(ctx)
		if err != nil {
			return o, err
		}
		o.Tokens = append(o.Tokens, ev.Tokens...)
		o.Logprobs = append(o.Logprobs, ev.Logprobs...)
		if ev.Finish != engine.FinishNone {
			o.Finish = ev.Finish
			if ev.Err != nil && ev.Finish != engine.FinishAbort {
				return o, ev.Err
			}
			return o, nil
		}
	}
}

// Same reports where got differs from want: the tokens exactly, the log probabilities
// within the suite's tolerance.
func (s *Suite) Same(t testing.TB, what string, got, want Output) {
	t.Helper()
	if got.Finish != want.Finish {
		t.Errorf("%s: finish %s, want %s", what, got.Finish, want.Finish)
	}
	if len(got.Tokens) != len(want.Tokens) {
		t.Errorf("%s: tokens %v, want %v", what, got.Tokens, want.Tokens)
		return
	}
	for i := range got.Tokens {
		if got.Tokens[i] != want.Tokens[i] {
			t.Errorf("%s: tokens %v, want %v (first difference at output position %d)", what, got.Tokens, want.Tokens, i)
			return
		}
	}
	if len(got.Logprobs) != len(want.Logprobs) {
		t.Errorf("%s: %d log probabilities, want %d", what, len(got.Logprobs), len(want.Logprobs))
		return
	}
	worst := 0.0
	for i := range got.Logprobs {
		g, w := got.Logprobs[i], want.Logprobs[i]
		d, ok := s.close(g.Logprob, w.Logprob)
		if !ok {
			t.Errorf("%s: output position %d: logprob %g, want %g", what, i, g.Logprob, w.Logprob)
			return
		}
		worst = max(worst, d)
		if len(g.Top) != len(w.Top) {
			t.Errorf("%s: output position %d: %d top logprobs, want %d", what, i, len(g.Top), len(w.Top))
			return
		}
		for j := range g.Top {
			d, ok := s.close(g.Top[j].Logprob, w.Top[j].Logprob)
			if !ok {
				t.Errorf("%s: output position %d: top logprob %d is %g (token %d), want %g (token %d)",
					what, i, j, g.Top[j].Logprob, g.Top[j].Token, w.Top[j].Logprob, w.Top[j].Token)
				return
			}
			worst = max(worst, d)
		}
	}
	if len(got.Logprobs) == 0 && len(got.Tokens) > 0 {
		t.Errorf("%s: the runner returned no log probabilities although the requests asked for them", what)
	}
	t.Logf("%s: %d tokens agree, max |logprob diff| %.3g", what, len(got.Tokens), worst)
}

func (s *Suite) close(got, want float32) (float64, bool) {
	d := math.Abs(float64(got) - float64(want))
	if math.IsNaN(d) {
		return d, false
	}
	return d, d <= s.Opts.Tolerance*(1+math.Abs(float64(want)))
}
