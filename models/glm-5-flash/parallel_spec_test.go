package glm5flash

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/cpurunner"
	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/dist/lockstep"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kernels/ref"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/core/runnertest"
)

// mtpGroup opens the tiny model drafting drafts tokens per step in layout l over
// goroutine ranks (the random weights built once), and returns the engine's runner and
// every rank's runner and pool (rank 0's first), and stop, which closes the group once
// every rank has run its last step and draft (the test's cleanup calls it too).
func mtpGroup(t *testing.T, l Layout, drafts int) (engine.Runner, []*TextRunner, []*kvslab.Pool, func()) {
	t.Helper()
	dir := tinyDir(t)
	c, err := LoadTextConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	whole, err := randomWeights(dir, c, tinyOpts.Seed)
	if err != nil {
		t.Fatal(err)
	}
	opts := tinyOpts
	opts.Drafts, opts.CacheBytes = drafts, 16<<20
	rs, pools := make([]*TextRunner, l.Size()), make([]*kvslab.Pool, l.Size())
	g, err := lockstep.StartInProcess(l.Size(), dist.Options{Timeout: 30 * time.Second}, func(rank int, data dist.Communicator) (lockstep.Rank, error) {
		r, pool, err := openRank(dir, opts, l, data, whole)
		if err != nil {
			return lockstep.Rank{}, err
		}
		rs[rank], pools[rank] = r, pool
		return r.LockstepRank(rank, pool), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	stop := func() {
		if err := g.Close(); err != nil {
			t.Error(err)
		}
	}
	t.Cleanup(stop) // Close is idempotent
	return cpurunner.New(rs[0].Info(), g.Leader()), rs, pools, stop
}

// arena returns the bytes of a host pool.
func arena(t *testing.T, pool *kvslab.Pool) []byte {
	t.Helper()
	a, ok := pool.Arena().(kvslab.HostMemory)
	if !ok {
		t.Fatal("not a host pool")
	}
	return a.Bytes(0, a.Size())
}

// TestMTPParallelEqualsOneRank runs MTP speculative decoding through the engine under
// TP=2, EP=2 (all-to-all), TP=2 × EP=2 and TP=2 × EP=4 (own drafts only), with the
// split MTP layer's own drafts and with
// drafts forced right but at every third position (accepted and rejected drafts at every
// offset of the pools and blocks, chained three deep): every request's greedy tokens
// equal plain greedy decoding on one rank, with log probabilities within 1e-5 (a
// follower that did not put back its KDA heads' states for a rejected draft would change
// every later token); every rank proposes the drafts one rank's MTP runner proposes at
// every position; under EP (whose cache is replicated: under TP each rank's KDA state
// holds its own heads) every rank's whole cache pool ends with rank 0's bytes. Seeded
// sampling at temperature 0.8 under TP=2 gives one rank's tokens too.
func TestMTPParallelEqualsOneRank(t *testing.T) {
	m := tinyTextModel(t)
	v := m.Config.VocabSize
	prompts := specPrompts(v)
	greedy := engine.SamplingParams{MaxTokens: 16, IgnoreEOS: true, Logprobs: true}
	seeded := engine.SamplingParams{MaxTokens: 12, IgnoreEOS: true, Temperature: 0.8, Seed: 3, HasSeed: true}
	const budget = 13 // chunked prefills beside decodes
	type ref1 struct {
		outs []runnertest.Output
		full map[int][]int32
	}
	plain := map[float32]ref1{}
	for _, sp := range []engine.SamplingParams{greedy, seeded} {
		r := NewTextRunner(m, 8, 512)
		pool, err := r.NewPool(16 << 20)
		if err != nil {
			t.Fatal(err)
		}
		outs, _ := generateAll(t, r, pool, prompts, sp, budget)
		full := map[int][]int32{}
		for i, p := range prompts {
			full[len(p)] = append(slices.Clone(p), outs[i].Tokens...)
		}
		plain[sp.Temperature] = ref1{outs, full}
	}
	force := func(full map[int][]int32) func(promptLen, pos, j int, logits []float32) int32 {
		return func(promptLen, pos, _ int, logits []float32) int32 {
			seq := full[promptLen]
			if pos >= len(seq) || pos%3 == 0 {
				return (int32(ref.Argmax(logits)) + 1) % int32(v)
			}
			return seq[pos]
		}
	}
	type at struct{ promptLen, pos int }
	record := func(seen map[at]int32) func(promptLen, pos, j int, logits []float32) int32 {
		return func(promptLen, pos, _ int, logits []float32) int32 {
			d := int32(max(ref.Argmax(logits), 0))
			seen[at{promptLen, pos}] = d
			return d
		}
	}
	oneRankDrafts := map[int]map[at]int32{}
	for _, k := range []int{1, 3} {
		r, pool := mtpTextRunner(t, m, k)
		oneRankDrafts[k] = map[at]int32{}
		r.forceDraft = record(oneRankDrafts[k])
		generateAll(t, r, pool, prompts, greedy, budget)
	}
	for _, tc := range []struct {
		l      Layout
		drafts int
		forced bool
		sp     engine.SamplingParams
	}{
		{Layout{TP: 2}, 1, false, greedy},
		{Layout{TP: 2}, 3, true, greedy},
		{Layout{TP: 2}, 3, true, seeded},
		{Layout{EP: 2, Dispatch: DispatchAllToAll}, 3, false, greedy},
		{Layout{EP: 2, Dispatch: DispatchAllToAll}, 3, true, greedy},
		{Layout{TP: 2, EP: 2}, 3, true, greedy},
		{Layout{TP: 2, EP: 4}, 3, false, greedy}, // two tp groups drafting the same tokens
	} {
		name := fmt.Sprintf("tp=%d ep=%d dispatch=%d drafts=%d forced=%v T=%g", tc.l.TP, tc.l.EP, tc.l.Dispatch, tc.drafts, tc.forced, tc.sp.Temperature)
		t.Run(name, func(t *testing.T) {
			want := plain[tc.sp.Temperature]
			g, rs, pools, stop := mtpGroup(t, tc.l, tc.drafts)
			seen := make([]map[at]int32, len(rs))
			for k, r := range rs {
				if tc.forced {
					r.forceDraft = force(want.full) // every rank proposes the same drafts
				} else {
					seen[k] = map[at]int32{}
					r.forceDraft = record(seen[k])
				}
			}
			got, c := generateAll(t, g, pools[0], prompts, tc.sp, budget)
			for i := range prompts {
				if !slices.Equal(got[i].Tokens, want.outs[i].Tokens) {
					t.Fatalf("prompt of %d tokens: %v with MTP under the layout, %v on one rank without", len(prompts[i]), got[i].Tokens, want.outs[i].Tokens)
				}
				for j, lp := range got[i].Logprobs {
					if d := float64(lp.Logprob - want.outs[i].Logprobs[j].Logprob); d > 1e-5 || d < -1e-5 {
						t.Fatalf("prompt %d token %d: logprob %g, want %g", i, j, lp.Logprob, want.outs[i].Logprobs[j].Logprob)
					}
				}
			}
			switch {
			case c.DraftsProposed == 0:
				t.Fatal("no drafts proposed")
			case tc.forced && (c.DraftsAccepted == 0 || c.DraftsAccepted == c.DraftsProposed):
				t.Fatalf("forced drafts: %d of %d accepted, want some rejected", c.DraftsAccepted, c.DraftsProposed)
			}
			stop() // every follower has run its last draft once the group is closed
			for k := range seen {
				if seen[k] != nil && !maps.Equal(seen[k], oneRankDrafts[tc.drafts]) {
					t.Fatalf("rank %d proposed %d drafts %v, one rank's MTP runner %d: %v", k, len(seen[k]), seen[k], len(oneRankDrafts[tc.drafts]), oneRankDrafts[tc.drafts])
				}
			}
			if tc.l.TP <= 1 {
				a0 := arena(t, pools[0])
				for r := 1; r < len(pools); r++ {
					if a := arena(t, pools[r]); !bytes.Equal(a, a0) {
						i := 0
						for i < len(a) && a[i] == a0[i] {
							i++
						}
						t.Fatalf("rank %d's cache pool differs from rank 0's at byte %d of %d", r, i, len(a))
					}
				}
			}
			t.Logf("%d drafts, %d accepted", c.DraftsProposed, c.DraftsAccepted)
		})
	}
}

// TestMTPParallelProcesses: TP=2 with rank 1 in a child process (shared memory), every
// rank drafting 3 tokens per step from its part of the MTP layer (the step results reach
// the child by broadcast), gives plain greedy decoding's tokens through the engine; the
// random layer's drafts are nearly all rejected, so the child puts back its KDA heads'
// states at every offset; the child then stops cleanly (its exit is checked at cleanup;
// a 2-minute context bounds it).
func TestMTPParallelProcesses(t *testing.T) {
	m := tinyTextModel(t)
	prompts := specPrompts(m.Config.VocabSize)[:3]
	sp := engine.SamplingParams{MaxTokens: 12, IgnoreEOS: true}
	r := NewTextRunner(m, 8, 512)
	pool, err := r.NewPool(16 << 20)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := generateAll(t, r, pool, prompts, sp, 13)
	lead, ppool, info := processLeader(t, Layout{TP: 2}, 3)
	got, c := generateAll(t, cpurunner.New(info, lead), ppool, prompts, sp, 13)
	for i := range prompts {
		if !slices.Equal(got[i].Tokens, want[i].Tokens) {
			t.Fatalf("prompt of %d tokens: %v with MTP over processes, %v on one rank without", len(prompts[i]), got[i].Tokens, want[i].Tokens)
		}
	}
	if c.DraftsProposed == 0 {
		t.Fatal("no drafts proposed")
	}
	t.Logf("%d drafts, %d accepted", c.DraftsProposed, c.DraftsAccepted)
}
