package serve

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/engine/enginetest"
	"github.com/resin-llm/resin/core/tokenizer"
)

// deadRank is a step error that is permanent, as core/dist/launch's ExitError is.
type deadRank struct{}

func (deadRank) Error() string   { return "launch: worker rank 1 (pid 4242) exited: signal: killed" }
func (deadRank) Permanent() bool { return true }

// dyingRunner is the test runner whose steps fail once die is set: permanently (a dead
// rank) or, with once, as a step that failed alone.
type dyingRunner struct {
	*enginetest.Runner
	die  atomic.Bool
	once atomic.Bool
}

func (r *dyingRunner) Execute(ctx context.Context, p *engine.BatchPlan) (engine.StepResult, error) {
	if r.die.Load() {
		if r.once.Load() {
			r.die.Store(false)
			return engine.StepResult{}, errors.New("a step that failed once")
		}
		return engine.StepResult{}, fmt.Errorf("the step: %w", deadRank{})
	}
	return r.Runner.Execute(ctx, p)
}

// TestRunnerDeadStopsServer: a step error that is permanent (a dead rank of a parallel
// group) makes /health answer 503 naming it, new requests 503 runner_dead naming it, and
// Serve return an error naming it after draining (the process exits non-zero). Before,
// /health answered ok and every request failed with a 500 while the server ran on. A
// step that fails once leaves the server healthy.
func TestRunnerDeadStopsServer(t *testing.T) {
	var dr *dyingRunner
	h := newHarness(t, harnessOpts{wrap: func(r *enginetest.Runner, _ *tokenizer.Tokenizer, _ int32) engine.Runner {
		dr = &dyingRunner{Runner: r}
		return dr
	}})
	// Serve runs on its own listener (it stops once drained, with no request running);
	// the requests go to the same server through h's httptest one.
	_, shutdown, served := h.serveListener()
	defer shutdown()
	post := func() (int, string) {
		code, body := h.post("/v1/completions", map[string]any{"prompt": "hello", "max_tokens": 3})
		return code, string(body)
	}
	health := func() (int, string) {
		resp, err := http.Get(h.ts.URL + "/health")
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, readAll(t, resp)
	}
	if code, body := post(); code != 200 {
		t.Fatalf("healthy runner: %d %s", code, body)
	}
	dr.once.Store(true)
	dr.die.Store(true)
	if code, body := post(); code != 500 {
		t.Fatalf("a step that failed once: %d %s, want 500", code, body)
	}
	if code, body := health(); code != 200 || h.eng.Err() != nil {
		t.Fatalf("after a step that failed once: /health %d %s, Err %v; want ok", code, body, h.eng.Err())
	}

	dr.once.Store(false)
	dr.die.Store(true)
	if code, body := post(); code != 500 || !strings.Contains(body, "worker rank 1") {
		t.Fatalf("the step on a dead rank: %d %s, want 500 naming rank 1", code, body)
	}
	if code, body := health(); code != 503 || !strings.Contains(body, `"unhealthy"`) || !strings.Contains(body, "worker rank 1") {
		t.Fatalf("/health after a dead rank: %d %s, want 503 unhealthy naming rank 1", code, body)
	}
	if code, body := post(); code != 503 || !strings.Contains(body, "runner_dead") || !strings.Contains(body, "worker rank 1") {
		t.Fatalf("a request after a dead rank: %d %s, want 503 runner_dead naming rank 1", code, body)
	}
	err := <-served
	if err == nil || !errors.As(err, new(deadRank)) || !strings.Contains(err.Error(), "failed for good") {
		t.Fatalf("Serve returned %v, want the dead rank's error", err)
	}
}
