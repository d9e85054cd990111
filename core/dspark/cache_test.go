package dspark

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/cpurunner"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
)

// pagedRun runs the prompts one after another (rounds: in turn, so a later one can hit
// the prefix cache of an earlier one) or all at once, on a Speculator bound to a pool of
// bytes, and returns their tokens, the traced verifications per request, and the counters.
func pagedRun(t *testing.T, d *Drafter, prompts [][]int32, sp engine.SamplingParams, inTurn bool, bytes int64) ([][]int32, [][]TraceEntry, engine.Counters) {
	t.Helper()
	spec := NewSpeculator(toyTarget{vocab: 32, hidden: 16}, d, 0, 0)
	traces := map[uint64][]TraceEntry{}
	spec.Trace = func(e TraceEntry) { traces[e.Request] = append(traces[e.Request], e) }
	info := toyInfo()
	info.CacheGroups = append(info.CacheGroups, d.CacheGroup(info.CacheGroups[0].PageTokens))
	pool, err := engine.NewHostPool(info.CacheGroups, bytes)
	if err != nil {
		t.Fatal(err)
	}
	if err := spec.Bind(pool, 1); err != nil {
		t.Fatal(err)
	}
	e, err := engine.New(cpurunner.New(info, spec), engine.Config{Pool: pool, MaxBatchTokens: 256, MaxSeqs: 8})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	defer func() { e.Close(); cancel(); <-done }()
	out := make([][]int32, len(prompts))
	var ids []uint64
	var streams []*engine.Stream
	collect := func(i int, s *engine.Stream) {
		toks, ev, err := s.Collect(ctx)
		if err != nil || ev.Err != nil {
			t.Fatalf("request %d: %v %v", i, err, ev.Err)
		}
		out[i] = toks
	}
	before := map[uint64]bool{}
	for i, p := range prompts {
		s, err := e.Submit(ctx, engine.Request{Prompt: p, Sampling: sp})
		if err != nil {
			t.Fatal(err)
		}
		streams = append(streams, s)
		if inTurn {
			collect(i, s)
			// The request's id is the one traced that was not before.
			for id := range traces {
				if !before[id] {
					ids = append(ids, id)
					before[id] = true
				}
			}
			if len(ids) != i+1 {
				t.Fatalf("request %d was not drafted (%d requests traced)", i, len(ids))
			}
		}
	}
	if !inTurn {
		for i, s := range streams {
			collect(i, s)
		}
		return out, nil, e.Counters()
	}
	tr := make([][]TraceEntry, len(prompts))
	for i, id := range ids {
		tr[i] = traces[id]
	}
	return out, tr, e.Counters()
}

// TestSpeculatorPagedPrefixHit: with the draft context in the pool's drafter group, a
// request served from the prefix cache drafts from its first step and proposes what the
// request that computed the prefix proposed (the context K/V it reads back are those
// written), its output unchanged; without the group it goes undrafted
// (TestSpeculatorPrefixHit).
func TestSpeculatorPagedPrefixHit(t *testing.T) {
	d, err := Load("testdata/vanilla", 64)
	if err != nil {
		t.Fatal(err)
	}
	prompt := []int32{1, 2, 3, 4, 5, 6, 7, 8, 9}
	sp := engine.SamplingParams{MaxTokens: 10, IgnoreEOS: true}
	want, _ := generate(t, cpurunner.New(toyInfo(), toyTarget{vocab: 32, hidden: 16}), [][]int32{prompt}, sp)
	got, tr, n := pagedRun(t, d, [][]int32{prompt, prompt}, sp, true, 1<<20)
	if n.PrefixHits == 0 {
		t.Fatal("the engine served no prefix hit")
	}
	for i := range got {
		if !slices.Equal(got[i], want[0]) {
			t.Errorf("request %d: %v with DSpark, %v without", i, got[i], want[0])
		}
	}
	for _, es := range tr {
		for j := range es {
			es[j].Request = 0 // the requests' ids differ
		}
	}
	if fmt.Sprint(tr[1]) != fmt.Sprint(tr[0]) {
		t.Errorf("the prefix-hit request verified\n%v\nthe first\n%v", tr[1], tr[0])
	}
	if tr[1][0].AnchorPosition != len(prompt) {
		t.Errorf("the prefix-hit request's first verification is at anchor %d, want %d", tr[1][0].AnchorPosition, len(prompt))
	}
	t.Logf("%d prefix-hit tokens; %d verifications each", n.PrefixHits, len(tr[0]))
}

// TestSpeculatorPagedPreempted: in a pool small enough to preempt, with prompts of mixed
// lengths sharing a head, greedy output with the paged draft context equals decoding
// without drafts, drafts accepted in part.
func TestSpeculatorPagedPreempted(t *testing.T) {
	d, err := Load("testdata/vanilla", 64)
	if err != nil {
		t.Fatal(err)
	}
	var prompts [][]int32
	for i := range 6 {
		p := []int32{1, 2, 3, 4, 5, 6, 7}
		for j := range 3 + 5*i%11 {
			p = append(p, int32((i*7+j*3)%30))
		}
		prompts = append(prompts, p)
	}
	sp := engine.SamplingParams{MaxTokens: 20, IgnoreEOS: true}
	want, _ := generate(t, cpurunner.New(toyInfo(), toyTarget{vocab: 32, hidden: 16}), prompts, sp)
	info := toyInfo()
	groups := append(info.CacheGroups, d.CacheGroup(info.CacheGroups[0].PageTokens))
	var page int64
	for _, g := range groups {
		page += int64(g.Layers) * int64(g.BytesPerToken) * int64(g.PageTokens)
	}
	got, _, n := pagedRun(t, d, prompts, sp, false, 40*page)
	for i := range want {
		if !slices.Equal(got[i], want[i]) {
			t.Errorf("request %d: %v with DSpark, %v without", i, got[i], want[i])
		}
	}
	t.Logf("preemptions %d, prefix hits %d, drafts %d/%d", n.Preemptions, n.PrefixHits, n.DraftsAccepted, n.DraftsProposed)
	if n.Preemptions == 0 || n.DraftsAccepted == 0 || n.DraftsAccepted == n.DraftsProposed {
		t.Errorf("%d preemptions, %d of %d drafts accepted: want preemptions and drafts accepted in part", n.Preemptions, n.DraftsAccepted, n.DraftsProposed)
	}
}

// TestSpeculatorBindChecksGroup: Bind refuses a group that is not the drafter's.
func TestSpeculatorBindChecksGroup(t *testing.T) {
	d, err := Load("testdata/vanilla", 64)
	if err != nil {
		t.Fatal(err)
	}
	info := toyInfo()
	pool, err := engine.NewHostPool(append(info.CacheGroups, kvslab.GroupSpec{Name: "x", Kind: kvslab.Full, Layers: 1, BytesPerToken: 8, PageTokens: 4}), 1<<16)
	if err != nil {
		t.Fatal(err)
	}
	s := NewSpeculator(toyTarget{vocab: 32, hidden: 16}, d, 0, 0)
	for _, g := range []int{1, 2, -1} {
		if err := s.Bind(pool, g); err == nil {
			t.Errorf("group %d: bound", g)
		}
	}
}
