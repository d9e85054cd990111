package tp_test

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/cpurunner"
	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/dist/cp"
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
		again := cpTPRun(t, tc.cp, tc.tp, tc.window)
		for i := range first {
			if math.Float32bits(first[i]) != math.Float32bits(again[i]) {
				t.Fatalf("cp=%d tp=%d window %d: two runs differ at logit %d", tc.cp, tc.tp, tc.window, i)
			}
		}
	}
}

// cpTPRun runs TestCPTPEqualsOneRank's plans over CP=cpSize × TP=tpSize and llama's own
// forward side by side, failing on a difference, and returns the group's logits.
func cpTPRun(t *testing.T, cpSize, tpSize, window int) []float32 {
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
	sides := []struct {
		pool    *kvslab.Pool
		forward func(*engine.BatchPlan, []float32) error
	}{
		{poolRef, func(p *engine.BatchPlan, logits []float32) error { return ref1.Forward(p, kvRef, logits) }},
		{poolCP, g.Forward},
	}
	name := func(what string) string {
		return fmt.Sprintf("cp=%d tp=%d window %d: %s", cpSize, tpSize, window, what)
	}
	var all []float32
	step := func(what string, seqs [2]*runnertest.Seq, n int, rows, split bool) int32 {
		var logits [2][]float32
		for i, s := range sides {
			plan := runnertest.Plan(t, s.pool, []*runnertest.Seq{seqs[i]}, []int{n}, rows)
			if i == 1 && cp.Splits(plan) != split {
				t.Fatalf("%s: Splits = %v", name(what), !split)
			}
			logits[i] = make([]float32, len(plan.LogitsIndices)*c.VocabSize)
			if err := s.forward(plan, logits[i]); err != nil {
				t.Fatalf("%s: %v", name(what), err)
			}
		}
		v := c.VocabSize
		for j := range len(logits[0]) / v {
			want, got := logits[0][j*v:(j+1)*v], logits[1][j*v:(j+1)*v]
			top := 0.0
			for _, x := range want {
				top = max(top, math.Abs(float64(x)))
			}
			for i := range want {
				if d := math.Abs(float64(got[i] - want[i])); d > 1e-5*top || math.IsNaN(float64(got[i])) {
					t.Fatalf("%s: row %d logit %d = %g, one rank %g", name(what), j, i, got[i], want[i])
				}
			}
		}
		all = append(all, logits[1]...)
		a, b := argmax(logits[0][len(logits[0])-v:]), argmax(logits[1][len(logits[1])-v:])
		if a != b {
			t.Fatalf("%s: greedy token %d, one rank %d", name(what), b, a)
		}
		return a
	}
	decode := func(what string, seqs [2]*runnertest.Seq, next int32) {
		for range 8 {
			for _, s := range seqs {
				s.Tokens = append(s.Tokens, next)
			}
			next = step(what+" decode", seqs, 1, false, false)
		}
	}
	prompt := runnertest.Prompt(37, c.VocabSize, 3)
	var a [2]*runnertest.Seq
	for i, s := range sides {
		a[i] = runnertest.OpenSeq(t, s.pool, append([]int32(nil), prompt...))
	}
	step("chunk 1", a, 13, true, true)
	step("chunk 2", a, 11, true, true)
	next := step("chunk 3", a, 13, true, true)
	for i, s := range sides {
		if err := s.pool.Commit(a[i].ID, a[i].Tokens[:a[i].Computed]); err != nil {
			t.Fatal(err)
		}
	}
	decode("first prompt", a, next)
	second := append(append([]int32(nil), prompt[:24]...), runnertest.Prompt(10, c.VocabSize, 4)...)
	var b [2]*runnertest.Seq
	for i, s := range sides {
		id, hit, err := s.pool.Open(second[:len(second)-1])
		if err != nil {
			t.Fatal(err)
		}
		if hit != 24 {
			t.Fatalf("side %d: the prefix cache served %d tokens, want 24", i, hit)
		}
		b[i] = &runnertest.Seq{ID: id, Tokens: append([]int32(nil), second...), Computed: hit}
	}
	next = step("after the prefix hit", b, 10, true, true)
	decode("second prompt", b, next)
	return all
}

// cpTPRunner is the tiny llama on a CP=2 × TP=2 in-process group behind cpurunner.
func cpTPRunner(t testing.TB) (engine.Runner, *kvslab.Pool) {
	m := tiny(t)
	r := llama.NewRunner(m, 4)
	pool, err := r.NewPool(4 << 20)
	if err != nil {
		t.Fatal(err)
	}
	rope, err := m.Config.RopeTable(m.MaxContext())
	if err != nil {
		t.Fatal(err)
	}
	d, w := fromLlama(m, rope)
	g, err := tp.StartCPInProcess(d, w, 2, 2, tp.CachePages(d, pool), pool.BlockTokens(), dist.Options{Timeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := g.Close(); err != nil {
			t.Error(err)
		}
	})
	return cpurunner.New(r.Info(), cpurunner.ForwardFunc(g.Forward)), pool
}

// TestCPTPConformance runs core/runnertest's suite (prefill equals decode, chunked
// prefill, batch and page-layout invariance, reproducibility, prefix hits, aborts) on the
// CP=2 × TP=2 runner.
func TestCPTPConformance(t *testing.T) {
	runnertest.Run(t, cpTPRunner, runnertest.Options{})
}
