package dp_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/dist/dp"
	"github.com/resin-llm/resin/core/engine"
)

// TestDraftingRanks drives a group of two drafting ranks as their engines do, rank 0
// busy (a step, then its draft with the sampled result) and rank 1 idle: each step both
// ranks' forwards and then both ranks' drafts run, meeting in a collective, rank 1's on
// its idle plan with an empty result, rank 0's on its plan with its engine's result, whose
// next drafts reach the engine. A drafting rank beside one that does not is refused, and
// a draft handed over after Close fails with ErrClosed.
func TestDraftingRanks(t *testing.T) {
	const size = 2
	ctl, err := dist.NewInProcess(size, dist.Options{Timeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	data, err := dist.NewInProcess(size, dist.Options{Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	seen := make([][]string, size)
	ranks := make([]dp.Rank, size)
	for r := range size {
		note := func(s string) {
			mu.Lock()
			seen[r] = append(seen[r], s)
			mu.Unlock()
		}
		ranks[r] = dp.Rank{
			Forward: func(p *engine.BatchPlan, logits []float32) error {
				note(fmt.Sprintf("forward %d tokens", p.NumTokens()))
				return data[r].Barrier()
			},
			Draft: func(p *engine.BatchPlan, res *engine.StepResult) error {
				note(fmt.Sprintf("draft %d seqs: accepted %v tokens %v", p.NumSeqs(), res.Accepted, res.Tokens))
				if p.NumSeqs() > 0 {
					res.NumNextDrafts[0] = 2
					res.Drafts = append(res.Drafts, 7, 8)
				}
				// The draft head's exchange: every rank's row count.
				all, err := data[r].AllGatherV([]byte{byte(len(res.Tokens))})
				if err == nil && len(all) != size {
					err = errors.New("the exchange lost a rank")
				}
				return err
			},
			MaxDrafts: 2, CacheGroups: 1, Ctl: ctl[r], Data: data[r],
		}
	}
	mixed := slices.Clone(ranks)
	mixed[1].Draft = nil
	if _, err := dp.NewGroup(mixed, dp.Options{}); err == nil || !strings.Contains(err.Error(), "all ranks or none") {
		t.Fatalf("a drafting rank beside one that does not: %v", err)
	}
	g, err := dp.NewGroup(ranks, dp.Options{})
	if err != nil {
		t.Fatal(err)
	}
	g.Start()
	rr := g.Runner(0)
	if rr.MaxDrafts() != 2 {
		t.Fatalf("MaxDrafts %d", rr.MaxDrafts())
	}
	for step := range 3 {
		p := &engine.BatchPlan{Step: uint64(step + 1), QueryStart: []int32{0, 1}, LogitsStart: []int32{0, 1}, ReqIDs: []uint64{1},
			Tokens: []int32{int32(step)}, Positions: []int32{int32(step)}, Computed: []int32{int32(step)}, Scheduled: []int32{1},
			PromptLen: []int32{1}, NumDrafts: []int32{0}, LogitsIndices: []int32{0}, Groups: []engine.GroupPlan{{PageTableStart: []int32{0, 0}}}}
		if err := rr.Forward(p, make([]float32, 4)); err != nil {
			t.Fatal(err)
		}
		var res engine.StepResult
		res.Reset(1)
		res.Accepted[0], res.Tokens = 1, []int32{int32(10 + step)}
		if err := rr.Draft(p, &res); err != nil {
			t.Fatal(err)
		}
		if res.NumNextDrafts[0] != 2 || !slices.Equal(res.Drafts, []int32{7, 8}) {
			t.Fatalf("step %d: the engine got drafts %v (%v)", step, res.Drafts, res.NumNextDrafts)
		}
	}
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	var res engine.StepResult
	res.Reset(1)
	if err := rr.Draft(nil, &res); !errors.Is(err, dp.ErrClosed) {
		t.Fatalf("a draft after Close: %v", err)
	}
	want := [size][]string{
		{"forward 1 tokens", "draft 1 seqs: accepted [1] tokens [10]", "forward 1 tokens", "draft 1 seqs: accepted [1] tokens [11]", "forward 1 tokens", "draft 1 seqs: accepted [1] tokens [12]"},
		{"forward 0 tokens", "draft 0 seqs: accepted [] tokens []", "forward 0 tokens", "draft 0 seqs: accepted [] tokens []", "forward 0 tokens", "draft 0 seqs: accepted [] tokens []"},
	}
	for r := range size {
		if !slices.Equal(seen[r], want[r]) {
			t.Errorf("rank %d ran %q, want %q", r, seen[r], want[r])
		}
	}
}
