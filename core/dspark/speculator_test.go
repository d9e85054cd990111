package dspark

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/cpurunner"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/core/runnertest"
)

// toyTarget is a fake target over the test drafters' vocabulary (32) and hidden size (16):
// the logits of a row are a hash of its token and position, with token 28 (the vanilla
// drafter's favourite) pushed up at two positions in three, so that drafts are accepted in
// part; its features at every layer are a smooth function of the token and position.
type toyTarget struct{ vocab, hidden int }

func (m toyTarget) rowLogits(dst []float32, tok, pos int32) {
	for v := range dst {
		x := uint64(tok)*0x9E3779B97F4A7C15 ^ uint64(pos)*0xBF58476D1CE4E5B9 ^ uint64(v)*0x94D049BB133111EB
		x ^= x >> 29
		x *= 0xBF58476D1CE4E5B9
		dst[v] = float32(x>>40)/(1<<24)*4 - 2
	}
	if pos%3 != 0 && len(dst) > 28 {
		dst[28] += 3
	}
}

func (m toyTarget) Forward(p *engine.BatchPlan, logits []float32) error {
	return m.ForwardTap(p, logits, nil)
}

func (m toyTarget) ForwardTap(p *engine.BatchPlan, logits []float32, tap *FeatureTap) error {
	if len(logits) != len(p.LogitsIndices)*m.vocab {
		return fmt.Errorf("logits buffer of %d for %d rows", len(logits), len(p.LogitsIndices))
	}
	for j, k := range p.LogitsIndices {
		m.rowLogits(logits[j*m.vocab:(j+1)*m.vocab], p.Tokens[k], p.Positions[k])
	}
	x := make([]float32, p.NumTokens()*m.hidden)
	for l := -1; l < 4; l++ {
		for r := range p.NumTokens() {
			for e := range m.hidden {
				x[r*m.hidden+e] = float32(math.Sin(float64(p.Tokens[r])*0.37 + float64(p.Positions[r])*0.11 + float64(e+l)*0.7))
			}
		}
		if err := tap.Capture(l, x); err != nil {
			return err
		}
	}
	return nil
}

func toyInfo() engine.RunnerInfo {
	return engine.RunnerInfo{
		Name: "toy", VocabSize: 32, MaxContext: 64,
		CacheGroups: []kvslab.GroupSpec{{Name: "kv", Kind: kvslab.Full, Layers: 1, BytesPerToken: 8, PageTokens: 4}},
	}
}

// generate runs one request per prompt through an engine on r and returns their tokens.
func generate(t *testing.T, r engine.Runner, prompts [][]int32, sp engine.SamplingParams) ([][]int32, engine.Counters) {
	t.Helper()
	e, err := engine.New(r, engine.Config{MaxBatchTokens: 256, MaxSeqs: 8, CacheBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	defer func() {
		e.Close()
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("engine loop: %v", err)
		}
	}()
	var streams []*engine.Stream
	for _, p := range prompts {
		s, err := e.Submit(context.Background(), engine.Request{Prompt: p, Sampling: sp})
		if err != nil {
			t.Fatal(err)
		}
		streams = append(streams, s)
	}
	out := make([][]int32, len(streams))
	rctx, rcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer rcancel()
	for i, s := range streams {
		for {
			ev, err := s.Recv(rctx)
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if ev.Err != nil {
				t.Fatalf("request %d: %v", i, ev.Err)
			}
			out[i] = append(out[i], ev.Tokens...)
		}
	}
	return out, e.Counters()
}

// TestSpeculatorGreedyLossless: greedy output with the DSpark drafter equals plain greedy
// decoding of the target, for a batch of prompts of mixed lengths, with drafts accepted
// in part; with a confidence cut and a lower draft cap too.
func TestSpeculatorGreedyLossless(t *testing.T) {
	d, err := Load("testdata/vanilla", 64)
	if err != nil {
		t.Fatal(err)
	}
	target := toyTarget{vocab: 32, hidden: 16}
	if err := d.Config.CheckTarget(32, 16, 4); err != nil {
		t.Fatal(err)
	}
	prompts := [][]int32{{1, 2, 3}, {5}, {7, 8, 9, 10, 11, 12, 13}, {28, 28}}
	sp := engine.SamplingParams{MaxTokens: 20, IgnoreEOS: true}
	want, _ := generate(t, cpurunner.New(toyInfo(), target), prompts, sp)
	for _, tc := range []struct {
		max       int
		threshold float32
	}{{0, 0}, {3, 0}, {0, 0.5}} {
		spec := NewSpeculator(target, d, tc.max, tc.threshold)
		got, n := generate(t, cpurunner.New(toyInfo(), spec), prompts, sp)
		for i := range want {
			if !slices.Equal(got[i], want[i]) {
				t.Errorf("max %d cut %g: request %d: %v with DSpark, %v without", tc.max, tc.threshold, i, got[i], want[i])
			}
		}
		if n.DraftsAccepted == 0 || n.DraftsAccepted == n.DraftsProposed {
			t.Errorf("max %d cut %g: %d of %d drafts accepted; the test wants some accepted and some not", tc.max, tc.threshold, n.DraftsAccepted, n.DraftsProposed)
		}
		t.Logf("max %d cut %g: %d of %d drafts accepted", tc.max, tc.threshold, n.DraftsAccepted, n.DraftsProposed)
	}
}

// TestSpeculatorSampled: at temperature 1 sampled drafts go through cpurunner's rejection
// sampling with the q the drafter drew from (DraftDistribution checks the fed drafts are
// the proposed ones), and a request's tokens depend on its seed only, not on its batch.
func TestSpeculatorSampled(t *testing.T) {
	d, err := Load("testdata/rnn", 64)
	if err != nil {
		t.Fatal(err)
	}
	target := toyTarget{vocab: 32, hidden: 16}
	sp := engine.SamplingParams{MaxTokens: 16, IgnoreEOS: true, Temperature: 1, Seed: 7, HasSeed: true}
	alone, _ := generate(t, cpurunner.New(toyInfo(), NewSpeculator(target, d, 0, 0)), [][]int32{{3, 4}}, sp)
	batch, n := generate(t, cpurunner.New(toyInfo(), NewSpeculator(target, d, 0, 0)), [][]int32{{9, 9, 9, 9}, {3, 4}, {1}}, sp)
	if !slices.Equal(alone[0], batch[1]) {
		t.Errorf("a sampled request's tokens depend on its batch: %v alone, %v in a batch", alone[0], batch[1])
	}
	if n.DraftsProposed == 0 {
		t.Errorf("no drafts proposed")
	}
}

// TestSpeculatorPrefixHit: a request that starts from a prefix-cache hit has no draft
// context for the positions it did not compute; it decodes without drafts, its output
// unchanged, and its features are not tapped.
func TestSpeculatorPrefixHit(t *testing.T) {
	d, err := Load("testdata/vanilla", 64)
	if err != nil {
		t.Fatal(err)
	}
	target := toyTarget{vocab: 32, hidden: 16}
	prompt := []int32{1, 2, 3, 4, 5, 6, 7, 8, 9}
	sp := engine.SamplingParams{MaxTokens: 10, IgnoreEOS: true}
	want, _ := generate(t, cpurunner.New(toyInfo(), target), [][]int32{prompt}, sp)
	spec := NewSpeculator(target, d, 0, 0)
	var traced []uint64
	spec.Trace = func(e TraceEntry) { traced = append(traced, e.Request) }
	e, err := engine.New(cpurunner.New(toyInfo(), spec), engine.Config{MaxBatchTokens: 256, MaxSeqs: 8, CacheBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	defer func() { e.Close(); cancel(); <-done }()
	for round := range 2 {
		s, err := e.Submit(ctx, engine.Request{Prompt: prompt, Sampling: sp})
		if err != nil {
			t.Fatal(err)
		}
		got, ev, err := s.Collect(ctx)
		if err != nil || ev.Err != nil {
			t.Fatal(err, ev.Err)
		}
		if !slices.Equal(got, want[0]) {
			t.Fatalf("round %d: %v with DSpark, %v without", round, got, want[0])
		}
	}
	n := e.Counters()
	if n.PrefixHits == 0 {
		t.Skip("the engine served no prefix hit; nothing to check")
	}
	for _, id := range traced {
		if id != traced[0] {
			t.Fatalf("the request served from the prefix cache was drafted (requests %v traced)", traced)
		}
	}
	if len(spec.rows) != 0 {
		t.Fatalf("the last step tapped %d rows of a request without a draft context", len(spec.rows))
	}
}

// TestSpeculatorSampledDistribution: at temperature 1 on a vocabulary of 8, the joint
// distribution of the first two generated tokens with a DSpark drafter (rnn Markov head,
// confidence cut 0.3) is the target's: Pearson's statistic over the 64 cells stays under
// the value a correct sampler exceeds with probability about 1e-6.
func TestSpeculatorSampledDistribution(t *testing.T) {
	const vocab, n = 8, 6000
	cfg := fmt.Sprintf(`{"architectures": ["Qwen3DSparkModel"], "vocab_size": %d, "hidden_size": 16,
		"intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
		"head_dim": 8, "max_position_embeddings": 64, "target_layer_ids": [-1, 1], "num_target_layers": 4,
		"block_size": 3, "mask_token_id": 7, "markov_rank": 4, "markov_head_type": "rnn",
		"enable_confidence_head": true, "confidence_head_with_markov": true}`, vocab)
	c, err := ParseConfig([]byte(cfg))
	if err != nil {
		t.Fatal(err)
	}
	d, err := New(c, RandomWeights(c, 5), 64)
	if err != nil {
		t.Fatal(err)
	}
	target := toyTarget{vocab: vocab, hidden: 16}
	info := toyInfo()
	info.VocabSize = vocab
	spec := NewSpeculator(target, d, 0, 0.3)
	prompts := make([][]int32, n)
	for i := range prompts {
		prompts[i] = []int32{1, 2}
	}
	e, err := engine.New(cpurunner.New(info, spec), engine.Config{MaxBatchTokens: 2048, MaxSeqs: 256, CacheBytes: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	defer func() { e.Close(); cancel(); <-done }()
	counts := map[[2]int32]float64{}
	sp := engine.SamplingParams{MaxTokens: 3, IgnoreEOS: true, Temperature: 1}
	for lo := 0; lo < n; lo += 256 {
		var streams []*engine.Stream
		for range min(256, n-lo) {
			s, err := e.Submit(ctx, engine.Request{Prompt: []int32{1, 2}, Sampling: sp})
			if err != nil {
				t.Fatal(err)
			}
			streams = append(streams, s)
		}
		for _, s := range streams {
			toks, ev, err := s.Collect(ctx)
			if err != nil || ev.Err != nil || len(toks) != 3 {
				t.Fatal(toks, err, ev.Err)
			}
			counts[[2]int32(toks[:2])]++
		}
	}
	if nc := e.Counters(); nc.DraftsProposed == 0 || nc.DraftsAccepted == 0 {
		t.Fatalf("%d drafts proposed, %d accepted: the test needs both", nc.DraftsProposed, nc.DraftsAccepted)
	}
	softmax := func(tok, pos int32) []float64 {
		l := make([]float32, vocab)
		target.rowLogits(l, tok, pos)
		p := make([]float64, vocab)
		var sum float64
		for i, x := range l {
			p[i] = math.Exp(float64(x))
			sum += p[i]
		}
		for i := range p {
			p[i] /= sum
		}
		return p
	}
	var exp, got []float64
	p1 := softmax(2, 1)
	for a := range int32(vocab) {
		p2 := softmax(a, 2)
		for b := range int32(vocab) {
			exp = append(exp, p1[a]*p2[b]*n)
			got = append(got, counts[[2]int32{a, b}])
		}
	}
	x, bound := runnertest.ChiSquare(t, exp, got)
	t.Logf("chi-square %.1f, bound %.1f", x, bound)
	if x > bound {
		t.Fatalf("chi-square %.1f exceeds %.1f: the output is not the target's distribution", x, bound)
	}
}
