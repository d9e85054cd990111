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
