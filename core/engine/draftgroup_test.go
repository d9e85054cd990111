package engine_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/engine/enginetest"
)

// TestDraftContextGroup: a runner declaring a drafter's context cache as one more group
// (DSpark's: full for Qwen3 drafters, a sliding window for DeepSeek-V4's, next to a full
// or a sliding-window target) finds, each time it drafts, the whole draft context it
// attends to in that group: every committed token's entry, those a prefix hit brought
// included, with none deferred to a later step. Requests of mixed lengths sharing a
// prompt head (prefix hits), a pool small enough to preempt, drafts accepted and
// rejected, sync and async; the output is the reference's.
func TestDraftContextGroup(t *testing.T) {
	wrong := func(pos, j int) bool { return (pos+j)%3 == 0 }
	for name, rc := range map[string]enginetest.Config{
		"full target, full draft":      {Draft: true},
		"full target, window draft":    {Draft: true, DraftWindow: 12},
		"window target, window draft":  {Window: 20, Draft: true, DraftWindow: 9},
		"window target, full draft":    {Window: 12, Draft: true, Recurrent: true},
		"window target, window mirror": {Window: 12, Mirror: true, Draft: true, DraftWindow: 24},
	} {
		for _, async := range []bool{false, true} {
			t.Run(name+map[bool]string{false: "", true: ", async"}[async], func(t *testing.T) {
				rc.MaxDrafts, rc.WrongDraft, rc.BlockTokens, rc.Pages, rc.Async = 3, wrong, 8, 16, async
				// The first plan waits until all 16 requests are in, so the pool is
				// contended (and preempts) however slowly this machine submits: under
				// -race on 2 cores the early requests could finish before the later came.
				submitted := make(chan struct{})
				var once sync.Once
				rc.OnPlan = func(*engine.BatchPlan) { once.Do(func() { <-submitted }) }
				h := start(t, rc, engine.Config{Async: async, MaxBatchTokens: 40, MaxSeqs: 8})
				shared := prompt(77, 29)
				var prompts [][]int32
				var streams []*engine.Stream
				for i := range 16 {
					p := prompt(i, 2+7*i%33)
					if i%2 == 0 {
						p = append(slices.Clone(shared), p...)
					}
					st, err := h.e.Submit(context.Background(), engine.Request{Prompt: p, Sampling: engine.SamplingParams{MaxTokens: 9 + i%5}})
					if err != nil {
						t.Fatal(err)
					}
					prompts, streams = append(prompts, p), append(streams, st)
				}
				close(submitted)
				for i, st := range streams {
					toks, ev, err := st.Collect(context.Background())
					if err != nil || ev.Finish != engine.FinishLength {
						t.Fatalf("request %d: %+v %v", i, ev, err)
					}
					if want := enginetest.Reference(256, prompts[i], 9+i%5, greedy()); !slices.Equal(toks, want) {
						t.Fatalf("request %d: %v, reference %v", i, toks, want)
					}
				}
				c := h.e.Counters()
				t.Logf("preemptions %d, prefix hits %d, drafts %d/%d", c.Preemptions, c.PrefixHits, c.DraftsAccepted, c.DraftsProposed)
				if c.PrefixHits == 0 || c.Preemptions == 0 || c.DraftsAccepted == 0 || c.DraftsAccepted == c.DraftsProposed {
					t.Fatalf("%d prefix hits, %d preemptions, %d of %d drafts accepted: want hits, preemptions and drafts both accepted and rejected", c.PrefixHits, c.Preemptions, c.DraftsAccepted, c.DraftsProposed)
				}
				h.checkWhole() // the runner's draft-context checks included
			})
		}
	}
}

// TestDraftContextCheckCatchesAMissingRow: the check above fails when one fed token's
// draft-context entry is not written where the plan says (its slot redirected to the
// sequence's previous slot), which shows it reads what the drafter would attend to.
func TestDraftContextCheckCatchesAMissingRow(t *testing.T) {
	rc := enginetest.Config{Draft: true, MaxDrafts: 2, BlockTokens: 8}
	done := false
	rc.OnPlan = func(p *engine.BatchPlan) {
		// The plan is the engine's; redirecting one slot of the draft group (group 1) in
		// the prefill of the first request is the deliberate fault.
		if !done && p.NumTokens() > 4 {
			m := p.Groups[1].SlotMapping
			m[3] = m[2]
			done = true
		}
	}
	h := start(t, rc, engine.Config{})
	st, err := h.e.Submit(context.Background(), engine.Request{Prompt: prompt(5, 12), Sampling: engine.SamplingParams{MaxTokens: 4}})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.Collect(context.Background()); err != nil {
		t.Fatal(err)
	}
	h.stop()
	if err := h.r.Err(); err == nil || !strings.Contains(err.Error(), "draft context") {
		t.Fatalf("runner error %v, want one about the draft context", err)
	}
}
