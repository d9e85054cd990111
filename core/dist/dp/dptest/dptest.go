// Package dptest holds the checks that DP-attention tests share: core/dist/dp's and each
// model's (a model's data-parallel ranks must give every request one engine's tokens).
package dptest

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/dist/dp"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
)

// Collect returns s's tokens, failing t on a stream error or after 2 minutes.
func Collect(t testing.TB, s *engine.Stream) []int32 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	toks, ev, err := s.Collect(ctx)
	if err != nil || ev.Err != nil {
		t.Fatalf("%s: %v %v", s.ID(), err, ev.Err)
	}
	return toks
}

// RunHeld submits reqs[0] to c, waits until reached is closed (a gate in the ranks' step
// holds that request's rank there), submits the rest, closes release, and checks that
// every request gives want[its ID]. It returns the rank each request ran on.
func RunHeld(t testing.TB, c *dp.Coordinator, reqs []engine.Request, reached <-chan struct{}, release chan<- struct{}, want map[string][]int32) map[string]int {
	t.Helper()
	ctx := context.Background()
	first, r0, err := c.SubmitRank(ctx, reqs[0])
	if err != nil {
		t.Fatal(err)
	}
	// The group dies instead (a broken exchange, a failed step): fail with its error
	// rather than wait for a gate the held rank never reaches.
	select {
	case <-reached:
	case <-c.Dead():
		t.Fatalf("the dp group died before the held step: %v", c.Err())
	case <-time.After(2 * time.Minute):
		t.Fatalf("the held rank did not reach its gate in 2 minutes (group error: %v)", c.Err())
	}
	streams := map[string]*engine.Stream{reqs[0].ID: first}
	ranks := map[string]int{reqs[0].ID: r0}
	for _, q := range reqs[1:] {
		s, r, err := c.SubmitRank(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		streams[q.ID], ranks[q.ID] = s, r
	}
	close(release)
	for _, q := range reqs {
		if got := Collect(t, streams[q.ID]); !slices.Equal(got, want[q.ID]) {
			t.Errorf("%s on rank %d: %v, one engine %v", q.ID, ranks[q.ID], got, want[q.ID])
		}
	}
	return ranks
}

// Within runs f and fails t when it has not returned after d (a close or stop that hangs:
// the goroutine is left behind, the test ends).
func Within(t testing.TB, d time.Duration, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("%s did not return within %v", what, d)
	}
}

// Requests are the DP tests' requests over a vocabulary of vocab tokens: greedy, seeded
// and greedy again, prompts of uneven lengths (9, 6 and 13 tokens). CheckProcesses and
// CheckMatchesSingleEngine route the second, "seeded", to the rank without work.
func Requests(vocab int) []engine.Request {
	prompt := func(n, seed int) []int32 {
		p := make([]int32, n)
		for i := range p {
			p[i] = int32((seed*31 + i*17) % vocab)
		}
		return p
	}
	return []engine.Request{
		{ID: "greedy", Prompt: prompt(9, 1), Sampling: engine.SamplingParams{MaxTokens: 10, IgnoreEOS: true}},
		{ID: "seeded", Prompt: prompt(6, 2), Sampling: engine.SamplingParams{MaxTokens: 7, Temperature: 0.9, Seed: 11, HasSeed: true, IgnoreEOS: true}},
		{ID: "greedy2", Prompt: prompt(13, 3), Sampling: engine.SamplingParams{MaxTokens: 5, IgnoreEOS: true}},
	}
}

// Want is what one engine on r and pool gives each of reqs, run one after another: the
// tokens every DP layout must give.
func Want(t testing.TB, r engine.Runner, pool *kvslab.Pool, reqs []engine.Request) map[string][]int32 {
	t.Helper()
	e, err := engine.New(r, engine.Config{Pool: pool, MaxBatchTokens: 16})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	defer func() {
		e.Close()
		cancel()
		<-done
	}()
	want := map[string][]int32{}
	for _, q := range reqs {
		s, err := e.Submit(context.Background(), q)
		if err != nil {
			t.Fatal(err)
		}
		want[q.ID] = Collect(t, s)
	}
	return want
}
