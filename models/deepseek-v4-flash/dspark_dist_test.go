package deepseekv4flash

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/runnertest"
)

// TestDSparkSampledDistribution: at temperature 1 on a vocabulary of 8, the joint
// distribution of the first two tokens generated with the DSpark drafter (block 3,
// confidence cut 0.3) is the main model's: Pearson's statistic over the 64 cells stays
// under the value a correct sampler exceeds with probability about 1e-6. The expected
// probabilities come from the model's own forward over the prompt and each first token.
func TestDSparkSampledDistribution(t *testing.T) {
	const vocab, n = 8, 4000
	cfg := strings.Replace(dsparkConfigJSON(3), `"vocab_size": 96`, `"vocab_size": 8`, 1)
	cfg = strings.Replace(cfg, `"dspark_noise_token_id": 95`, `"dspark_noise_token_id": 7`, 1)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	r, pool := openDSpark(t, dir, &DSparkOptions{Confidence: 0.3})
	prompt := []int32{1, 2, 3}
	softmax := func(tokens []int32) []float64 {
		logits, _, err := r.Model.Forward([]Chunk{{State: r.Model.NewSeqState(), Tokens: tokens}})
		if err != nil {
			t.Fatal(err)
		}
		l := logits[(len(tokens)-1)*vocab:]
		p := make([]float64, vocab)
		var sum float64
		for i := range p {
			p[i] = math.Exp(float64(l[i]))
			sum += p[i]
		}
		for i := range p {
			p[i] /= sum
		}
		return p
	}
	e, err := engine.New(r, engine.Config{Pool: pool, MaxBatchTokens: 2048, MaxSeqs: 256})
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
			s, err := e.Submit(ctx, engine.Request{Prompt: prompt, Sampling: sp})
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
	if c := e.Counters(); c.DraftsProposed == 0 || c.DraftsAccepted == 0 {
		t.Fatalf("%d drafts proposed, %d accepted: the test needs both", c.DraftsProposed, c.DraftsAccepted)
	}
	var exp, got []float64
	p1 := softmax(prompt)
	for a := range int32(vocab) {
		p2 := softmax(append(append([]int32{}, prompt...), a))
		for b := range int32(vocab) {
			exp = append(exp, p1[a]*p2[b]*n)
			got = append(got, counts[[2]int32{a, b}])
		}
	}
	x, bound := runnertest.ChiSquare(t, exp, got)
	t.Logf("chi-square %.1f, bound %.1f; %+v", x, bound, e.Counters())
	if x > bound {
		t.Fatalf("chi-square %.1f exceeds %.1f: the output is not the main model's distribution", x, bound)
	}
}
