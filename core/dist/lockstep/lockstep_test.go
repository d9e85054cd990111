package lockstep

import (
	"errors"
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
