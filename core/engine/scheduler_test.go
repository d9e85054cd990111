package engine_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/engine/enginetest"
)

// recorder is an Output that keeps everything it is given.
type recorder struct {
	tokens   []int32
	finishes []engine.FinishReason
	err      error
	usage    engine.Usage
}

func (o *recorder) Token(t int32, _ *engine.TokenLogprob) { o.tokens = append(o.tokens, t) }
func (o *recorder) Finish(r engine.FinishReason, err error, u engine.Usage) {
	o.finishes = append(o.finishes, r)
	o.err, o.usage = err, u
}

// direct drives a Scheduler over a test runner on the test's goroutine.
type direct struct {
	t *testing.T
	s *engine.Scheduler
	r *enginetest.Runner
}

func newDirect(t *testing.T, rc enginetest.Config, cfg engine.Config) *direct {
	t.Helper()
	r, err := enginetest.New(rc)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Pool = r.Pool()
	s, err := engine.NewScheduler(r.Info(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &direct{t: t, s: s, r: r}
}

func (d *direct) add(id string, p []int32, sp engine.SamplingParams, prio int) *recorder {
	d.t.Helper()
	o := &recorder{}
	if err := d.s.Add(engine.Request{ID: id, Prompt: p, Sampling: sp, Priority: prio}, o); err != nil {
		d.t.Fatal(err)
	}
	return o
}

// step runs one step; false when there was nothing to run.
func (d *direct) step() bool {
	p := d.s.Schedule()
	if p == nil {
		return false
	}
	res, err := d.r.Execute(context.Background(), p)
	if err := d.s.Update(p, res, err); err != nil {
		d.t.Fatal(err)
	}
	if err := d.s.CheckBookkeeping(); err != nil {
		d.t.Fatal(err)
	}
	return true
}

// run executes and applies plan p, one Schedule handed out.
func (d *direct) run(p *engine.BatchPlan) {
	d.t.Helper()
	res, err := d.r.Execute(context.Background(), p)
	if err := d.s.Update(p, res, err); err != nil {
		d.t.Fatal(err)
	}
}

func (d *direct) runAll() {
	for d.step() {
	}
	if err := d.r.Err(); err != nil {
		d.t.Fatal(err)
	}
}

func (d *direct) checkWhole() {
	d.t.Helper()
	p := d.r.Pool()
	if err := p.Check(); err != nil {
		d.t.Fatal(err)
	}
	if p.OpenSeqs() != 0 {
		d.t.Fatalf("%d sequences open", p.OpenSeqs())
	}
	p.ClearCache()
	if !p.Whole() {
		d.t.Fatalf("pool not whole: %+v", p.Stats())
	}
}

func TestPrefixHitSkipsComputedTokens(t *testing.T) {
	var computed []int32
	var seen map[uint64]bool
	rc := enginetest.Config{BlockTokens: 16, OnPlan: func(p *engine.BatchPlan) {
		for i, id := range p.ReqIDs {
			if !seen[id] {
				seen[id] = true
				computed = append(computed, p.Computed[i])
			}
		}
	}}
	seen = map[uint64]bool{}
	d := newDirect(t, rc, engine.Config{})
	base := prompt(3, 70)
	a := d.add("a", base, engine.SamplingParams{MaxTokens: 5}, 0)
	d.runAll()
	// b shares 50 tokens with a: 3 whole blocks (48 tokens) come from the cache.
	pb := append(slices.Clone(base[:50]), prompt(4, 30)...)
	b := d.add("b", pb, engine.SamplingParams{MaxTokens: 5}, 0)
	// c is a's prompt again: 4 whole blocks of prompt[:69] = 64 tokens.
	c := d.add("c", base, engine.SamplingParams{MaxTokens: 5}, 0)
	d.runAll()
	if !slices.Equal(computed, []int32{0, 48, 64}) {
		t.Fatalf("first computed lengths %v, want [0 48 64]", computed)
	}
	if b.usage.CachedTokens != 48 || c.usage.CachedTokens != 64 || a.usage.CachedTokens != 0 {
		t.Fatalf("cached tokens a=%d b=%d c=%d", a.usage.CachedTokens, b.usage.CachedTokens, c.usage.CachedTokens)
	}
	for _, x := range []struct {
		o *recorder
		p []int32
	}{{a, base}, {b, pb}, {c, base}} {
		if want := enginetest.Reference(256, x.p, 5, greedy()); !slices.Equal(x.o.tokens, want) {
			t.Fatalf("tokens %v, want %v", x.o.tokens, want)
		}
	}
	if cn := d.s.Counters(); cn.PrefixHits != 48+64 {
		t.Fatalf("prefix hits %d tokens, want 112", cn.PrefixHits)
	}
	d.checkWhole()
}

func TestPreemptionUnderSmallPoolCompletesEveryRequest(t *testing.T) {
	// 12 requests of 40+40 tokens need 5 blocks of 16 each (60 pages at once); the pool
	// has 32.
	testPreemption(t, 32, 0)
}

func TestPreemptionUnderSmallPoolSlidingWindow(t *testing.T) {
	// A 20-token window holds at most 3 blocks per sequence: 36 pages for 12 sequences.
	testPreemption(t, 24, 20)
}

func testPreemption(t *testing.T, pages, window int) {
	d := newDirect(t, enginetest.Config{BlockTokens: 16, Pages: pages, Window: window}, engine.Config{MaxBatchTokens: 128})
	var outs []*recorder
	var prompts [][]int32
	for i := 0; i < 12; i++ {
		p := prompt(10+i, 40)
		prompts = append(prompts, p)
		outs = append(outs, d.add(string(rune('a'+i)), p, engine.SamplingParams{MaxTokens: 40}, 0))
	}
	d.runAll()
	for i, o := range outs {
		if want := enginetest.Reference(256, prompts[i], 40, greedy()); !slices.Equal(o.tokens, want) {
			t.Fatalf("request %d: got %v, want %v", i, o.tokens, want)
		}
		if !slices.Equal(o.finishes, []engine.FinishReason{engine.FinishLength}) {
			t.Fatalf("request %d finishes %v", i, o.finishes)
		}
	}
	if d.s.Counters().Preemptions == 0 {
		t.Fatal("no preemption happened; the test does not exercise it")
	}
	d.checkWhole()
}

func TestRequestLargerThanPoolFails(t *testing.T) {
	// The pool holds 64 tokens: the scheduler caps the context there, so a request that
	// needs more is refused at Add rather than failing after admission.
	d := newDirect(t, enginetest.Config{BlockTokens: 16, Pages: 4}, engine.Config{})
	err := d.s.Add(engine.Request{ID: "big", Prompt: prompt(1, 100), Sampling: engine.SamplingParams{MaxTokens: 10}}, &recorder{})
	if !errors.Is(err, engine.ErrContextTooLong) {
		t.Fatalf("big: %v, want ErrContextTooLong", err)
	}
	small := d.add("small", prompt(2, 10), engine.SamplingParams{MaxTokens: 10}, 0)
	d.runAll()
	if !slices.Equal(small.finishes, []engine.FinishReason{engine.FinishLength}) || len(small.tokens) != 10 {
		t.Fatalf("small: finishes %v, %d tokens", small.finishes, len(small.tokens))
	}
	d.checkWhole()
}

func TestAbortFreesPagesImmediately(t *testing.T) {
	d := newDirect(t, enginetest.Config{BlockTokens: 16}, engine.Config{})
	o := d.add("x", prompt(1, 100), engine.SamplingParams{MaxTokens: 50}, 0)
	keep := d.add("y", prompt(2, 20), engine.SamplingParams{MaxTokens: 50}, 0)
	for i := 0; i < 3; i++ {
		d.step()
	}
	used := func() int { return d.r.Pool().Stats().Groups[0].PagesUsed }
	before := used()
	if !d.s.Abort("x") {
		t.Fatal("abort of a running request returned false")
	}
	// x held ceil(103/16) = 7 pages; they are released before any further step.
	if got := used(); got != before-7 {
		t.Fatalf("pages used %d -> %d after abort, want %d", before, got, before-7)
	}
	if !slices.Equal(o.finishes, []engine.FinishReason{engine.FinishAbort}) || !errors.Is(o.err, engine.ErrAborted) {
		t.Fatalf("aborted request: finishes %v err %v", o.finishes, o.err)
	}
	// Abort while a step is in flight: the step's result for y is dropped.
	n := len(keep.tokens)
	p := d.s.Schedule()
	res, err := d.r.Execute(context.Background(), p)
	d.s.Abort("y")
	d.s.Update(p, res, err)
	if len(keep.tokens) != n || !slices.Equal(keep.finishes, []engine.FinishReason{engine.FinishAbort}) {
		t.Fatalf("in-flight abort: %d -> %d tokens, finishes %v", n, len(keep.tokens), keep.finishes)
	}
	if d.s.Abort("y") || d.s.Abort("nobody") {
		t.Fatal("abort of a finished or unknown request returned true")
	}
	d.runAll()
	d.checkWhole()
}

func TestPriorityOrdering(t *testing.T) {
	for _, tc := range []struct {
		policy engine.Policy
		want   string
	}{{engine.PolicyFCFS, "abcd"}, {engine.PolicyPriority, "dbca"}} {
		var order []byte
		var seen = map[uint64]bool{}
		ids := map[uint64]byte{}
		rc := enginetest.Config{OnPlan: func(p *engine.BatchPlan) {
			for _, id := range p.ReqIDs {
				if !seen[id] {
					seen[id] = true
					order = append(order, ids[id])
				}
			}
		}}
		d := newDirect(t, rc, engine.Config{MaxSeqs: 1, Policy: tc.policy})
		for i, prio := range []int{5, 2, 3, 1} {
			id := byte('a' + i)
			ids[uint64(i+1)] = id // handles count from 1 in submission order
			d.add(string(id), prompt(i, 8), engine.SamplingParams{MaxTokens: 3}, prio)
		}
		d.runAll()
		if string(order) != tc.want {
			t.Fatalf("policy %d: served %q, want %q", tc.policy, order, tc.want)
		}
		d.checkWhole()
	}
}

func TestPriorityPreemptsLowestPriority(t *testing.T) {
	var highComputed []int32 // high's row in each plan; recompute after a preemption goes back
	rc := enginetest.Config{BlockTokens: 16, Pages: 12, OnPlan: func(p *engine.BatchPlan) {
		for i, id := range p.ReqIDs {
			if id == 2 { // handles count from 1 in submission order
				highComputed = append(highComputed, p.Computed[i])
			}
		}
	}}
	d := newDirect(t, rc, engine.Config{Policy: engine.PolicyPriority})
	low := d.add("low", prompt(1, 60), engine.SamplingParams{MaxTokens: 60}, 9)
	high := d.add("high", prompt(2, 60), engine.SamplingParams{MaxTokens: 60}, 0)
	d.runAll()
	if d.s.Counters().Preemptions == 0 {
		t.Fatal("no preemption")
	}
	for k := 1; k < len(highComputed); k++ {
		if highComputed[k] < highComputed[k-1] {
			t.Fatalf("the high-priority request was preempted: computed %v", highComputed)
		}
	}
	// The high-priority request was never preempted, so it finished first and its
	// tokens are still exact; so are the low one's after recompute.
	if want := enginetest.Reference(256, prompt(2, 60), 60, greedy()); !slices.Equal(high.tokens, want) {
		t.Fatal("high-priority tokens differ from the reference")
	}
	if want := enginetest.Reference(256, prompt(1, 60), 60, greedy()); !slices.Equal(low.tokens, want) {
		t.Fatal("low-priority tokens differ from the reference")
	}
	d.checkWhole()
}

func TestPlanStaysIntactWhileTheNextIsBuilt(t *testing.T) {
	d := newDirect(t, enginetest.Config{BlockTokens: 16, MaxDrafts: 1}, engine.Config{MaxBatchTokens: 20})
	for i := 0; i < 4; i++ {
		d.add(string(rune('a'+i)), prompt(i, 15+7*i), engine.SamplingParams{MaxTokens: 12}, 0)
	}
	var prev *engine.BatchPlan
	var prevBytes []byte
	steps := 0
	for {
		p := d.s.Schedule()
		if prev != nil {
			// Plan N is unchanged after N's Update and N+1's Schedule.
			if again, _ := prev.MarshalBinary(); string(again) != string(prevBytes) {
				t.Fatalf("step %d: plan %d changed while plan %d was built", steps, prev.Step, steps)
			}
			if p == prev {
				t.Fatal("consecutive plans share a buffer")
			}
		}
		if p == nil {
			break
		}
		if d.s.Schedule() != nil {
			t.Fatal("Schedule handed out a second plan before Update")
		}
		b, err := p.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		res, err := d.r.Execute(context.Background(), p)
		d.s.Update(p, res, err)
		prev, prevBytes = p, b
		steps++
	}
	if steps < 5 {
		t.Fatalf("only %d steps", steps)
	}
	d.checkWhole()
}

func TestUpdateRefusesAForeignPlan(t *testing.T) {
	d := newDirect(t, enginetest.Config{}, engine.Config{})
	o := d.add("a", prompt(1, 5), engine.SamplingParams{MaxTokens: 3}, 0)
	p := d.s.Schedule()
	res, err := d.r.Execute(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.s.Update(&engine.BatchPlan{}, res, nil); err == nil {
		t.Fatal("Update accepted a plan it did not hand out")
	}
	if err := d.s.Update(nil, res, nil); err == nil {
		t.Fatal("Update accepted a nil plan")
	}
	if err := d.s.Update(p, res, nil); err != nil {
		t.Fatal(err)
	}
	if err := d.s.Update(p, res, nil); err == nil {
		t.Fatal("Update applied the same plan twice")
	}
	d.runAll()
	if len(o.tokens) != 3 {
		t.Fatalf("%d tokens", len(o.tokens))
	}
	d.checkWhole()
}

func TestPickBucket(t *testing.T) {
	buckets := []int{1, 2, 4, 8, 16}
	for n, want := range map[int]int{0: 1, 1: 1, 3: 4, 8: 8, 9: 16, 16: 16} {
		if b, ok := engine.PickBucket(buckets, n); !ok || b != want {
			t.Errorf("PickBucket(%d) = %d, %v; want %d", n, b, ok, want)
		}
	}
	if _, ok := engine.PickBucket(buckets, 17); ok {
		t.Error("17 fits no bucket, yet one was picked")
	}
	if _, ok := engine.PickBucket(nil, 1); ok {
		t.Error("no buckets, yet one was picked")
	}
}
