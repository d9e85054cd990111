package tp_test

import (
	"math"
	"sync"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/cpurunner"
	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/dist/tp"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kernels/ref"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/core/runnertest"
	"github.com/resin-llm/resin/models/llama"
)

// tiny is models/llama's config shrunk as its own tests shrink it (GQA, biases, q/k norm
// and the tied head of the variant kept), with seeded random weights, through llama's
// NewModel (which fuses the projections; the fields stay views of the same values).
func tiny(t testing.TB) *llama.Model {
	c, err := llama.LoadConfig("../../../models/llama")
	if err != nil {
		t.Fatal(err)
	}
	group := c.NumAttentionHeads / c.NumKeyValueHeads
	c.NumKeyValueHeads = 2
	c.NumAttentionHeads = 2 * min(group, 4)
	c.HeadDim, c.HiddenSize, c.IntermediateSize, c.NumHiddenLayers = 16, 64, 96, 2
	c.VocabSize = min(c.VocabSize, 383) // odd: the vocab ranges are uneven
	if c.Window > 0 {
		c.Window = 5
	}
	m, err := llama.NewModel(c, llama.RandomWeights(c, 7), 256)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// fromLlama describes a llama model for tp.
func fromLlama(m *llama.Model, rope *ref.RopeTable) (tp.Dense, *tp.Weights) {
	c := m.Config
	d := tp.Dense{Hidden: c.HiddenSize, HeadDim: c.HeadDim, Heads: c.NumAttentionHeads, KVHeads: c.NumKeyValueHeads,
		Inter: c.IntermediateSize, Vocab: c.VocabSize, Layers: c.NumHiddenLayers, Eps: float32(c.RMSNormEps),
		QKNorm: c.QKNorm, Window: c.Window, Rope: rope}
	w := &tp.Weights{Embed: m.W.Embed, Norm: m.W.Norm, Head: m.W.Head}
	for _, l := range m.W.Layers {
		w.Layers = append(w.Layers, tp.Layer{AttnNorm: l.AttnNorm, MLPNorm: l.MLPNorm, Q: l.Q, K: l.K, V: l.V, O: l.O,
			QBias: l.QBias, KBias: l.KBias, VBias: l.VBias, OBias: l.OBias, QNorm: l.QNorm, KNorm: l.KNorm,
			Gate: l.Gate, Up: l.Up, Down: l.Down})
	}
	return d, w
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

// decode runs a 10-token prompt and 64 greedy steps through models/llama's own forward
// and, on the same plans, through tp with size in-process ranks, rank 0 choosing each
// token and broadcasting it. It returns both models' logits per step and the two token
// streams.
func decode(t *testing.T, size int) (want, got [][]float32, wantToks, gotToks []int32) {
	m := tiny(t)
	c := m.Config
	rope, err := c.RopeTable(256)
	if err != nil {
		t.Fatal(err)
	}
	d, w := fromLlama(m, rope)
	pool, err := engine.NewHostPool(llama.CacheGroups(c, 4), 4<<20)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := llama.NewKVCache(c, pool)
	if err != nil {
		t.Fatal(err)
	}
	comms, err := dist.NewInProcess(size, dist.Options{Timeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	shards := make([]*tp.Shard, size)
	caches := make([][]ref.PagedKV, size)
	for r := range size {
		if shards[r], err = tp.NewShard(d, w, r, size); err != nil {
			t.Fatal(err)
		}
		caches[r] = shards[r].NewCache(64, 4)
	}
	seq := runnertest.OpenSeq(t, pool, runnertest.Prompt(10, c.VocabSize, 3))
	n := len(seq.Tokens)
	for step := 0; step <= 64; step++ {
		plan := runnertest.Plan(t, pool, []*runnertest.Seq{seq}, []int{n}, false)
		ref := make([]float32, c.VocabSize)
		if err := m.Forward(plan, kv, ref); err != nil {
			t.Fatal(err)
		}
		logits := make([][]float32, size)
		toks := make([]int32, size)
		errs := make([]error, size)
		var wg sync.WaitGroup
		for r := range size {
			wg.Add(1)
			go func() {
				defer wg.Done()
				logits[r] = make([]float32, c.VocabSize)
				if errs[r] = shards[r].Forward(comms[r], plan, caches[r], logits[r]); errs[r] != nil {
					return
				}
				var msg []byte
				if r == 0 { // rank 0 samples; the others take its token
					msg = []byte{0, 0, 0, 0}
					tok := argmax(logits[0])
					msg[0], msg[1], msg[2], msg[3] = byte(tok), byte(tok>>8), byte(tok>>16), byte(tok>>24)
				}
				b, err := comms[r].Broadcast(msg, 0)
				if errs[r] = err; err == nil {
					toks[r] = int32(b[0]) | int32(b[1])<<8 | int32(b[2])<<16 | int32(b[3])<<24
				}
			}()
		}
		wg.Wait()
		for r := range size {
			if errs[r] != nil {
				t.Fatalf("step %d rank %d: %v", step, r, errs[r])
			}
			if toks[r] != toks[0] {
				t.Fatalf("step %d: rank %d took token %d, rank 0 sent %d", step, r, toks[r], toks[0])
			}
			for i := range logits[r] {
				if math.Float32bits(logits[r][i]) != math.Float32bits(logits[0][i]) {
					t.Fatalf("step %d: rank %d's logits differ from rank 0's at %d", step, r, i)
				}
			}
		}
		want, got = append(want, ref), append(got, logits[0])
		wantToks, gotToks = append(wantToks, argmax(ref)), append(gotToks, toks[0])
		if wantToks[step] != gotToks[step] {
			return // the caller reports it; the sequences can no longer share plans
		}
		seq.Tokens = append(seq.Tokens, toks[0])
		n = 1
	}
	return
}

// TestTPMatchesSingle: tensor-parallel decoding over 2 in-process ranks gives the logits
// of models/llama's own forward within 1e-5 of the row's largest logit, and the same 65
// greedy tokens (prefill + 64 steps); over 1 rank it gives exactly its bits; two TP=2
// runs are bit-identical.
func TestTPMatchesSingle(t *testing.T) {
	want, got1, wt, gt := decode(t, 1)
	for s := range want {
		for i := range want[s] {
			if math.Float32bits(want[s][i]) != math.Float32bits(got1[s][i]) {
				t.Fatalf("tp=1 step %d logit %d = %g, llama %g", s, i, got1[s][i], want[s][i])
			}
		}
	}
	if len(gt) != 65 || !equal(wt, gt) {
		t.Fatalf("tp=1 tokens %v, llama %v", gt, wt)
	}
	want, got2, wt, gt := decode(t, 2)
	if !equal(wt, gt) || len(gt) != 65 {
		t.Fatalf("tp=2 tokens %v, llama %v", gt, wt)
	}
	worst := 0.0
	for s := range want {
		top := 0.0
		for _, v := range want[s] {
			top = max(top, math.Abs(float64(v)))
		}
		for i := range want[s] {
			d := math.Abs(float64(got2[s][i] - want[s][i]))
			if d > 1e-5*top {
				t.Fatalf("tp=2 step %d logit %d = %g, llama %g (row max %g)", s, i, got2[s][i], want[s][i], top)
			}
			worst = max(worst, d/top)
		}
	}
	t.Logf("tp=2 vs llama: largest difference %.2g of the row's largest logit; tokens %v", worst, gt)
	_, again, _, _ := decode(t, 2)
	for s := range got2 {
		for i := range got2[s] {
			if math.Float32bits(got2[s][i]) != math.Float32bits(again[s][i]) {
				t.Fatalf("two tp=2 runs differ at step %d logit %d", s, i)
			}
		}
	}
}

// TestShardRefusesUnevenHeads: a split the heads do not divide is an error.
func TestShardRefusesUnevenHeads(t *testing.T) {
	m := tiny(t)
	rope, _ := m.Config.RopeTable(16)
	d, w := fromLlama(m, rope)
	if _, err := tp.NewShard(d, w, 0, 3); err == nil {
		t.Fatal("tp=3 accepted for 2 kv heads")
	}
	if _, err := tp.NewShard(d, w, 2, 2); err == nil {
		t.Fatal("rank 2 of 2 accepted")
	}
}

func equal(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// tpRunner is the tiny llama on a TP=2 in-process group behind cpurunner, bound to a pool
// of llama's cache groups (whose page ids the shards' own caches follow).
func tpRunner(t testing.TB) (engine.Runner, *kvslab.Pool) {
	return groupRunner(t, func(d tp.Dense, w *tp.Weights, pages, pageTokens int) (group, error) {
		return tp.StartInProcess(d, w, 2, pages, pageTokens, dist.Options{Timeout: 30 * time.Second})
	})
}

// group is an in-process group of ranks: rank 0's forward and what stops the others.
type group interface {
	Forward(p *engine.BatchPlan, logits []float32) error
	Close() error
}

// groupRunner is the tiny llama on the group start starts behind cpurunner, bound to a
// pool of llama's cache groups, the group closed when t ends.
func groupRunner(t testing.TB, start func(d tp.Dense, w *tp.Weights, pages, pageTokens int) (group, error)) (engine.Runner, *kvslab.Pool) {
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
	g, err := start(d, w, tp.CachePages(d, pool), pool.BlockTokens())
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

// TestTPConformance runs core/runnertest's suite (prefill equals decode, chunked prefill,
// batch and page-layout invariance, reproducibility, prefix hits, aborts) on the TP=2
// runner, rank 0's forward broadcasting each plan to rank 1.
func TestTPConformance(t *testing.T) {
	runnertest.Run(t, tpRunner, runnertest.Options{})
}

// TestLeadRefusesBeforeBroadcast: a step rank 0 refuses (a logits buffer of the wrong
// size, a token outside the vocabulary) is refused before the plan reaches the others, so
// the next step runs at once instead of the group waiting out a deadline.
func TestLeadRefusesBeforeBroadcast(t *testing.T) {
	m := tiny(t)
	rope, _ := m.Config.RopeTable(256)
	d, w := fromLlama(m, rope)
	pool, err := engine.NewHostPool(llama.CacheGroups(m.Config, 4), 4<<20)
	if err != nil {
		t.Fatal(err)
	}
	g, err := tp.StartInProcess(d, w, 2, tp.CachePages(d, pool), 4, dist.Options{Timeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	seq := runnertest.OpenSeq(t, pool, runnertest.Prompt(5, m.Config.VocabSize, 1))
	plan := runnertest.Plan(t, pool, []*runnertest.Seq{seq}, []int{5}, false)
	bad := *plan
	bad.Tokens = append([]int32{int32(m.Config.VocabSize)}, plan.Tokens[1:]...)
	done := make(chan string, 1)
	go func() {
		switch {
		case g.Forward(plan, make([]float32, 3)) == nil:
			done <- "a 3-value logits buffer accepted"
		case g.Forward(&bad, make([]float32, m.Config.VocabSize)) == nil:
			done <- "a token outside the vocabulary accepted"
		default:
			if err := g.Forward(plan, make([]float32, m.Config.VocabSize)); err != nil {
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
		t.Fatal("the steps after a refused one hang") // (the group is left stuck, not closed)
	}
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
}
