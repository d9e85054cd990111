package runnertest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
)

// alone runs prompt by itself on a fresh runner, with the default engine limits.
func (s *Suite) alone(t testing.TB, prompt []int32, sp engine.SamplingParams) Output {
	t.Helper()
	h := s.Start(t, engine.Config{})
	out := h.Generate(t, prompt, sp)
	h.Stop(t)
	return out
}

func checkPrefillEqualsDecode(t testing.TB, s *Suite) {
	p := Prompt(s.Opts.PromptLen, s.Info.VocabSize, 1)
	want := s.alone(t, p, s.Sampling())
	h := s.Start(t, engine.Config{MaxBatchTokens: 1})
	got := h.Generate(t, p, s.Sampling())
	h.Stop(t)
	s.Same(t, "prompt fed one token per step vs one-shot prefill", got, want)
}

func checkChunkedPrefill(t testing.TB, s *Suite) {
	p := Prompt(s.Opts.PromptLen, s.Info.VocabSize, 2)
	want := s.alone(t, p, s.Sampling())
	seen := map[int]bool{}
	for _, budget := range []int{3, s.Block - 1, s.Block + 1, 2*s.Block - 1} {
		if budget < 2 || budget >= len(p) || seen[budget] {
			continue
		}
		seen[budget] = true
		h := s.Start(t, engine.Config{MaxBatchTokens: budget})
		got := h.Generate(t, p, s.Sampling())
		h.Stop(t)
		s.Same(t, fmt.Sprintf("prefill in chunks of %d tokens vs one-shot", budget), got, want)
	}
}

func checkBatchInvariance(t testing.TB, s *Suite) {
	v := s.Info.VocabSize
	prompts := [][]int32{
		Prompt(s.Opts.PromptLen/2+1, v, 3),
		Prompt(s.Opts.PromptLen, v, 4), // submitted second: its pages follow the first's
		Prompt(min(s.Block+1, s.Opts.PromptLen), v, 5),
		Prompt(2, v, 6),
	}
	want := make([]Output, len(prompts))
	for i, p := range prompts {
		want[i] = s.alone(t, p, s.Sampling())
	}
	// All prompts in one batch, then a budget that mixes prompt chunks with decodes.
	for _, budget := range []int{0, s.Block + 2} {
		h := s.Start(t, engine.Config{MaxBatchTokens: budget})
		got := h.GenerateAll(t, prompts, s.Sampling())
		h.Stop(t)
		for i := range prompts {
			s.Same(t, fmt.Sprintf("request %d of %d batched (budget %d) vs alone", i, len(prompts), budget), got[i], want[i])
		}
	}
	// One request already decoding when the others arrive: it generates longer so that
	// the others join it while it runs.
	long := s.Sampling()
	long.MaxTokens = min(4*s.Opts.MaxTokens, s.Info.MaxContext-len(prompts[1]))
	wantLong := s.alone(t, prompts[1], long)
	h := s.Start(t, engine.Config{})
	ctx := context.Background()
	first, err := h.Submit(ctx, engine.Request{Prompt: prompts[1], Sampling: long})
	if err != nil {
		t.Fatal(err)
	}
	ev, err := first.Recv(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rest := h.GenerateAll(t, [][]int32{prompts[0], prompts[2]}, s.Sampling())
	o := Output{Tokens: ev.Tokens, Logprobs: ev.Logprobs, Finish: ev.Finish}
	if ev.Finish == engine.FinishNone {
		more, err := collect(ctx, first)
		if err != nil {
			t.Fatal(err)
		}
		o.Tokens = append(slices.Clone(o.Tokens), more.Tokens...)
		o.Logprobs = append(slices.Clone(o.Logprobs), more.Logprobs...)
		o.Finish = more.Finish
	}
	h.Stop(t)
	s.Same(t, "request decoding while others prefill vs alone", o, wantLong)
	s.Same(t, "request prefilled next to a decoding one vs alone", rest[0], want[0])
	s.Same(t, "second request prefilled next to a decoding one vs alone", rest[1], want[2])
}

// maxFragments caps the sequences PageLayout opens to fragment a pool.
const maxFragments = 1 << 16

func checkPageLayout(t testing.TB, s *Suite) {
	p := Prompt(s.Opts.PromptLen, s.Info.VocabSize, 7)
	want := s.alone(t, p, s.Sampling())

	r, pool := s.Open(t)
	// Fragment the pool: fill it with sequences of one block each (up to maxFragments),
	// then free every other one in reverse order, so that the request's pages can only be
	// the holes left between held ones.
	var held, freed []kvslab.SeqID
	for i := 0; i < maxFragments; i++ {
		id, _, err := pool.Open(nil)
		if errors.Is(err, kvslab.ErrNoSpace) {
			break
		}
		if err != nil {
			t.Fatalf("fragment the pool: %v", err)
		}
		if err := pool.Reserve(id, s.Block); errors.Is(err, kvslab.ErrNoSpace) {
			if err := pool.Free(id); err != nil {
				t.Fatal(err)
			}
			break
		} else if err != nil {
			t.Fatalf("fragment the pool: %v", err)
		}
		if i%2 == 0 {
			freed = append(freed, id)
		} else {
			held = append(held, id)
		}
	}
	if need := (len(p) + s.Opts.MaxTokens + s.Block - 1) / s.Block; len(freed) < need+1 {
		t.Fatalf("fragment the pool: %d holes for a request of %d pages", len(freed), need)
	}
	for i := len(freed) - 1; i >= 0; i-- {
		if err := pool.Free(freed[i]); err != nil {
			t.Fatal(err)
		}
	}
	h := s.StartWith(t, r, pool, engine.Config{})
	got := h.Generate(t, p, s.Sampling())
	if err := h.halt(); err != nil {
		t.Errorf("engine loop: %v", err)
	}
	for _, id := range held {
		if err := pool.Free(id); err != nil {
			t.Fatal(err)
		}
	}
	CheckPoolEmpty(t, pool)
	s.Same(t, "request in a fragmented pool vs a fresh one", got, want)
}

func checkReproducible(t testing.TB, s *Suite) {
	p := Prompt(s.Opts.PromptLen, s.Info.VocabSize, 8)
	s.Same(t, "greedy, second run", s.alone(t, p, s.Sampling()), s.alone(t, p, s.Sampling()))
	sp := s.Sampling()
	sp.Temperature, sp.Seed, sp.HasSeed = 0.9, 1234, true
	s.Same(t, "seeded sampling at temperature 0.9, second run", s.alone(t, p, sp), s.alone(t, p, sp))
}

func checkPrefixCache(t testing.TB, s *Suite) {
	v := s.Info.VocabSize
	prefix := Prompt(2*s.Block, v, 9)
	p1 := append(append([]int32(nil), prefix...), Prompt(3, v, 10)...)
	p2 := append(append([]int32(nil), prefix...), Prompt(s.Block+2, v, 11)...)
	if len(p2)+s.Opts.MaxTokens > s.Info.MaxContext {
		t.Skipf("prompts of %d tokens do not fit the context of %d", len(p2), s.Info.MaxContext)
	}
	want1, want2 := s.alone(t, p1, s.Sampling()), s.alone(t, p2, s.Sampling())
	cacheable := true
	for _, g := range s.Info.CacheGroups {
		if g.Kind == kvslab.Recurrent && g.Checkpoints == 0 {
			cacheable = false
		}
	}

	h := s.Start(t, engine.Config{})
	s.Same(t, "first request on a warm engine vs cold", h.Generate(t, p1, s.Sampling()), want1)
	hits := h.Counters().PrefixHits
	got2 := h.Generate(t, p2, s.Sampling())
	if after := h.Counters().PrefixHits; cacheable && after <= hits {
		t.Errorf("a prompt sharing %d tokens (2 blocks) with a finished one got no prefix-cache hit", len(prefix))
	}
	s.Same(t, "request sharing 2 cached blocks vs cold", got2, want2)
	hits = h.Counters().PrefixHits
	again := h.Generate(t, p1, s.Sampling())
	if after := h.Counters().PrefixHits; cacheable && after <= hits {
		t.Error("a repeated prompt got no prefix-cache hit")
	}
	s.Same(t, "repeated prompt served from the prefix cache vs cold", again, want1)
	h.Stop(t)
}

func checkAbort(t testing.TB, s *Suite) {
	v := s.Info.VocabSize
	long := Prompt(s.Opts.PromptLen, v, 12)
	after := Prompt(s.Opts.PromptLen, v, 13)
	want := s.alone(t, after, s.Sampling())

	// The runner is gated so that the request is certainly still running, with its pages,
	// when it is aborted: the engine's loop stops inside the step after its first token.
	r, pool := s.Open(t)
	budget := max(2, s.Block)
	g := newGate(r, (len(long)+budget-1)/budget+1)
	h := s.StartWith(t, g, pool, engine.Config{MaxBatchTokens: budget})
	t.Cleanup(g.release)
	ctx := context.Background()
	sp := s.Sampling()
	sp.MaxTokens = s.Info.MaxContext - len(long)
	running, err := h.Submit(ctx, engine.Request{ID: "running", Prompt: long, Sampling: sp})
	if err != nil {
		t.Fatal(err)
	}
	ev, err := running.Recv(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ev.Tokens) == 0 || ev.Finish != engine.FinishNone {
		t.Fatalf("first event of a long request: %d tokens, finish %s", len(ev.Tokens), ev.Finish)
	}
	g.wait() // the loop now waits inside Execute of a plan holding the request
	if !h.Abort("running") {
		t.Fatal("Abort found no request \"running\" after its first token")
	}
	// A request aborted through its context while it waits.
	wctx, cancel := context.WithCancel(ctx)
	waiting, err := h.Submit(wctx, engine.Request{Prompt: Prompt(s.Opts.PromptLen, v, 14), Sampling: sp})
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	// Both end while the loop is still held: aborting needs no step.
	for name, st := range map[string]*engine.Stream{"waiting": waiting, "running": running} {
		o, err := collect(ctx, st)
		if err != nil {
			t.Fatal(err)
		}
		if o.Finish != engine.FinishAbort {
			t.Errorf("%s request aborted: finish %s, want abort", name, o.Finish)
		}
	}
	g.release()
	// The freed pages serve the next request correctly.
	s.Same(t, "request after two aborts vs a fresh engine", h.Generate(t, after, s.Sampling()), want)
	h.Stop(t)
}

func checkDrafts(t testing.TB, s *Suite) {
	if s.Info.MaxDrafts == 0 {
		t.Skip("the runner proposes no drafts")
	}
	if s.Opts.Plain == nil {
		t.Skip("Options.Plain opens no runner without drafts to compare with")
	}
	v := s.Info.VocabSize
	// Prompts that end at different offsets of a block, decoding long enough to cross
	// blocks, in one batch and with a budget that mixes prompt chunks with verify steps.
	var prompts [][]int32
	for i := range 4 {
		prompts = append(prompts, Prompt(min(s.Opts.PromptLen, 2+i*(s.Block+1)), v, 15+i))
	}
	long := s.Sampling()
	long.MaxTokens = min(2*s.Block+2, s.Info.MaxContext-s.Opts.PromptLen-1)
	seeded := long
	seeded.Temperature, seeded.Seed, seeded.HasSeed = 0.8, 77, true
	for _, sp := range []engine.SamplingParams{long, seeded} {
		r, pool := s.Opts.Plain(t)
		if r.Info().MaxDrafts != 0 {
			t.Fatalf("Options.Plain opened a runner that proposes %d drafts", r.Info().MaxDrafts)
		}
		h := s.StartWith(t, r, pool, engine.Config{})
		want := h.GenerateAll(t, prompts, sp)
		h.Stop(t)
		for _, budget := range []int{0, s.Block + 3} {
			h := s.Start(t, engine.Config{MaxBatchTokens: budget})
			got := h.GenerateAll(t, prompts, sp)
			c := h.Counters()
			h.Stop(t)
			if c.DraftsProposed == 0 {
				t.Errorf("no draft was scheduled for %d requests of %d tokens", len(prompts), sp.MaxTokens)
			}
			for i := range prompts {
				s.Same(t, fmt.Sprintf("request %d (temperature %g, budget %d) with %d/%d drafts accepted vs without drafts",
					i, sp.Temperature, budget, c.DraftsAccepted, c.DraftsProposed), got[i], want[i])
			}
		}
	}
}

// gate lets a number of steps through its runner, then holds the next one until release.
type gate struct {
	engine.Runner
	mu      sync.Mutex
	cond    *sync.Cond
	left    int // steps still let through; < 0: no limit
	waiting bool
}

func newGate(r engine.Runner, steps int) *gate {
	g := &gate{Runner: r, left: steps}
	g.cond = sync.NewCond(&g.mu)
	return g
}

func (g *gate) Execute(ctx context.Context, p *engine.BatchPlan) (engine.StepResult, error) {
	g.mu.Lock()
	for g.left == 0 {
		g.waiting = true
		g.cond.Broadcast()
		g.cond.Wait()
	}
	g.waiting = false
	if g.left > 0 {
		g.left--
	}
	g.mu.Unlock()
	return g.Runner.Execute(ctx, p)
}

// wait returns once a step is held.
func (g *gate) wait() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for !g.waiting {
		g.cond.Wait()
	}
}

// release lets every step through from now on.
func (g *gate) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.left = -1
	g.cond.Broadcast()
}
