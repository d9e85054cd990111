package engine_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
)

// TestLoneRequestWithinMaxContextFits is a randomized harness over multi-group layouts
// (full, sliding-window, compressed and recurrent groups, two to four of them, pages of
// different sizes sharing small pools), random chunk sizes (MaxBatchTokens), with and
// without Async: with the prefix cache warm from earlier requests, a request of any length
// up to the scheduler's MaxContext must run to its end once it runs alone. The context cap
// promises it fits, so a FinishError (ErrCache) is a broken promise.
func TestLoneRequestWithinMaxContextFits(t *testing.T) {
	layouts := 200
	if testing.Short() {
		layouts = 40
	}
	rng := rand.New(rand.NewPCG(20, 2))
	for l := range layouts {
		groups, slabBytes, slabs := randomLayout(rng)
		maxBatch := 1 + rng.IntN(96)
		if rng.IntN(3) == 0 {
			maxBatch = 1 + rng.IntN(8)
		}
		name := fmt.Sprintf("layout%d", l)
		pool, err := kvslab.New(kvslab.Config{Groups: groups, SlabBytes: slabBytes}, mustArena(t, slabBytes*int64(slabs)))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		model := &standIn{}
		info := model.Info()
		info.MaxContext = 64 + rng.IntN(512)
		info.CacheGroups = groups
		// A third of the layouts plan each step while the previous one runs (the stand-in
		// ignores the tokens it is fed, PendingToken included).
		async := rng.IntN(3) == 0
		info.AsyncTokens = async
		s, err := engine.NewScheduler(info, engine.Config{Pool: pool, MaxBatchTokens: maxBatch, MaxSeqs: 4, Async: async})
		if err != nil {
			t.Logf("%s: %v (skipped: the pool holds no sequence)", name, err)
			continue
		}
		maxCtx := s.MaxContext()
		desc := func() string {
			return fmt.Sprintf("%s: groups %+v, %d slabs of %d bytes, max batch tokens %d, async %v, max context %d", name, groups, slabs, slabBytes, maxBatch, async, maxCtx)
		}
		// Rounds of one request, some sharing a stem, with now and then two or three at
		// once (their pages interleave on the slabs, and so do the cached prefixes a later
		// request hits). Whoever runs alone must fit: the scheduler fails a request only
		// when there is no one left to preempt.
		stem := prompt(l, maxCtx)
		for k := range 8 {
			var outs []*recorder
			var lens [][2]int
			for j := range 1 + b2i(rng.IntN(3) == 0)*(1+rng.IntN(2)) {
				total := 2 + rng.IntN(maxCtx-1)
				plen := 1 + rng.IntN(total-1)
				var p []int32
				if rng.IntN(2) == 0 {
					p = slices.Clone(stem[:plen])
				} else {
					p = prompt(1000*l+10*k+j, plen)
				}
				o := &recorder{}
				if err := s.Add(engine.Request{ID: fmt.Sprint(k, j), Prompt: p, Sampling: engine.SamplingParams{MaxTokens: total - plen}}, o); err != nil {
					t.Fatalf("%s: request of %d+%d tokens: %v", desc(), plen, total-plen, err)
				}
				outs, lens = append(outs, o), append(lens, [2]int{plen, total - plen})
			}
			// With Async the next plan is built before the one handed out is updated.
			for p := s.Schedule(); p != nil; {
				if err := p.Validate(); err != nil {
					t.Fatalf("%s: %v", desc(), err)
				}
				next := s.Schedule() // nil without Async: p is pending
				res, err := model.Execute(context.Background(), p)
				if err := s.Update(p, res, err); err != nil {
					t.Fatal(err)
				}
				if p = next; p == nil {
					p = s.Schedule()
				}
				if err := s.CheckBookkeeping(); err != nil {
					t.Fatalf("%s: %v", desc(), err)
				}
				if err := pool.Check(); err != nil {
					t.Fatalf("%s: %v", desc(), err)
				}
			}
			for j, o := range outs {
				if len(o.finishes) != 1 || o.finishes[0] != engine.FinishLength {
					t.Fatalf("%s: round %d, request of %d prompt + %d max tokens (of %d) ended %v: %v (pool %+v)",
						desc(), k, lens[j][0], lens[j][1], len(outs), o.finishes, o.err, pool.Stats())
				}
			}
		}
		pool.ClearCache()
		if !pool.Whole() {
			t.Fatalf("%s: pool not whole: %+v", desc(), pool.Stats())
		}
	}
}

// randomLayout draws two to four cache groups of different kinds, their page geometry,
// and a pool of a few slabs.
func randomLayout(rng *rand.Rand) ([]kvslab.GroupSpec, int64, int) {
	bt := []int{4, 8, 16}[rng.IntN(3)]
	kinds := []kvslab.Kind{kvslab.Full, kvslab.SlidingWindow, kvslab.Compressed, kvslab.Recurrent}
	rng.Shuffle(len(kinds), func(i, j int) { kinds[i], kinds[j] = kinds[j], kinds[i] })
	kinds = kinds[:2+rng.IntN(3)]
	var groups []kvslab.GroupSpec
	largest := int64(0)
	for i, k := range kinds {
		g := kvslab.GroupSpec{Name: fmt.Sprintf("g%d-%s", i, k), Kind: k, Layers: 1 + rng.IntN(3),
			BytesPerToken: 2 << rng.IntN(4), PageTokens: bt}
		switch k {
		case kvslab.SlidingWindow:
			g.Window = bt + rng.IntN(4*bt)
		case kvslab.Compressed:
			g.Ratio = []int{1, 2, 4}[rng.IntN(3)]
		case kvslab.Recurrent:
			g.BytesPerToken = 64 << rng.IntN(3)
			g.Checkpoints = rng.IntN(4)
		}
		groups = append(groups, g)
		largest = max(largest, g.PageBytes())
	}
	slab := largest * int64(1+rng.IntN(4))
	return groups, slab, 3 + rng.IntN(14)
}

func mustArena(t *testing.T, n int64) *kvslab.HostArena {
	t.Helper()
	a, err := kvslab.NewHostArena(n)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// Requests that ran together leave the one that outlives them with pages spread over more
// slabs than it fills, next to their idle cached pages; that slab cannot go to another
// group while a page of the request lives there. Alone and out of pages, the request is
// started over in an emptied pool (Counters.Restarts) instead of failing: there its pages
// pack as the context cap counted them. (A case the randomized harness found.)
func TestLoneRequestStartsOverInAnEmptiedPool(t *testing.T) {
	groups := []kvslab.GroupSpec{
		{Name: "swa", Kind: kvslab.SlidingWindow, Layers: 1, BytesPerToken: 8, PageTokens: 4, Window: 14},
		{Name: "csa", Kind: kvslab.Compressed, Layers: 1, BytesPerToken: 16, PageTokens: 4, Ratio: 1},
	}
	pool, err := kvslab.New(kvslab.Config{Groups: groups, SlabBytes: 256}, mustArena(t, 6*256))
	if err != nil {
		t.Fatal(err)
	}
	model := &standIn{}
	info := model.Info()
	info.CacheGroups = groups
	s, err := engine.NewScheduler(info, engine.Config{Pool: pool, MaxBatchTokens: 9, MaxSeqs: 3})
	if err != nil {
		t.Fatal(err)
	}
	if s.MaxContext() != 80 {
		t.Fatalf("max context %d, the case needs 80", s.MaxContext())
	}
	var outs []*recorder
	for k, round := range [][][3]int{{{0, 41, 11}, {0, 7, 8}}, {{0, 22, 44}, {1, 6, 47}}} {
		for j, r := range round {
			o := &recorder{}
			if err := s.Add(engine.Request{ID: fmt.Sprint(k, j), Prompt: prompt(r[0], r[1]), Sampling: engine.SamplingParams{MaxTokens: r[2]}}, o); err != nil {
				t.Fatal(err)
			}
			outs = append(outs, o)
		}
		for p := s.Schedule(); p != nil; p = s.Schedule() {
			res, err := model.Execute(context.Background(), p)
			if err := s.Update(p, res, err); err != nil {
				t.Fatal(err)
			}
			if err := pool.Check(); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i, o := range outs {
		if len(o.finishes) != 1 || o.finishes[0] != engine.FinishLength {
			t.Fatalf("request %d ended %v: %v", i, o.finishes, o.err)
		}
	}
	if c := s.Counters(); c.Restarts == 0 {
		t.Fatalf("no restart (%d preemptions): the case no longer fragments the pool", c.Preemptions)
	}
	pool.ClearCache()
	if !pool.Whole() {
		t.Fatalf("pool not whole: %+v", pool.Stats())
	}
}

// TestStartedOverKeepsLongChunks: a request that starts over in an emptied pool
// (restartAlone) is given the largest chunk with which its own length fits, not the one
// the context cap needs: here 226 tokens in a pool whose 264-token cap needs chunks of
// 3, while 226 fit with the whole 42-token step, so it prefills in 42-token chunks (it
// took 3 at a time, and the queue waited behind it 14 times as many steps). (A case the
// randomized harness above found.)
func TestStartedOverKeepsLongChunks(t *testing.T) {
	groups := []kvslab.GroupSpec{
		{Name: "g0-sliding-window", Kind: kvslab.SlidingWindow, Layers: 2, BytesPerToken: 8, PageTokens: 8, Window: 39},
		{Name: "g1-recurrent", Kind: kvslab.Recurrent, Layers: 3, BytesPerToken: 64, PageTokens: 8},
		{Name: "g2-compressed", Kind: kvslab.Compressed, Layers: 1, BytesPerToken: 8, PageTokens: 8, Ratio: 1},
		{Name: "g3-full", Kind: kvslab.Full, Layers: 2, BytesPerToken: 16, PageTokens: 8},
	}
	pool, err := kvslab.New(kvslab.Config{Groups: groups, SlabBytes: 768}, mustArena(t, 16*768))
	if err != nil {
		t.Fatal(err)
	}
	model := &standIn{}
	info := model.Info()
	info.MaxContext, info.CacheGroups = 264, groups
	s, err := engine.NewScheduler(info, engine.Config{Pool: pool, MaxBatchTokens: 42, MaxSeqs: 4})
	if err != nil {
		t.Fatal(err)
	}
	if s.MaxContext() != 264 {
		t.Fatalf("max context %d, the case needs 264", s.MaxContext())
	}
	var outs []*recorder
	longest := 0 // the most tokens the request that started over got in one step
	for k, round := range [][]engine.Request{
		{{Prompt: prompt(3360, 264)[:120], Sampling: engine.SamplingParams{MaxTokens: 87}},
			{Prompt: prompt(3360001, 189), Sampling: engine.SamplingParams{MaxTokens: 21}}},
		{{Prompt: prompt(3360010, 206), Sampling: engine.SamplingParams{MaxTokens: 20}}},
	} {
		for j, req := range round {
			o := &recorder{}
			req.ID = fmt.Sprint(k, j)
			if err := s.Add(req, o); err != nil {
				t.Fatal(err)
			}
			outs = append(outs, o)
		}
		for p := s.Schedule(); p != nil; p = s.Schedule() {
			if k == 1 && s.Counters().Restarts > 0 {
				longest = max(longest, int(p.Scheduled[0]))
			}
			res, err := model.Execute(context.Background(), p)
			if err := s.Update(p, res, err); err != nil {
				t.Fatal(err)
			}
			if err := pool.Check(); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i, o := range outs {
		if len(o.finishes) != 1 || o.finishes[0] != engine.FinishLength {
			t.Fatalf("request %d ended %v: %v", i, o.finishes, o.err)
		}
	}
	if c := s.Counters(); c.Restarts == 0 {
		t.Fatalf("no restart (%d preemptions): the case no longer fragments the pool", c.Preemptions)
	}
	if longest != 42 {
		t.Fatalf("the request that started over got at most %d tokens a step, want the whole 42", longest)
	}
}
