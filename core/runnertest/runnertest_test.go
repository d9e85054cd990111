package runnertest

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/engine/enginetest"
	"github.com/resin-llm/resin/core/kvslab"
)

func openTest(cfg enginetest.Config) Opener {
	return func(t testing.TB) (engine.Runner, *kvslab.Pool) {
		t.Helper()
		r, err := enginetest.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return r, r.Pool()
	}
}

// TestSuitePasses runs the suite on the engine's deterministic test runner, which is
// correct by construction, with full-attention and sliding-window caches.
func TestSuitePasses(t *testing.T) {
	t.Run("full", func(t *testing.T) {
		Run(t, openTest(enginetest.Config{VocabSize: 300, MaxContext: 256, BlockTokens: 4, Pages: 256}), Options{})
	})
	t.Run("sliding", func(t *testing.T) {
		Run(t, openTest(enginetest.Config{VocabSize: 300, MaxContext: 256, BlockTokens: 4, Pages: 256, Window: 6}), Options{MaxTokens: 9})
	})
}

// broken wraps the test runner and changes its plans or results the way a buggy runner
// would.
type broken struct {
	*enginetest.Runner
	plan   func(p *engine.BatchPlan) *engine.BatchPlan // nil: unchanged
	result func(p *engine.BatchPlan, r *engine.StepResult)
}

func (b *broken) Execute(ctx context.Context, p *engine.BatchPlan) (engine.StepResult, error) {
	if b.plan != nil {
		p = b.plan(p)
	}
	res, err := b.Runner.Execute(ctx, p)
	if err == nil && b.result != nil {
		b.result(p, &res)
	}
	return res, err
}

func openBroken(mk func() *broken) Opener {
	return func(t testing.TB) (engine.Runner, *kvslab.Pool) {
		t.Helper()
		r, err := enginetest.New(enginetest.Config{VocabSize: 300, MaxContext: 256, BlockTokens: 4, Pages: 256})
		if err != nil {
			t.Fatal(err)
		}
		b := mk()
		b.Runner = r
		return b, r.Pool()
	}
}

// clonePlan copies the parts of p a wrapper rewrites (the engine's plan is frozen).
func clonePlan(p *engine.BatchPlan) *engine.BatchPlan {
	q := *p
	q.Positions = slices.Clone(p.Positions)
	q.Tokens = slices.Clone(p.Tokens)
	q.Groups = slices.Clone(p.Groups)
	for g := range q.Groups {
		q.Groups[g].PageTable = slices.Clone(p.Groups[g].PageTable)
		q.Groups[g].SlotMapping = slices.Clone(p.Groups[g].SlotMapping)
	}
	return &q
}

// recorder is a testing.TB that records failures instead of failing the test.
type recorder struct {
	testing.TB
	mu   sync.Mutex
	msgs []string
}

func (r *recorder) Helper() {}
func (r *recorder) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, fmt.Sprintf(format, args...))
}
func (r *recorder) Error(args ...any)                 { r.Errorf("%s", fmt.Sprint(args...)) }
func (r *recorder) Fatalf(format string, args ...any) { r.Errorf(format, args...); runtime.Goexit() }
func (r *recorder) Fatal(args ...any)                 { r.Error(args...); runtime.Goexit() }
func (r *recorder) Fail()                             { r.Errorf("Fail") }
func (r *recorder) FailNow()                          { r.Errorf("FailNow"); runtime.Goexit() }
func (r *recorder) Failed() bool                      { r.mu.Lock(); defer r.mu.Unlock(); return len(r.msgs) > 0 }
func (r *recorder) Logf(string, ...any)               {}
func (r *recorder) Log(...any)                        {}
func (r *recorder) Skipf(format string, args ...any) {
	r.Errorf("skipped: "+format, args...)
	runtime.Goexit()
}

// failures runs every check on open with a recorder and returns the checks that failed
// with their first message.
func failures(t *testing.T, open Opener) map[string]string {
	s := New(t, open, Options{})
	out := map[string]string{}
	for _, c := range Checks {
		rec := &recorder{TB: t}
		done := make(chan struct{})
		go func() { defer close(done); c.Run(rec, s) }()
		<-done
		if rec.Failed() {
			out[c.Name] = rec.msgs[0]
		}
	}
	return out
}

// TestSuiteFails checks that the suite catches the bugs it is meant to catch: each broken
// runner must fail the named checks.
func TestSuiteFails(t *testing.T) {
	cases := []struct {
		name string
		mk   func() *broken
		want []string
	}{
		{
			// Positions counted from the start of this step's chunk instead of the sequence.
			name: "positions relative to the chunk",
			mk: func() *broken {
				return &broken{plan: func(p *engine.BatchPlan) *engine.BatchPlan {
					q := clonePlan(p)
					for i := range q.Scheduled {
						for k := q.QueryStart[i]; k < q.QueryStart[i+1]; k++ {
							q.Positions[k] -= q.Computed[i]
						}
					}
					return q
				}}
			},
			want: []string{"PrefillEqualsDecode", "ChunkedPrefill"},
		},
		{
			// Reads the cache as if a sequence's pages were contiguous from its first one.
			name: "page table assumed contiguous",
			mk: func() *broken {
				return &broken{plan: func(p *engine.BatchPlan) *engine.BatchPlan {
					q := clonePlan(p)
					g := &q.Groups[0]
					for i := 0; i+1 < len(g.PageTableStart); i++ {
						tab := g.PageTable[g.PageTableStart[i]:g.PageTableStart[i+1]]
						for j := 1; j < len(tab); j++ {
							if tab[0] != kvslab.NoPage {
								tab[j] = tab[0] + kvslab.PageID(j)
							}
						}
					}
					return q
				}}
			},
			want: []string{"PageLayout"},
		},
		{
			// The first sequence's token depends on how many sequences share the step.
			name: "batch-dependent result",
			mk: func() *broken {
				return &broken{result: func(p *engine.BatchPlan, r *engine.StepResult) {
					if len(p.Scheduled) > 1 && len(r.Tokens) > 0 {
						r.Tokens[0] = (r.Tokens[0] + 1) % 300
					}
				}}
			},
			want: []string{"BatchInvariance"},
		},
		{
			// Every runner opened samples differently: state leaks between runs.
			name: "not reproducible",
			mk: func() func() *broken {
				var mu sync.Mutex
				opened := 0
				return func() *broken {
					mu.Lock()
					opened++
					n := opened
					mu.Unlock()
					return &broken{result: func(p *engine.BatchPlan, r *engine.StepResult) {
						if n%2 == 0 && len(r.Tokens) > 0 {
							r.Tokens[len(r.Tokens)-1] = (r.Tokens[len(r.Tokens)-1] + 7) % 300
						}
					}}
				}
			}(),
			want: []string{"Reproducible"},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := failures(t, openBroken(c.mk))
			for _, name := range c.want {
				if _, ok := got[name]; !ok {
					t.Errorf("check %s passed on a runner with %s (failed: %v)", name, c.name, got)
				}
			}
			for name, msg := range got {
				t.Logf("%s: %s", name, strings.SplitN(msg, "\n", 2)[0])
			}
		})
	}
}
