package dp_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/dist/dp"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/engine/enginetest"
	"github.com/resin-llm/resin/core/serve"
)

var _ serve.Engine = (*dp.Coordinator)(nil)

// deadWorker is a step error that is permanent, as core/dist/launch's ExitError is.
type deadWorker struct{}

func (deadWorker) Error() string   { return "launch: worker rank 1 (pid 4242) exited: signal: killed" }
func (deadWorker) Permanent() bool { return true }

// dyingRunner is the test runner whose steps fail for good once die is set.
type dyingRunner struct {
	*enginetest.Runner
	die atomic.Bool
}

func (r *dyingRunner) Execute(ctx context.Context, p *engine.BatchPlan) (engine.StepResult, error) {
	if r.die.Load() {
		return engine.StepResult{}, fmt.Errorf("the step: %w", deadWorker{})
	}
	return r.Runner.Execute(ctx, p)
}

// TestCoordinatorDeadRank: with --dp 2 (replicas), a rank whose runner fails for good
// makes the coordinator dead, as one engine is (Err names the rank and the cause, Dead is
// closed, Submit refuses with engine.ErrRunnerDead), so a server over it reports itself
// unhealthy and stops. Before, the coordinator had no Err or Dead and the server ran on.
func TestCoordinatorDeadRank(t *testing.T) {
	var runners []*dyingRunner
	var engines []*engine.Engine
	for range 2 {
		tr, err := enginetest.New(enginetest.Config{})
		if err != nil {
			t.Fatal(err)
		}
		r := &dyingRunner{Runner: tr}
		e, err := engine.New(r, engine.Config{Pool: tr.Pool(), MaxBatchTokens: 16})
		if err != nil {
			t.Fatal(err)
		}
		runners, engines = append(runners, r), append(engines, e)
	}
	c, err := dp.NewCoordinator(nil, engines)
	if err != nil {
		t.Fatal(err)
	}
	c.Start(context.Background())
	req := func(id string) engine.Request {
		return engine.Request{ID: id, Prompt: []int32{1, 2, 3}, Sampling: engine.SamplingParams{MaxTokens: 4, IgnoreEOS: true}}
	}
	run := func(id string) (int, error) {
		s, r, err := c.SubmitRank(context.Background(), req(id))
		if err != nil {
			return -1, err
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, ev, err := s.Collect(ctx)
		return r, errors.Join(err, ev.Err)
	}
	for i := range 2 { // both ranks serve
		if _, err := run(fmt.Sprint("ok", i)); err != nil {
			t.Fatal(err)
		}
	}
	if c.Err() != nil {
		t.Fatalf("healthy ranks: Err %v", c.Err())
	}
	select {
	case <-c.Dead():
		t.Fatal("healthy ranks: Dead is closed")
	default:
	}

	runners[1].die.Store(true)
	for i := 0; ; i++ { // until a request lands on rank 1 and fails there
		r, err := run(fmt.Sprint("dying", i))
		if r == 1 {
			if err == nil {
				t.Fatal("rank 1's dead runner served a request")
			}
			break
		}
		if err != nil || i > 8 {
			t.Fatalf("rank %d: %v (no request went to rank 1)", r, err)
		}
	}
	select {
	case <-c.Dead():
	case <-time.After(time.Minute):
		t.Fatal("Dead is not closed after rank 1's runner failed for good")
	}
	err = c.Err()
	if err == nil || !errors.As(err, new(deadWorker)) || !strings.Contains(err.Error(), "dp rank 1") {
		t.Fatalf("Err = %v, want rank 1's dead worker, naming dp rank 1", err)
	}
	if _, err := c.Submit(context.Background(), req("after")); !errors.Is(err, engine.ErrRunnerDead) || !strings.Contains(err.Error(), "dp rank 1") {
		t.Fatalf("Submit after rank 1 died: %v, want ErrRunnerDead naming dp rank 1", err)
	}
	if err := c.Close(); err != nil && !errors.As(err, new(deadWorker)) {
		t.Fatalf("Close: %v", err)
	}
}
