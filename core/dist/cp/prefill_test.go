package cp_test

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/cpurunner"
	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/dist/cp"
	"github.com/resin-llm/resin/core/dist/cp/cptest"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/core/runnertest"
	"github.com/resin-llm/resin/models/llama"
)

// tiny is models/llama's config shrunk (GQA, biases, q/k norm and the window of the
// variant kept) with seeded random weights.
func tiny(t testing.TB) (*llama.Config, *llama.Weights) {
	c, err := llama.LoadConfig("../../../models/llama")
	if err != nil {
		t.Fatal(err)
	}
	group := c.NumAttentionHeads / c.NumKeyValueHeads
	c.NumKeyValueHeads = 2
	c.NumAttentionHeads = 2 * min(group, 4)
	c.HeadDim, c.HiddenSize, c.IntermediateSize, c.NumHiddenLayers = 16, 64, 96, 2
	c.VocabSize = min(c.VocabSize, 383)
	if c.Window > 0 {
		c.Window = 5
	}
	return c, llama.RandomWeights(c, 7)
}

// forwards builds size llama models on the same weights, each rank's forward for cp (rank
// 0's with its own cache kv for the plans it runs alone).
func forwards(t testing.TB, c *llama.Config, w *llama.Weights, size int, kv *llama.KVCache) []cp.ModelForward {
	out := make([]cp.ModelForward, size)
	for r := range size {
		m, err := llama.NewModel(c, w, 256)
		if err != nil {
			t.Fatal(err)
		}
		cache := kv
		if r > 0 {
			cache = nil
		}
		out[r] = func(p *engine.BatchPlan, attend cp.AttendFunc, logits []float32) error {
			m.Attend = attend
			return m.Forward(p, cache, logits)
		}
	}
	return out
}

// TestCPPrefillEqualsOneRank: a 37-token prompt prefilled over CP=2 and CP=3 (4 tokens
// over 3 ranks too: the last rank has none) gives every prompt row's logits of
// models/llama's own forward within 1e-5 of the row's largest logit, and decoding on
// from rank 0's cache (which got the gathered keys and values) gives the same 16 greedy
// tokens with logits as close. It fails when rank 0 keeps only its own chunk's keys and
// values, or when a rank's queries miss the earlier ranks' keys.
func TestCPPrefillEqualsOneRank(t *testing.T) {
	c, w := tiny(t)
	ref1, err := llama.NewModel(c, w, 256)
	if err != nil {
		t.Fatal(err)
	}
	shape := cp.Shape{Heads: c.NumAttentionHeads, KVHeads: c.NumKeyValueHeads, HeadDim: c.HeadDim, Window: c.Window}
	for _, tc := range []struct{ size, prompt int }{{2, 37}, {3, 37}, {3, 4}} {
		pool, err := engine.NewHostPool(llama.CacheGroups(c, 4), 4<<20)
		if err != nil {
			t.Fatal(err)
		}
		kvRef, err := llama.NewKVCache(c, pool)
		if err != nil {
			t.Fatal(err)
		}
		poolCP, err := engine.NewHostPool(llama.CacheGroups(c, 4), 4<<20)
		if err != nil {
			t.Fatal(err)
		}
		kvCP, err := llama.NewKVCache(c, poolCP)
		if err != nil {
			t.Fatal(err)
		}
		g, err := cp.StartInProcess(shape, c.VocabSize, forwards(t, c, w, tc.size, kvCP), kvCP.Layers, dist.Options{Timeout: 30 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		seq := runnertest.OpenSeq(t, pool, runnertest.Prompt(tc.prompt, c.VocabSize, 3))
		n := len(seq.Tokens)
		for step := 0; step <= 16; step++ {
			plan := runnertest.Plan(t, pool, []*runnertest.Seq{seq}, []int{n}, step == 0)
			if step == 0 && !cp.Splits(plan) {
				t.Fatalf("the prompt's plan is not split")
			}
			rows := len(plan.LogitsIndices)
			want, got := make([]float32, rows*c.VocabSize), make([]float32, rows*c.VocabSize)
			if err := ref1.Forward(plan, kvRef, want); err != nil {
				t.Fatal(err)
			}
			if err := g.Forward(plan, got); err != nil {
				t.Fatalf("cp=%d step %d: %v", tc.size, step, err)
			}
			for j := range rows {
				closeRow(t, tc.size, step, j, got[j*c.VocabSize:(j+1)*c.VocabSize], want[j*c.VocabSize:(j+1)*c.VocabSize])
			}
			last := want[(rows-1)*c.VocabSize:]
			tw, tg := argmax(last), argmax(got[(rows-1)*c.VocabSize:])
			if tw != tg {
				t.Fatalf("cp=%d step %d: greedy token %d, one rank %d", tc.size, step, tg, tw)
			}
			seq.Tokens = append(seq.Tokens, tw)
			n = 1
		}
		if err := g.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

func closeRow(t *testing.T, size, step, row int, got, want []float32) {
	t.Helper()
	scale := 0.0
	for _, v := range want {
		scale = math.Max(scale, math.Abs(float64(v)))
	}
	for i := range want {
		if d := math.Abs(float64(got[i] - want[i])); d > 1e-5*scale || math.IsNaN(float64(got[i])) {
			t.Fatalf("cp=%d step %d row %d: logit %d = %g, one rank %g", size, step, row, i, got[i], want[i])
		}
	}
}

func argmax(x []float32) int32 {
	best := 0
	for i, v := range x {
		if v > x[best] {
			best = i
		}
	}
	return int32(best)
}

// TestChunk: contiguous chunks cover the tokens in rank order, the last ranks empty when
// there are fewer tokens than ranks need.
func TestChunk(t *testing.T) {
	for _, tc := range []struct{ n, size int }{{37, 2}, {37, 3}, {4, 3}, {2, 5}} {
		next := 0
		for r := range tc.size {
			lo, hi := cp.Chunk(tc.n, r, tc.size)
			if lo != next || hi < lo {
				t.Fatalf("n=%d size=%d rank %d: [%d, %d) after %d", tc.n, tc.size, r, lo, hi, next)
			}
			next = hi
		}
		if next != tc.n {
			t.Fatalf("n=%d size=%d: the chunks end at %d", tc.n, tc.size, next)
		}
	}
	if lo, hi := cp.Chunk(4, 2, 3); lo != hi {
		t.Fatalf("4 tokens over 3 ranks: rank 2 has [%d, %d), want none", lo, hi)
	}
}

// cpRunner is the engine's runner over a CP=3 group of llama models (rank 0's cache the
// pool's).
func cpRunner(t testing.TB) (engine.Runner, *kvslab.Pool) {
	c, w := tiny(t)
	m, err := llama.NewModel(c, w, 256)
	if err != nil {
		t.Fatal(err)
	}
	r := llama.NewRunner(m, 4)
	pool, err := r.NewPool(4 << 20)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := llama.NewKVCache(c, pool)
	if err != nil {
		t.Fatal(err)
	}
	shape := cp.Shape{Heads: c.NumAttentionHeads, KVHeads: c.NumKeyValueHeads, HeadDim: c.HeadDim, Window: c.Window}
	g, err := cp.StartInProcess(shape, c.VocabSize, forwards(t, c, w, 3, kv), kv.Layers, dist.Options{Timeout: 30 * time.Second})
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

// TestCPConformance runs core/runnertest's suite (prefill equals decode, chunked prefill,
// batch and page-layout invariance, reproducibility, prefix hits, aborts) on the CP=3
// runner: the prompts' first plans split, the rest on rank 0.
func TestCPConformance(t *testing.T) {
	runnertest.Run(t, cpRunner, runnertest.Options{})
}

// TestLeadRefusesBeforeBroadcast: a split plan rank 0 refuses (a logits buffer of the
// wrong size, a token outside the vocabulary) never reaches the others, so the next
// plan runs at once rather than after the collectives' deadline.
func TestLeadRefusesBeforeBroadcast(t *testing.T) {
	c, w := tiny(t)
	pool, err := engine.NewHostPool(llama.CacheGroups(c, 4), 4<<20)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := llama.NewKVCache(c, pool)
	if err != nil {
		t.Fatal(err)
	}
	shape := cp.Shape{Heads: c.NumAttentionHeads, KVHeads: c.NumKeyValueHeads, HeadDim: c.HeadDim, Window: c.Window}
	g, err := cp.StartInProcess(shape, c.VocabSize, forwards(t, c, w, 2, kv), kv.Layers, dist.Options{Timeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	seq := runnertest.OpenSeq(t, pool, runnertest.Prompt(5, c.VocabSize, 1))
	plan := runnertest.Plan(t, pool, []*runnertest.Seq{seq}, []int{5}, false)
	bad := *plan
	bad.Tokens = append([]int32{int32(c.VocabSize)}, plan.Tokens[1:]...)
	done := make(chan string, 1)
	go func() {
		switch {
		case g.Forward(plan, make([]float32, 3)) == nil:
			done <- "a 3-value logits buffer accepted"
		case g.Forward(&bad, make([]float32, c.VocabSize)) == nil:
			done <- "a token outside the vocabulary accepted"
		default:
			if err := g.Forward(plan, make([]float32, c.VocabSize)); err != nil {
				done <- err.Error()
			}
			done <- ""
		}
	}()
	select {
	case failed := <-done:
		if failed != "" {
			t.Fatal(failed)
		}
	case <-time.After(time.Minute):
		t.Fatal("the group hung on a refused plan")
	}
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestCPContinuationEqualsOneRank: plans whose new tokens follow cached ones split over
// the cp group too, and give models/llama's own logits within 1e-5 of each row's largest
// (cptest.Continuation): a 37-token prompt fed in chunks of 13, 11 and 13 tokens (every
// row's logits), then a second prompt sharing its first 24 tokens, opened through the
// prefix cache and fed its other 10 tokens in one plan, then 8 greedy decode steps of
// each from rank 0's cache. CP=2 and CP=3, with full attention and with a 5-token window
// (rank 0 then sends only the cached tokens the window reaches). It fails when rank 0
// keeps the cached keys to itself: the other ranks' queries would miss them.
func TestCPContinuationEqualsOneRank(t *testing.T) {
	for _, tc := range []struct{ size, window int }{{2, 0}, {3, 0}, {2, 5}} {
		c, w := tiny(t)
		c.Window = tc.window
		ref1, err := llama.NewModel(c, w, 256)
		if err != nil {
			t.Fatal(err)
		}
		newPool := func() (*kvslab.Pool, *llama.KVCache) {
			pool, err := engine.NewHostPool(llama.CacheGroups(c, 4), 4<<20)
			if err != nil {
				t.Fatal(err)
			}
			kv, err := llama.NewKVCache(c, pool)
			if err != nil {
				t.Fatal(err)
			}
			return pool, kv
		}
		poolRef, kvRef := newPool()
		poolCP, kvCP := newPool()
		shape := cp.Shape{Heads: c.NumAttentionHeads, KVHeads: c.NumKeyValueHeads, HeadDim: c.HeadDim, Window: c.Window}
		g, err := cp.StartInProcess(shape, c.VocabSize, forwards(t, c, w, tc.size, kvCP), kvCP.Layers, dist.Options{Timeout: 30 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		what := fmt.Sprintf("cp=%d window %d", tc.size, tc.window)
		cptest.SameContinuation(t, what, func(p *engine.BatchPlan, logits []float32) error { return ref1.Forward(p, kvRef, logits) }, poolRef, g.Forward, poolCP, c.VocabSize, cp.Splits)
		if err := g.Close(); err != nil {
			t.Fatal(err)
		}
	}
}
