package engine_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/engine/enginetest"
)

// harness runs an engine over a test runner until the test ends.
type harness struct {
	t      *testing.T
	e      *engine.Engine
	r      *enginetest.Runner
	cancel context.CancelFunc
	done   chan error
}

func start(t *testing.T, rc enginetest.Config, cfg engine.Config) *harness {
	t.Helper()
	r, err := enginetest.New(rc)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Pool = r.Pool()
	e, err := engine.New(r, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h := &harness{t: t, e: e, r: r, cancel: cancel, done: make(chan error, 1)}
	go func() { h.done <- e.Run(ctx) }()
	t.Cleanup(h.stop)
	return h
}

func (h *harness) stop() {
	h.cancel()
	<-h.done
	h.done <- nil // later stops return at once
}

// generate submits and collects one request.
func (h *harness) generate(req engine.Request) ([]int32, engine.Event) {
	h.t.Helper()
	st, err := h.e.Submit(context.Background(), req)
	if err != nil {
		h.t.Fatalf("submit %q: %v", req.ID, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	toks, ev, err := st.Collect(ctx)
	if err != nil {
		h.t.Fatalf("collect %q: %v", req.ID, err)
	}
	return toks, ev
}

// checkWhole stops the engine and checks the pool's invariants and that it is whole
// once the prefix cache is cleared.
func (h *harness) checkWhole() {
	h.t.Helper()
	h.stop()
	if err := h.r.Err(); err != nil {
		h.t.Fatalf("runner saw: %v", err)
	}
	p := h.r.Pool()
	if err := p.Check(); err != nil {
		h.t.Fatalf("pool check: %v", err)
	}
	if n := p.OpenSeqs(); n != 0 {
		h.t.Fatalf("%d sequences still open", n)
	}
	p.ClearCache()
	if !p.Whole() {
		h.t.Fatalf("pool not whole after clearing the cache: %+v", p.Stats())
	}
}

func prompt(seed, n int) []int32 {
	out := make([]int32, n)
	x := uint64(seed)*7919 + 1
	for i := range out {
		x = x*6364136223846793005 + 1442695040888963407
		out[i] = int32(x>>33) % 200
	}
	return out
}

func greedy() engine.SamplingRow { return engine.SamplingRow{Logprobs: -1} }

func TestGenerateMatchesReference(t *testing.T) {
	h := start(t, enginetest.Config{}, engine.Config{})
	for i, n := range []int{1, 5, 16, 17, 40} {
		p := prompt(i, n)
		toks, ev := h.generate(engine.Request{Prompt: p, Sampling: engine.SamplingParams{MaxTokens: 20}})
		want := enginetest.Reference(256, p, 20, greedy())
		if !slices.Equal(toks, want) {
			t.Fatalf("prompt %d: got %v, want %v", n, toks, want)
		}
		if ev.Finish != engine.FinishLength || ev.Usage.CompletionTokens != 20 || ev.Usage.PromptTokens != n {
			t.Fatalf("prompt %d: terminal %+v", n, ev)
		}
	}
	h.checkWhole()
}

func TestChunkedPrefillEqualsOneShot(t *testing.T) {
	p := prompt(1, 300)
	want := enginetest.Reference(256, p, 24, greedy())
	for _, budget := range []int{7, 64, 1000} {
		h := start(t, enginetest.Config{}, engine.Config{MaxBatchTokens: budget})
		toks, _ := h.generate(engine.Request{Prompt: p, Sampling: engine.SamplingParams{MaxTokens: 24}})
		if !slices.Equal(toks, want) {
			t.Fatalf("budget %d: got %v, want %v", budget, toks, want)
		}
		steps, _ := h.r.Steps()
		if budget == 7 && steps < 300/7 {
			t.Fatalf("budget 7 ran only %d steps: prefill was not chunked", steps)
		}
		h.checkWhole()
	}
}
