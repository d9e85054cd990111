package tp_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/dist/cp"
	"github.com/resin-llm/resin/core/dist/cp/cptest"
	"github.com/resin-llm/resin/core/dist/tp"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/core/runnertest"
	"github.com/resin-llm/resin/models/llama"
)

// TestCPTPEqualsOneRank: prefill CP over TP groups gives models/llama's own logits within
// 1e-5 of each row's largest, over CP=2 × TP=2, CP=3 × TP=2 and CP=2 × TP=1, with full
// attention and with a 5-token window: a 37-token prompt fed in chunks of 13, 11 and 13
// tokens (every row's logits; each chunk split over the cp groups, the later ones over
// the keys cached on cp rank 0's TP group), 8 greedy decode steps on that TP group alone,
// then a second prompt sharing the first's 24 tokens, opened through the prefix cache, its
// other 10 tokens split, and 8 more decode steps. A run's logits are bit-identical to a
// second run's. It fails when a cp group's TP ranks exchange another tp rank's heads, or
// when cp rank 0's TP group keeps only its own chunk's keys.
func TestCPTPEqualsOneRank(t *testing.T) {
	for _, tc := range []struct{ cp, tp, window int }{{2, 2, 0}, {3, 2, 0}, {2, 1, 0}, {2, 2, 5}} {
		first := cpTPRun(t, tc.cp, tc.tp, tc.window)
		cptest.SameBits(t, fmt.Sprintf("cp=%d tp=%d window %d, two runs", tc.cp, tc.tp, tc.window), cpTPRun(t, tc.cp, tc.tp, tc.window), first)
	}
}

// cpTPRun runs cptest.Continuation over CP=cpSize × TP=tpSize and through llama's own
// forward, fails on a difference or a plan that should split and did not, and returns the
// group's logits.
func cpTPRun(t *testing.T, cpSize, tpSize, window int) [][]float32 {
	m := tiny(t)
	c := m.Config
	c.Window = window
	ref1, err := llama.NewModel(c, m.W, 256)
	if err != nil {
		t.Fatal(err)
	}
	rope, err := c.RopeTable(256)
	if err != nil {
		t.Fatal(err)
	}
	d, w := fromLlama(ref1, rope)
	newPool := func() *kvslab.Pool {
		pool, err := engine.NewHostPool(llama.CacheGroups(c, 4), 4<<20)
		if err != nil {
			t.Fatal(err)
		}
		return pool
	}
	poolRef, poolCP := newPool(), newPool()
	kvRef, err := llama.NewKVCache(c, poolRef)
	if err != nil {
		t.Fatal(err)
	}
	g, err := tp.StartCPInProcess(d, w, tpSize, cpSize, tp.CachePages(d, poolCP), 4, dist.Options{Timeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := g.Close(); err != nil {
			t.Error(err)
		}
	}()
	what := fmt.Sprintf("cp=%d tp=%d window %d", cpSize, tpSize, window)
	got := cptest.SameContinuation(t, what, func(p *engine.BatchPlan, logits []float32) error { return ref1.Forward(p, kvRef, logits) }, poolRef, g.Forward, poolCP, c.VocabSize, cp.Splits)
	return got
}

// cpTPRunner is the tiny llama on a CP=2 × TP=2 in-process group behind cpurunner.
func cpTPRunner(t testing.TB) (engine.Runner, *kvslab.Pool) {
	return groupRunner(t, func(d tp.Dense, w *tp.Weights, pages, pageTokens int) (group, error) {
		return tp.StartCPInProcess(d, w, 2, 2, pages, pageTokens, dist.Options{Timeout: 30 * time.Second})
	})
}

// TestCPTPConformance runs core/runnertest's suite (prefill equals decode, chunked
// prefill, batch and page-layout invariance, reproducibility, prefix hits, aborts) on the
// CP=2 × TP=2 runner.
func TestCPTPConformance(t *testing.T) {
	runnertest.Run(t, cpTPRunner, runnertest.Options{})
}
