package engine_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/engine/enginetest"
)

// refusing is enginetest's runner that refuses prompts holding token 5.
type refusing struct{ *enginetest.Runner }

func (refusing) CheckPrompt(p []int32) error {
	if i := slices.Index(p, 5); i >= 0 {
		return fmt.Errorf("token 5 at position %d is not supported", i)
	}
	return nil
}

// A PromptChecker runner's refusal fails that request at Submit with ErrInvalidRequest
// and the checker's reason, while a request already running goes on to its end.
func TestPromptCheckerRefusesOneRequest(t *testing.T) {
	r, err := enginetest.New(enginetest.Config{})
	if err != nil {
		t.Fatal(err)
	}
	e, ctx := runEngine(t, refusing{r}, engine.Config{Pool: r.Pool()})
	ok, err := e.Submit(ctx, engine.Request{Prompt: []int32{1, 2, 3}, Sampling: engine.SamplingParams{MaxTokens: 6, IgnoreEOS: true}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.Submit(ctx, engine.Request{Prompt: []int32{1, 5, 3}, Sampling: engine.SamplingParams{MaxTokens: 6}})
	if !errors.Is(err, engine.ErrInvalidRequest) || !strings.Contains(err.Error(), "token 5 at position 1") {
		t.Fatalf("Submit of a refused prompt: %v, want ErrInvalidRequest naming the token", err)
	}
	toks, ev, err := ok.Collect(ctx)
	if err != nil || ev.Finish != engine.FinishLength || len(toks) != 6 {
		t.Fatalf("the other request: %d tokens, finish %v (%v, %v)", len(toks), ev.Finish, ev.Err, err)
	}
}

// Config.CheckPrompt refuses as a PromptChecker runner does, for a runner that is none (a
// wrapped one), and other prompts still run.
func TestConfigCheckPromptRefuses(t *testing.T) {
	r, err := enginetest.New(enginetest.Config{})
	if err != nil {
		t.Fatal(err)
	}
	e, ctx := runEngine(t, r, engine.Config{Pool: r.Pool(), CheckPrompt: refusing{r}.CheckPrompt})
	if _, err := e.Submit(ctx, engine.Request{Prompt: []int32{1, 5, 3}, Sampling: engine.SamplingParams{MaxTokens: 6}}); !errors.Is(err, engine.ErrInvalidRequest) || !strings.Contains(err.Error(), "token 5 at position 1") {
		t.Fatalf("Submit of a prompt Config.CheckPrompt refuses: %v, want ErrInvalidRequest naming the token", err)
	}
	ok, err := e.Submit(ctx, engine.Request{Prompt: []int32{1, 2, 3}, Sampling: engine.SamplingParams{MaxTokens: 2, IgnoreEOS: true}})
	if err != nil {
		t.Fatal(err)
	}
	if toks, _, err := ok.Collect(ctx); err != nil || len(toks) != 2 {
		t.Fatalf("an accepted prompt: %d tokens (%v)", len(toks), err)
	}
}

// runEngine starts an engine of r and cfg, its loop stopped when the test ends, and
// returns it with the context its requests run in.
func runEngine(t *testing.T, r engine.Runner, cfg engine.Config) (*engine.Engine, context.Context) {
	t.Helper()
	e, err := engine.New(r, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return e, ctx
}
