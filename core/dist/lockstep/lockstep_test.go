package lockstep

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/engine"
)

// plan is a one-sequence plan of n tokens at step step, with a logits row for the last.
func plan(step uint64, n int) *engine.BatchPlan {
	p := &engine.BatchPlan{Step: step, QueryStart: []int32{0, int32(n)}, LogitsStart: []int32{0, 1}, ReqIDs: []uint64{1},
		Computed: []int32{0}, Scheduled: []int32{int32(n)}, PromptLen: []int32{int32(n)}, NumDrafts: []int32{0},
		Temperature: []float32{0}, TopP: []float32{0}, TopK: []int32{0}, MinP: []float32{0}, Seed: []uint64{0}, Logprobs: []int32{-1},
		LogitsIndices: []int32{int32(n - 1)}}
	for i := range n {
		p.Tokens = append(p.Tokens, int32(i+1))
		p.Positions = append(p.Positions, int32(i))
	}
	return p
}

// TestInProcess: every rank runs every plan rank 0 forwards, in order and with its
// tokens; a plan rank 0's check refuses reaches no rank; a follower's failure comes back
// from rank 0's next step; Close stops the followers.
func TestInProcess(t *testing.T) {
	const size = 3
	var mu sync.Mutex
	seen := make([][]uint64, size)
	g, err := StartInProcess(size, dist.Options{Timeout: 5 * time.Second}, func(rank int, data dist.Communicator) (Rank, error) {
		fwd := func(p *engine.BatchPlan, logits []float32) error {
			mu.Lock()
			seen[rank] = append(seen[rank], p.Step)
			mu.Unlock()
			if len(p.Tokens) != int(p.Step) || len(logits) != 4 {
				return errors.New("the plan came garbled")
			}
			if rank == 2 && p.Step == 4 {
				return errors.New("rank 2 fails step 4")
			}
			// Every rank meets in a collective, as a model's forward does.
			return data.Barrier()
		}
		check := func(p *engine.BatchPlan, logits []float32) error {
			if p.Step == 2 {
				return errors.New("refused")
			}
			return nil
		}
		return Rank{Forward: fwd, Check: check, Vocab: 4}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	logits := make([]float32, 4)
	if err := g.Forward(plan(1, 1), logits); err != nil {
		t.Fatal(err)
	}
	if err := g.Forward(plan(2, 2), logits); err == nil || err.Error() != "refused" {
		t.Fatalf("step 2: %v, want the check's refusal", err)
	}
	if err := g.Forward(plan(3, 3), logits); err != nil {
		t.Fatal(err)
	}
	err = g.Forward(plan(4, 4), logits)
	if err == nil || !strings.Contains(err.Error(), "rank 2 fails step 4") {
		t.Fatalf("step 4: %v, want rank 2's failure", err)
	}
	if err := g.Close(); err == nil || !strings.Contains(err.Error(), "rank 2") {
		t.Fatalf("close: %v, want rank 2's failure reported", err)
	}
	for r, want := range [][]uint64{{1, 3, 4}, {1, 3, 4}, {1, 3, 4}} {
		if len(seen[r]) != len(want) {
			t.Fatalf("rank %d ran steps %v, want %v", r, seen[r], want)
		}
		for i := range want {
			if seen[r][i] != want[i] {
				t.Fatalf("rank %d ran steps %v, want %v", r, seen[r], want)
			}
		}
	}
}

// TestOpenFails: an opener's error names its rank and starts nothing.
func TestOpenFails(t *testing.T) {
	_, err := StartInProcess(2, dist.Options{Timeout: time.Second}, func(rank int, data dist.Communicator) (Rank, error) {
		if rank == 1 {
			return Rank{}, errors.New("no weights")
		}
		return Rank{Forward: func(*engine.BatchPlan, []float32) error { return nil }}, nil
	})
	if err == nil || !strings.Contains(err.Error(), "rank 1: no weights") {
		t.Fatalf("%v, want rank 1's error", err)
	}
}

// TestDraftResult: with drafting ranks, rank 0's Draft broadcasts the step's result and
// every follower's Draft gets it, for the plan it belongs to, and meets rank 0 in a
// collective; rank 0's NumNextDrafts are its own.
func TestDraftResult(t *testing.T) {
	const size = 3
	var mu sync.Mutex
	got := make([][]string, size)
	g, err := StartInProcess(size, dist.Options{Timeout: 5 * time.Second}, func(rank int, data dist.Communicator) (Rank, error) {
		fwd := func(p *engine.BatchPlan, logits []float32) error { return data.Barrier() }
		draft := func(p *engine.BatchPlan, res *engine.StepResult) error {
			mu.Lock()
			got[rank] = append(got[rank], fmt.Sprintf("step %d of %d tokens: accepted %v tokens %v", p.Step, len(p.Tokens), res.Accepted, res.Tokens))
			mu.Unlock()
			res.NumNextDrafts[0] = int32(rank + 1)
			return data.Barrier()
		}
		return Rank{Forward: fwd, Draft: draft, MaxDrafts: 2, Vocab: 4}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	l := g.Leader()
	if l.MaxDrafts() != 2 {
		t.Fatalf("MaxDrafts %d, want 2", l.MaxDrafts())
	}
	logits := make([]float32, 4)
	for step := uint64(1); step <= 3; step++ {
		if err := l.Forward(plan(step, int(step)), logits); err != nil {
			t.Fatal(err)
		}
		res := engine.StepResult{}
		res.Reset(1)
		res.Accepted[0] = int32(step)
		for k := range step {
			res.Tokens = append(res.Tokens, int32(10*step+k))
		}
		if err := l.Draft(plan(step, int(step)), &res); err != nil {
			t.Fatal(err)
		}
		if res.NumNextDrafts[0] != 1 {
			t.Fatalf("rank 0's result holds NumNextDrafts %d, want its own 1", res.NumNextDrafts[0])
		}
	}
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	want := []string{"step 1 of 1 tokens: accepted [1] tokens [10]", "step 2 of 2 tokens: accepted [2] tokens [20 21]", "step 3 of 3 tokens: accepted [3] tokens [30 31 32]"}
	for r := range size {
		if !slices.Equal(got[r], want) {
			t.Errorf("rank %d drafted %q, want %q", r, got[r], want)
		}
	}
}

// TestResultRefused: a step result reaches a follower that does not draft, or arrives
// without its plan, or garbled: a clear error, not a silent step.
func TestResultRefused(t *testing.T) {
	res := engine.StepResult{Accepted: []int32{1}, Tokens: []int32{5}}
	for _, tc := range []struct {
		name  string
		plan  bool
		draft Draft
		msg   []byte
		want  string
	}{
		{"no drafter", true, nil, appendResult(nil, 1, &res), "cannot use"},
		{"no plan", false, func(*engine.BatchPlan, *engine.StepResult) error { return nil }, appendResult(nil, 1, &res), "cannot use"},
		{"another step", true, func(*engine.BatchPlan, *engine.StepResult) error { return nil }, appendResult(nil, 2, &res), "result of step 2 after the plan of step 1"},
		{"truncated", true, func(*engine.BatchPlan, *engine.StepResult) error { return nil }, appendResult(nil, 1, &res)[:12], "truncated"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			comms, err := dist.NewInProcess(2, dist.Options{Timeout: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer comms[0].Close()
			defer comms[1].Close()
			done := make(chan error, 1)
			go func() {
				done <- follow(comms[1], func(*engine.BatchPlan) error { return nil }, tc.draft)
			}()
			if tc.plan {
				var msg []byte
				if err := Broadcast(comms[0], plan(1, 1), &msg); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := comms[0].Broadcast(tc.msg, 0); err != nil {
				t.Fatal(err)
			}
			err = <-done
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("follower returned %v, want an error saying %q", err, tc.want)
			}
		})
	}
}
