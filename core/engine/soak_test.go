package engine_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/engine/enginetest"
)

// TestSoak pushes 10,000 requests with random lengths, shared prefixes, drafts, random
// aborts and a runner that fails now and then through a small pool (so preemption
// happens), then checks that every request got exactly one terminal event, that every
// request that ran to its end produced exactly the reference tokens, and that the pool
// is whole and no goroutine is left behind.
func TestSoak(t *testing.T) {
	testSoak(t, soak{requests: 10000, pages: 96, drafts: true})
}

// TestSoakAsync is the soak with Config.Async: plan N+1 is built while N runs.
func TestSoakAsync(t *testing.T) {
	testSoak(t, soak{requests: 5000, pages: 96, async: true})
}

// TestSoakSlidingWindow runs a shorter soak over a sliding-window cache group, whose
// pages are released behind the window as sequences move.
func TestSoakSlidingWindow(t *testing.T) {
	testSoak(t, soak{requests: 2000, pages: 40, window: 10, drafts: true})
}

// TestSoakTwoGroups runs a shorter soak over two cache groups at once, a full one and a
// sliding window holding the same entries (enginetest.Config.Mirror): the runner checks
// that they agree at every read.
func TestSoakTwoGroups(t *testing.T) {
	testSoak(t, soak{requests: 2000, pages: 64, mirror: true, drafts: true})
}

// TestSoakRecurrent adds a recurrent group whose state the runner continues from: prefix
// hits restore it from checkpoints through the plans' cache ops, and rejected drafts roll
// its checkpoints back.
func TestSoakRecurrent(t *testing.T) {
	testSoak(t, soak{requests: 2000, pages: 64, recurrent: true, drafts: true})
}

// TestSoakAsyncDrafts is the async soak with a runner that drafts.
func TestSoakAsyncDrafts(t *testing.T) {
	testSoak(t, soak{requests: 2000, pages: 96, async: true, drafts: true})
}

// TestSoakAsyncHybrid is the async soak over a hybrid model: a sliding window, its mirror
// and a recurrent group, with drafts, the cache ops left to the engine. 40 pages, not 64:
// with 64 the async run preempted nobody in about a third of runs, and the soak's check
// that it exercised preemption failed CI; with 40 every run of 30 preempted 4 to 15 times.
func TestSoakAsyncHybrid(t *testing.T) {
	testSoak(t, soak{requests: 2000, pages: 40, window: 10, async: true, mirror: true, recurrent: true, drafts: true, engineOps: true})
}

type soak struct {
	requests, pages, window                     int
	async, mirror, recurrent, drafts, engineOps bool
}

func testSoak(t *testing.T, sk soak) {
	requests := sk.requests
	const submitters = 4
	goroutines := runtime.NumGoroutine()
	const eos = 7
	rc := enginetest.Config{
		BlockTokens: 8, Pages: sk.pages, EOS: []int32{eos}, MaxDrafts: 2 * b2i(sk.drafts), Window: sk.window, Async: sk.async,
		Mirror: sk.mirror, Recurrent: sk.recurrent, EngineCacheOps: sk.engineOps,
		WrongDraft: func(pos, j int) bool { return (pos*7+j)%5 == 0 },
		Fail:       func(step uint64) bool { return step%97 == 0 },
	}
	r, err := enginetest.New(rc)
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.New(r, engine.Config{Pool: r.Pool(), MaxBatchTokens: 192, MaxSeqs: 48, Async: sk.async})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stopRun := context.WithCancel(context.Background())
	runDone := make(chan error)
	go func() { runDone <- e.Run(runCtx) }()

	prefixes := [][]int32{prompt(1000, 24), prompt(1001, 40), prompt(1002, 9)}
	type outcome struct {
		prompt    []int32
		maxTokens int
		tokens    []int32
		ev        engine.Event
		aborted   bool
	}
	results := make([]outcome, requests)
	var wg sync.WaitGroup
	var failMu sync.Mutex
	var failure error
	fail := func(err error) {
		failMu.Lock()
		if failure == nil {
			failure = err
		}
		failMu.Unlock()
	}
	for w := 0; w < submitters; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 99))
			type pending struct {
				i      int
				st     *engine.Stream
				cancel context.CancelFunc
				abort  int // 0 none, 1 cancel ctx, 2 Abort after the first event
			}
			var batch []pending
			flush := func() {
				for _, p := range batch {
					o := &results[p.i]
					if p.abort == 1 {
						p.cancel()
					}
					for {
						ev, err := p.st.Recv(context.Background())
						if err != nil {
							fail(fmt.Errorf("request %d: %w before a terminal event", p.i, err))
							break
						}
						o.tokens = append(o.tokens, ev.Tokens...)
						if p.abort == 2 && len(o.tokens) > 0 {
							e.Abort(p.st.ID())
						}
						if ev.Finish != engine.FinishNone {
							o.ev = ev
							break
						}
					}
					if _, err := p.st.Recv(context.Background()); err != io.EOF {
						fail(fmt.Errorf("request %d: after the terminal event Recv gave %v", p.i, err))
					}
					p.cancel()
				}
				batch = batch[:0]
			}
			for i := w; i < requests; i += submitters {
				pl := 1 + rng.IntN(40)
				p := prompt(i, pl)
				if rng.IntN(3) == 0 {
					p = append(slices.Clone(prefixes[rng.IntN(len(prefixes))]), p...)
				}
				results[i].prompt, results[i].maxTokens = p, 1+rng.IntN(24)
				ctx, cancel := context.WithCancel(context.Background())
				abort := 0
				if x := rng.IntN(20); x == 0 {
					abort = 1
				} else if x == 1 {
					abort = 2
				}
				results[i].aborted = abort != 0
				st, err := e.Submit(ctx, engine.Request{ID: fmt.Sprint(i), Prompt: p, Sampling: engine.SamplingParams{MaxTokens: results[i].maxTokens}})
				if err != nil {
					fail(fmt.Errorf("submit %d: %w", i, err))
					cancel()
					continue
				}
				batch = append(batch, pending{i, st, cancel, abort})
				if len(batch) == 64 {
					flush()
				}
			}
			flush()
		}(w)
	}
	wg.Wait()
	if failure != nil {
		t.Fatal(failure)
	}
	stopRun()
	if err := <-runDone; !errors.Is(err, context.Canceled) {
		t.Fatalf("Run: %v", err)
	}

	finished := map[engine.FinishReason]int{}
	for i, o := range results {
		finished[o.ev.Finish]++
		switch o.ev.Finish {
		case engine.FinishStop, engine.FinishLength:
			want := enginetest.Reference(256, o.prompt, o.maxTokens, greedy(), eos)
			if !slices.Equal(o.tokens, want) {
				t.Fatalf("request %d (%s): %v, want %v", i, o.ev.Finish, o.tokens, want)
			}
		case engine.FinishAbort:
			if !o.aborted {
				t.Fatalf("request %d aborted without being asked: %v", i, o.ev.Err)
			}
		case engine.FinishError:
			if !errors.Is(o.ev.Err, enginetest.ErrInjected) {
				t.Fatalf("request %d failed: %v", i, o.ev.Err)
			}
		default:
			t.Fatalf("request %d: no terminal event", i)
		}
		if o.ev.Usage.CompletionTokens != len(o.tokens) {
			t.Fatalf("request %d: usage says %d tokens, stream gave %d", i, o.ev.Usage.CompletionTokens, len(o.tokens))
		}
	}
	c := e.Counters()
	t.Logf("finishes %v; preemptions %d, prefix hit tokens %d, drafts %d/%d, runner errors %d",
		finished, c.Preemptions, c.PrefixHits, c.DraftsAccepted, c.DraftsProposed, c.RunnerErrors)
	if finished[engine.FinishAbort] == 0 || finished[engine.FinishError] == 0 || finished[engine.FinishStop] == 0 || c.Preemptions == 0 || c.PrefixHits == 0 {
		t.Fatal("the soak did not exercise aborts, errors, stops, preemption and prefix hits")
	}
	if err := r.Err(); err != nil {
		t.Fatal(err)
	}
	if ops, released := r.CacheOps(); released == 0 || sk.recurrent && ops == 0 {
		t.Fatalf("the plans carried %d cache ops and %d releases", ops, released)
	}
	pool := r.Pool()
	if err := pool.Check(); err != nil {
		t.Fatal(err)
	}
	if pool.OpenSeqs() != 0 {
		t.Fatalf("%d sequences open", pool.OpenSeqs())
	}
	pool.ClearCache()
	if !pool.Whole() {
		t.Fatalf("pool not whole: %+v", pool.Stats())
	}
	e.Close()
	for deadline := time.Now().Add(5 * time.Second); runtime.NumGoroutine() > goroutines && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > goroutines {
		buf := make([]byte, 1<<16)
		t.Fatalf("%d goroutines before, %d after:\n%s", goroutines, n, buf[:runtime.Stack(buf, true)])
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
