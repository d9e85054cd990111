package deepseekv4flash

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/dspark"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kernels/ref"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/core/runnertest"
	"github.com/resin-llm/resin/core/weights"
)

// dsparkConfigJSON is the tiny config as a DeepSeek-V4-Flash-DSpark one: block size
// block, taps of main layers 1 and 3, Markov rank 8, the default three stages.
func dsparkConfigJSON(block int) string {
	return strings.Replace(tinyConfigJSON, `"model_type": "deepseek_v4",`, fmt.Sprintf(
		`"model_type": "deepseek_v4", "dspark_block_size": %d, "dspark_noise_token_id": 95, "dspark_target_layer_ids": [1, 3], "dspark_markov_rank": 8,`, block), 1)
}

// dsparkRandomDir is a directory holding only a DSpark config: Load builds seeded random
// main weights and drafter stages for it (what --random-weights runs).
func dsparkRandomDir(t testing.TB, block int) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(dsparkConfigJSON(block)), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// openDSpark loads dir with opts (DSpark when ds is set) and builds its pool.
func openDSpark(t testing.TB, dir string, ds *DSparkOptions) (*Runner, *kvslab.Pool) {
	t.Helper()
	r, err := Load(dir, Options{PageTokens: 8, DSpark: ds})
	if err != nil {
		t.Fatal(err)
	}
	pool, err := r.NewPool(8 << 20)
	if err != nil {
		t.Fatal(err)
	}
	return r, pool
}

// dsparkPrompts are specPrompts (lengths that put the blocks at every offset of the
// compression windows) and two that share a 16-token prefix with the first of them, so
// that they start from a prefix-cache hit.
func dsparkPrompts(vocab int) [][]int32 {
	ps := specPrompts(vocab)
	prefix := runnertest.Prompt(16, vocab, 40)
	return append(ps, prefix, append(slices.Clone(prefix), runnertest.Prompt(3, vocab, 41)...),
		append(slices.Clone(prefix), runnertest.Prompt(6, vocab, 42)...))
}

// TestDSparkGreedyEqualsPlain: through the engine, greedy decoding with the DSpark
// drafter gives what the main model alone gives, token for token (log probabilities
// within 1e-5), for a batch of mixed lengths with prefix-cache hits, at two step
// budgets: with the random drafter's own drafts and with drafts forced right except at
// every fifth position (none, some and all of a block accepted, at every block offset).
// The engine's counters and metrics see the drafts.
func TestDSparkGreedyEqualsPlain(t *testing.T) {
	for _, block := range []int{3, 5, 9} {
		t.Run(fmt.Sprintf("block=%d", block), func(t *testing.T) { testDSparkGreedy(t, block) })
	}
}

// testDSparkGreedy is TestDSparkGreedyEqualsPlain for one block size: 3 feeds at most a
// CSA window (ratio 4) per verification, 5 shares its slots and closes two of its
// windows, 9 closes two HCA windows (ratio 8), which the undo log must all restore.
func testDSparkGreedy(t *testing.T, block int) {
	dir := dsparkRandomDir(t, block)
	plainR, _ := openDSpark(t, dir, nil)
	v := plainR.Model.Config.VocabSize
	prompts := dsparkPrompts(v)
	sp := engine.SamplingParams{MaxTokens: 20, IgnoreEOS: true, Logprobs: true, TopLogprobs: 2}
	for _, budget := range []int{0, 13} {
		r, pool := openDSpark(t, dir, nil)
		want, _ := generate(t, r, pool, prompts, sp, budget)
		full := map[int][]int32{}
		for i, p := range prompts {
			full[len(p)] = append(slices.Clone(p), want[i].Tokens...)
		}
		for _, forced := range []bool{false, true} {
			r, pool := openDSpark(t, dir, &DSparkOptions{})
			if r.DSparkMaxDrafts() != block {
				t.Fatalf("block %d: %d drafts per block", block, r.DSparkMaxDrafts())
			}
			if forced {
				r.forceDraft = forcedDraft(full, 5, v)
			}
			got, c := generate(t, r, pool, prompts, sp, budget)
			what := fmt.Sprintf("budget %d forced %v", budget, forced)
			for i := range prompts {
				if !slices.Equal(got[i].Tokens, want[i].Tokens) {
					t.Fatalf("%s: prompt of %d tokens: %v with DSpark, %v without", what, len(prompts[i]), got[i].Tokens, want[i].Tokens)
				}
				for j, lp := range got[i].Logprobs {
					if d := float64(lp.Logprob - want[i].Logprobs[j].Logprob); d > 1e-5 || d < -1e-5 {
						t.Fatalf("%s: prompt %d token %d: logprob %g, want %g", what, i, j, lp.Logprob, want[i].Logprobs[j].Logprob)
					}
				}
			}
			if c.DraftsProposed == 0 || forced && (c.DraftsAccepted == 0 || c.DraftsAccepted == c.DraftsProposed) || budget > 0 && c.PrefixHits == 0 {
				t.Errorf("%s: %d drafts, %d accepted, %d prefix hits", what, c.DraftsProposed, c.DraftsAccepted, c.PrefixHits)
			}
			t.Logf("%s: %d drafts, %d accepted, %d prefix hits", what, c.DraftsProposed, c.DraftsAccepted, c.PrefixHits)
		}
	}
}

// TestDSparkRunnerConformance runs core/runnertest's suite (prefix hits, preemption,
// aborts, batches, seeded sampling) on the DSpark runner. Its Drafts check wants sampled
// output token-identical to the runner without drafts, which holds for one-hot drafts
// (MTP) but not for DSpark's sampled ones: rejection sampling with q keeps the output's
// distribution, not its tokens. TestDSparkGreedyEqualsPlain checks the greedy half.
func TestDSparkRunnerConformance(t *testing.T) {
	dir := dsparkRandomDir(t, 3)
	runnertest.Run(t, func(t testing.TB) (engine.Runner, *kvslab.Pool) { return openDSpark(t, dir, &DSparkOptions{}) },
		runnertest.Options{MaxTokens: 10, Skip: map[string]string{
			"Drafts": "sampled drafts keep the output's distribution, not its tokens; TestDSparkGreedyEqualsPlain checks greedy",
		}})
}

// TestDSparkSampledAndTrace: at temperature 0.8 the DSpark runner verifies its sampled
// drafts by rejection sampling and generates every token asked for; with a confidence
// cut of 0.5 it proposes fewer drafts than full blocks; the trace has one line per
// verification, its anchor the position the drafts followed, at most its drafts
// accepted.
func TestDSparkSampledAndTrace(t *testing.T) {
	dir := dsparkRandomDir(t, 3)
	prompts := dsparkPrompts(96)
	sp := engine.SamplingParams{MaxTokens: 12, IgnoreEOS: true, Temperature: 0.8, Seed: 5, HasSeed: true}
	var proposed [2]uint64
	for k, cut := range []float32{0, 0.5} {
		var trace []dspark.TraceEntry
		r, pool := openDSpark(t, dir, &DSparkOptions{Confidence: cut, Trace: func(e dspark.TraceEntry) { trace = append(trace, e) }})
		got, c := generate(t, r, pool, prompts, sp, 0)
		for i := range prompts {
			if len(got[i].Tokens) != sp.MaxTokens {
				t.Fatalf("cut %g: prompt %d: %d tokens, want %d", cut, i, len(got[i].Tokens), sp.MaxTokens)
			}
		}
		if len(trace) == 0 {
			t.Fatalf("cut %g: no verification traced (%d drafts)", cut, c.DraftsProposed)
		}
		var accepted uint64
		for _, e := range trace {
			if e.Accepted < 0 || e.Accepted > len(e.Drafts) || len(e.Drafts) > 3 || e.AnchorPosition < 5 {
				t.Fatalf("cut %g: trace entry %+v", cut, e)
			}
			accepted += uint64(e.Accepted)
		}
		if accepted != c.DraftsAccepted {
			t.Errorf("cut %g: the trace accepts %d drafts, the engine counted %d", cut, accepted, c.DraftsAccepted)
		}
		proposed[k] = c.DraftsProposed
	}
	if proposed[1] >= proposed[0] {
		t.Errorf("a confidence cut of 0.5 proposed %d drafts, full blocks %d", proposed[1], proposed[0])
	}
}

// TestDSparkCheckpoint: a checkpoint holding the main weights and three random drafter
// stages in mtp.0-2 (vLLM's names) loads with its stages and generates greedily what the
// main model alone generates from the same checkpoint; a mis-shaped stage tensor, a
// DSpark load of a checkpoint without dspark_* keys, a bad confidence threshold and an
// MTP runner asked for DSpark too are refused by name.
func TestDSparkCheckpoint(t *testing.T) {
	c := tinyConfig(t)
	main, err := RandomWeights(c, 3, false).Tensors(c, weights.F32, UpstreamNames)
	if err != nil {
		t.Fatal(err)
	}
	withMain := func(ts []weights.Tensor) []weights.Tensor { return append(ts, main...) }
	dir := dsparkDir(t, withMain)
	plain, _ := openDSpark(t, dir, nil)
	if plain.DSparkMaxDrafts() != 0 {
		t.Fatal("a DSpark checkpoint loaded without DSpark drafts")
	}
	prompts := specPrompts(c.VocabSize)[:3]
	sp := engine.SamplingParams{MaxTokens: 10, IgnoreEOS: true}
	want, _ := generate(t, plain, mustPool(t, plain), prompts, sp, 0)
	r, pool := openDSpark(t, dir, &DSparkOptions{MaxDrafts: 2})
	if r.DSparkMaxDrafts() != 2 {
		t.Fatalf("MaxDrafts 2: %d per block", r.DSparkMaxDrafts())
	}
	got, cnt := generate(t, r, pool, prompts, sp, 0)
	for i := range prompts {
		if !slices.Equal(got[i].Tokens, want[i].Tokens) {
			t.Fatalf("prompt %d: %v with DSpark, %v without", i, got[i].Tokens, want[i].Tokens)
		}
	}
	if cnt.DraftsProposed == 0 {
		t.Error("no drafts proposed")
	}
	bad := dsparkDir(t, func(ts []weights.Tensor) []weights.Tensor {
		for i := range ts {
			if ts[i].Name == "mtp.1.attn.wkv.weight" {
				ts[i].Shape = []int{ts[i].Shape[1], ts[i].Shape[0]}
			}
		}
		return withMain(ts)
	})
	plainDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(plainDir, "config.json"), []byte(tinyConfigJSON), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		dir  string
		opts Options
		want string
	}{
		{bad, Options{DSpark: &DSparkOptions{}}, "mtp.1.attn.wkv.weight"},
		{plainDir, Options{DSpark: &DSparkOptions{}}, "no dspark_* keys"},
		{dir, Options{DSpark: &DSparkOptions{Confidence: 1.5}}, "not in [0, 1]"},
		{dir, Options{DSpark: &DSparkOptions{}, Drafts: 1}, "one speculative method at a time"},
		{dir, Options{DSpark: &DSparkOptions{}, DType: ref.DTypeBF16}, "fp32 only"},
	} {
		if _, err := Load(tc.dir, tc.opts); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: err = %v, want it to say %q", tc.opts, err, tc.want)
		}
	}
}

func mustPool(t testing.TB, r *Runner) *kvslab.Pool {
	t.Helper()
	pool, err := r.NewPool(8 << 20)
	if err != nil {
		t.Fatal(err)
	}
	return pool
}

// TestDSparkBlockAttention checks the block forward's attention span on its own: a
// block reads the context rows of the last sliding_window positions before its anchor
// and no earlier one, and every slot sees every other (slot 0's output depends on the
// noise slots' tokens, which only non-causal attention allows).
func TestDSparkBlockAttention(t *testing.T) {
	r, _ := openDSpark(t, dsparkRandomDir(t, 3), &DSparkOptions{})
	d := r.dspark.d
	c := r.Model.Config
	P := c.SlidingWindow + 5
	rows := func(seed uint64) []Rows {
		var out []Rows
		for s := range d.Config.Stages {
			m := &memRows{dim: c.HeadDim, rows: rnd(rand.New(rand.NewPCG(seed, uint64(s))), P*c.HeadDim, 1)}
			out = append(out, m)
		}
		return out
	}
	run := func(ctx []Rows) *dspark.Block {
		b, err := d.Blocks([]BlockInput{{Anchor: 7, Position: P, Context: ctx}})
		if err != nil {
			t.Fatal(err)
		}
		return b[0]
	}
	base := run(rows(1))
	old := rows(1)
	for _, m := range old {
		for i := range P - c.SlidingWindow { // positions before the window
			clear(m.(*memRows).Row(i))
		}
	}
	if !slices.Equal(run(old).Logits, base.Logits) {
		t.Error("the block read a context row before its sliding window")
	}
	inWin := rows(1)
	clear(inWin[2].(*memRows).Row(P - c.SlidingWindow))
	if slices.Equal(run(inWin).Logits, base.Logits) {
		t.Error("the block did not read the first row of its window")
	}
	d.Config.NoiseTokenID = 3 // other noise tokens: slot 0 must see them
	v := c.VocabSize
	if slices.Equal(run(rows(1)).Logits[:v], base.Logits[:v]) {
		t.Error("slot 0's logits do not depend on the other slots: the attention is causal")
	}
}

// memRows is Rows in one slice.
type memRows struct {
	dim  int
	rows []float32
}

func (m *memRows) Row(i int) []float32 { return m.rows[i*m.dim : (i+1)*m.dim] }

// TestDSparkPrefixHitDrafts: a request that starts from a prefix-cache hit drafts from
// its first step with the draft context the pool restored: its blocks, verification by
// verification, are the ones it proposes when it computes the whole prompt itself.
func TestDSparkPrefixHitDrafts(t *testing.T) {
	dir := dsparkRandomDir(t, 3)
	prefix := runnertest.Prompt(20, 96, 50)
	a := append(slices.Clone(prefix), runnertest.Prompt(2, 96, 51)...)
	b := append(slices.Clone(prefix), runnertest.Prompt(5, 96, 52)...)
	sp := engine.SamplingParams{MaxTokens: 12, IgnoreEOS: true}
	run := func(prompts ...[]int32) ([]dspark.TraceEntry, engine.Counters) {
		var trace []dspark.TraceEntry
		r, pool := openDSpark(t, dir, &DSparkOptions{Trace: func(e dspark.TraceEntry) { trace = append(trace, e) }})
		s := runnertest.New(t, func(testing.TB) (engine.Runner, *kvslab.Pool) { return r, pool }, runnertest.Options{})
		h := s.StartWith(t, r, pool, engine.Config{})
		for _, p := range prompts {
			trace = trace[:0]
			h.GenerateAll(t, [][]int32{p}, sp)
		}
		c := h.Counters()
		h.Stop(t)
		return trace, c
	}
	hit, c := run(a, b)
	alone, _ := run(b)
	if c.PrefixHits == 0 {
		t.Fatal("the second request got no prefix-cache hit")
	}
	if len(hit) == 0 || len(hit) != len(alone) {
		t.Fatalf("%d verifications after a prefix hit, %d alone", len(hit), len(alone))
	}
	if hit[0].AnchorPosition != len(b) {
		t.Errorf("the first verification after the hit is of the block anchored at %d, want %d (the first step drafts)", hit[0].AnchorPosition, len(b))
	}
	for i := range hit {
		if hit[i].AnchorPosition != alone[i].AnchorPosition || !slices.Equal(hit[i].Drafts, alone[i].Drafts) {
			t.Fatalf("verification %d: after a prefix hit %+v, alone %+v", i, hit[i], alone[i])
		}
	}
}
