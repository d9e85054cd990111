package demo

// The model's own tests: yours to extend as the model becomes real (config mapping,
// the naive forward, weight names). The model-agnostic checks are in conformance_test.go,
// which resin-new keeps up to date; they get the runner from testRunner below.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
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

// tinyConfig is the scaffold's config.json shrunk to a size the tests run in milliseconds,
// keeping the variant (GQA ratio, biases, q/k norm, tied head, rope scaling).
func tinyConfig(t testing.TB) *Config {
	t.Helper()
	c, err := LoadConfig(".")
	if err != nil {
		t.Fatal(err)
	}
	group := c.NumAttentionHeads / c.NumKeyValueHeads
	c.NumKeyValueHeads = 2
	c.NumAttentionHeads = 2 * min(group, 4)
	c.HeadDim = 16
	c.HiddenSize = 64
	c.IntermediateSize = 96
	c.NumHiddenLayers = 2
	c.VocabSize = min(c.VocabSize, 384)
	if c.Window > 0 {
		c.Window = 5 // short enough that the tests cross it
	}
	return c
}

// tinyModel writes seeded random weights of the tiny config to safetensors as dt and loads
// them back through the real loader.
func tinyModel(t testing.TB, dt weights.DType) (*Config, *Weights, *Model) {
	t.Helper()
	return tinyModelDType(t, dt, ref.DTypeFP32)
}

// tinyModelDType is tinyModel multiplying the projections in mt (ref.DType).
func tinyModelDType(t testing.TB, dt weights.DType, mt ref.DType) (*Config, *Weights, *Model) {
	t.Helper()
	c := tinyConfig(t)
	dir := t.TempDir()
	if err := RandomWeights(c, 7).Save(c, dir, dt); err != nil {
		t.Fatal(err)
	}
	ck, err := weights.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	w, err := LoadWeights(c, ck)
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewModelDType(c, w, 256, mt)
	if err != nil {
		t.Fatal(err)
	}
	return c, w, m
}

func newPool(t testing.TB, c *Config) (*kvslab.Pool, *KVCache) {
	t.Helper()
	pool, err := engine.NewHostPool(CacheGroups(c, 4), 4<<20)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := NewKVCache(c, pool)
	if err != nil {
		t.Fatal(err)
	}
	return pool, kv
}

// step feeds n[i] more tokens of seqs[i] through the reference forward and returns the
// logits (every row when all is set, else each sequence's last row).
func step(t testing.TB, m *Model, pool *kvslab.Pool, kv *KVCache, seqs []*runnertest.Seq, n []int, all bool) []float32 {
	t.Helper()
	p := runnertest.Plan(t, pool, seqs, n, all)
	logits := make([]float32, len(p.LogitsIndices)*m.Config.VocabSize)
	if err := m.Forward(p, kv, logits); err != nil {
		t.Fatal(err)
	}
	return logits
}

// testRunner is the tiny model's runner bound to a small pool: what conformance_test.go
// (the scaffold's file) runs core/runnertest's suite and BenchmarkExecute on.
func testRunner(t testing.TB) (engine.Runner, *kvslab.Pool) {
	t.Helper()
	return testRunnerDType(t, ref.DTypeFP32)
}

// testRunnerDType is testRunner with the projections in dt, for the suite on every dtype.
func testRunnerDType(t testing.TB, dt ref.DType) (engine.Runner, *kvslab.Pool) {
	t.Helper()
	_, _, m := tinyModelDType(t, weights.BF16, dt)
	r := NewRunner(m, 4)
	pool, err := r.NewPool(4 << 20)
	if err != nil {
		t.Fatal(err)
	}
	return r, pool
}

// TestForwardMatchesNaive checks the paged, batched forward against a naive one written
// straight from the transformers modeling code: whole-sequence attention with a causal
// (and sliding-window) mask, rotate_half RoPE, repeat_kv GQA, plain loops in float64.
func TestForwardMatchesNaive(t *testing.T) {
	c, w, m := tinyModel(t, weights.F32)
	toks := runnertest.Prompt(10, c.VocabSize, 6)
	pool, kv := newPool(t, c)
	got := step(t, m, pool, kv, []*runnertest.Seq{runnertest.OpenSeq(t, pool, toks)}, []int{len(toks)}, true)
	want := naiveForward(c, w, m, toks)
	g32 := make([]float32, len(want))
	for i, v := range want {
		g32[i] = float32(v)
	}
	runnertest.CloseTo(t, "paged forward vs naive", got, g32, 1e-4)
}

func naiveForward(c *Config, w *Weights, m *Model, toks []int32) []float64 {
	n, hd, d := len(toks), c.HiddenSize, c.HeadDim
	nh, nkv, inter := c.NumAttentionHeads, c.NumKeyValueHeads, c.IntermediateSize
	eps := c.RMSNormEps
	linear := func(x []float64, wt, bias []float32, in, out int) []float64 {
		rows := len(x) / in
		y := make([]float64, rows*out)
		for r := 0; r < rows; r++ {
			for o := 0; o < out; o++ {
				s := 0.0
				for i := 0; i < in; i++ {
					s += x[r*in+i] * float64(wt[o*in+i])
				}
				if bias != nil {
					s += float64(bias[o])
				}
				y[r*out+o] = s
			}
		}
		return y
	}
	rms := func(x []float64, wt []float32, dim int) []float64 {
		y := make([]float64, len(x))
		for r := 0; r < len(x)/dim; r++ {
			ss := 0.0
			for i := 0; i < dim; i++ {
				ss += x[r*dim+i] * x[r*dim+i]
			}
			inv := 1 / math.Sqrt(ss/float64(dim)+eps)
			for i := 0; i < dim; i++ {
				y[r*dim+i] = x[r*dim+i] * inv * float64(wt[i])
			}
		}
		return y
	}
	cosSin := func(pos, i int) (float64, float64) {
		if c.RopeScaling.Kind() != "default" { // scaled frequencies: take the model's table
			k := pos*(m.rope.Dim/2) + i
			return float64(m.rope.Cos[k]), float64(m.rope.Sin[k])
		}
		a := float64(pos) * math.Pow(c.RopeTheta, -float64(2*i)/float64(d))
		return math.Cos(a), math.Sin(a)
	}
	rope := func(x []float64, heads int) { // rotate_half: pairs (i, i+d/2)
		for p := 0; p < n; p++ {
			for h := 0; h < heads; h++ {
				v := x[(p*heads+h)*d : (p*heads+h+1)*d]
				for i := 0; i < d/2; i++ {
					cs, sn := cosSin(p, i)
					a, b := v[i], v[i+d/2]
					v[i], v[i+d/2] = a*cs-b*sn, b*cs+a*sn
				}
			}
		}
	}
	x := make([]float64, n*hd)
	for p, tok := range toks {
		for i := 0; i < hd; i++ {
			x[p*hd+i] = float64(w.Embed[int(tok)*hd+i])
		}
	}
	for _, l := range w.Layers {
		h := rms(x, l.AttnNorm, hd)
		q := linear(h, l.Q, l.QBias, hd, nh*d)
		k := linear(h, l.K, l.KBias, hd, nkv*d)
		v := linear(h, l.V, l.VBias, hd, nkv*d)
		if c.QKNorm {
			q, k = rms(q, l.QNorm, d), rms(k, l.KNorm, d)
		}
		rope(q, nh)
		rope(k, nkv)
		att := make([]float64, n*nh*d)
		for p := 0; p < n; p++ {
			for hh := 0; hh < nh; hh++ {
				kh := hh / (nh / nkv)
				scores := make([]float64, p+1)
				mx := math.Inf(-1)
				for j := 0; j <= p; j++ {
					scores[j] = math.Inf(-1)
					if c.Window > 0 && p-j >= c.Window {
						continue
					}
					s := 0.0
					for i := 0; i < d; i++ {
						s += q[(p*nh+hh)*d+i] * k[(j*nkv+kh)*d+i]
					}
					scores[j] = s / math.Sqrt(float64(d))
					mx = math.Max(mx, scores[j])
				}
				sum := 0.0
				for j := range scores {
					scores[j] = math.Exp(scores[j] - mx)
					sum += scores[j]
				}
				for j := range scores {
					for i := 0; i < d; i++ {
						att[(p*nh+hh)*d+i] += scores[j] / sum * v[(j*nkv+kh)*d+i]
					}
				}
			}
		}
		o := linear(att, l.O, l.OBias, nh*d, hd)
		for i := range x {
			x[i] += o[i]
		}
		h = rms(x, l.MLPNorm, hd)
		g, u := linear(h, l.Gate, nil, hd, inter), linear(h, l.Up, nil, hd, inter)
		for i := range g {
			g[i] = g[i] / (1 + math.Exp(-g[i])) * u[i]
		}
		o = linear(g, l.Down, nil, inter, hd)
		for i := range x {
			x[i] += o[i]
		}
	}
	return linear(rms(x, w.Norm, hd), w.Head, nil, hd, c.VocabSize)
}

// TestConfigMapping checks that config.json's model_type and flags map to the variant's
// options, and that what the model does not implement is refused with a clear error.
func TestConfigMapping(t *testing.T) {
	data, err := os.ReadFile("config.json")
	if err != nil {
		t.Fatal(err)
	}
	variant := func(edits map[string]any) []byte {
		var m map[string]any
		if err := json.Unmarshal(data, &m); err != nil {
			t.Fatal(err)
		}
		delete(m, "qk_norm") // the scaffold's own answer; each case says what it expects
		for k, v := range edits {
			m[k] = v
		}
		out, _ := json.Marshal(m)
		return out
	}
	for _, c := range []struct {
		edits                  map[string]any
		qkvBias, oBias, qkNorm bool
		window                 int
	}{
		{edits: map[string]any{"model_type": "llama", "attention_bias": true}, qkvBias: true, oBias: true},
		{edits: map[string]any{"model_type": "llama", "attention_bias": false}},
		{edits: map[string]any{"model_type": "qwen2", "attention_bias": false}, qkvBias: true},
		{edits: map[string]any{"model_type": "qwen3", "attention_bias": false}, qkNorm: true},
		{edits: map[string]any{"model_type": "mistral", "sliding_window": 7}, window: 7},
		// transformers' llama has no q/k norm and ignores the key; so does the model.
		{edits: map[string]any{"model_type": "llama", "attention_bias": false, "qk_norm": true}},
	} {
		got, err := ParseConfig(variant(c.edits))
		if err != nil {
			t.Fatalf("%v: %v", c.edits, err)
		}
		if got.QKVBias != c.qkvBias || got.OBias != c.oBias || got.QKNorm != c.qkNorm || got.Window != c.window {
			t.Errorf("%v: qkv bias %v, o bias %v, qk norm %v, window %d; want %v, %v, %v, %d",
				c.edits, got.QKVBias, got.OBias, got.QKNorm, got.Window, c.qkvBias, c.oBias, c.qkNorm, c.window)
		}
	}
	for _, c := range []struct {
		edits map[string]any
		want  string
	}{
		{map[string]any{"mlp_bias": true}, "mlp_bias"},
		{map[string]any{"hidden_act": "gelu"}, "gelu"},
		{map[string]any{"use_sliding_window": true}, "use_sliding_window"},
		// transformers refuses rope_scaling without its required keys; zeros here would
		// silently turn llama3 scaling off or make every frequency infinite.
		{map[string]any{"rope_scaling": map[string]any{"rope_type": "llama3", "factor": 8}}, "low_freq_factor"},
		{map[string]any{"rope_scaling": map[string]any{"rope_type": "llama3", "factor": 8, "low_freq_factor": 4,
			"high_freq_factor": 1, "original_max_position_embeddings": 8192}}, "high_freq_factor"},
		{map[string]any{"rope_scaling": map[string]any{"type": "linear"}}, "factor"},
		{map[string]any{"rope_scaling": map[string]any{"rope_type": "yarn", "factor": 4}}, "yarn"},
		{map[string]any{"partial_rotary_factor": 0.5}, "partial_rotary_factor"},
	} {
		if _, err := ParseConfig(variant(c.edits)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: error %v, want one naming %s", c.edits, err, c.want)
		}
	}
}

// TestSafetensorsRoundTrip checks that random weights saved as bf16, f16 and f32 load back
// through the HF names as the stored values, and that saving what was loaded reproduces
// the file byte for byte.
func TestSafetensorsRoundTrip(t *testing.T) {
	c := tinyConfig(t)
	orig := RandomWeights(c, 11)
	for _, dt := range []weights.DType{weights.BF16, weights.F16, weights.F32} {
		dir := t.TempDir()
		if err := orig.Save(c, dir, dt); err != nil {
			t.Fatal(err)
		}
		ck, err := weights.Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		got, err := LoadWeights(c, ck)
		ck.Close()
		if err != nil {
			t.Fatal(err)
		}
		want, _ := orig.Tensors(c, weights.F32)
		have, _ := got.Tensors(c, weights.F32)
		for i := range want {
			if want[i].Name != have[i].Name {
				t.Fatalf("tensor %d: %s vs %s", i, want[i].Name, have[i].Name)
			}
		}
		if _, ok := ck.Info("model.embed_tokens.weight"); !ok {
			t.Fatal("no model.embed_tokens.weight in the checkpoint")
		}
		for i, v := range orig.Layers[0].Q {
			if g := got.Layers[0].Q[i]; g != weights.Round(v, dt) {
				t.Fatalf("%s: q_proj[%d] = %g, want %g", dt, i, g, weights.Round(v, dt))
			}
		}
		dir2 := t.TempDir()
		if err := got.Save(c, dir2, dt); err != nil {
			t.Fatal(err)
		}
		a, _ := os.ReadFile(filepath.Join(dir, "model.safetensors"))
		b, _ := os.ReadFile(filepath.Join(dir2, "model.safetensors"))
		if string(a) != string(b) {
			t.Fatalf("%s: re-saving the loaded weights changed the file", dt)
		}
	}
	// A checkpoint missing a tensor is an error naming it.
	dir := t.TempDir()
	ts, _ := orig.Tensors(c, weights.F32)
	if err := weights.WriteFile(filepath.Join(dir, "model.safetensors"), ts[1:], nil); err != nil {
		t.Fatal(err)
	}
	ck, err := weights.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	if _, err := LoadWeights(c, ck); err == nil {
		t.Fatal("loading a checkpoint without model.embed_tokens.weight succeeded")
	}
}

// TestEngineGreedy serves the model through core/engine and checks that greedy generation
// equals the argmax loop over the reference forward, for two requests batched together.
func TestEngineGreedy(t *testing.T) {
	c, _, m := tinyModel(t, weights.BF16)
	r := NewRunner(m, 4)
	pool, err := r.NewPool(4 << 20)
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.New(r, engine.Config{Pool: pool})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.Run(ctx); close(done) }()
	defer func() { cancel(); <-done; e.Close() }()

	prompts := [][]int32{runnertest.Prompt(7, c.VocabSize, 4), runnertest.Prompt(5, c.VocabSize, 5)}
	var streams []*engine.Stream
	for _, p := range prompts {
		s, err := e.Submit(ctx, engine.Request{Prompt: p, Sampling: engine.SamplingParams{MaxTokens: 6, IgnoreEOS: true}})
		if err != nil {
			t.Fatal(err)
		}
		streams = append(streams, s)
	}
	for i, s := range streams {
		got, ev, err := s.Collect(ctx)
		if err != nil || ev.Err != nil {
			t.Fatal(err, ev.Err)
		}
		want := greedy(t, m, prompts[i], 6)
		if len(got) != len(want) {
			t.Fatalf("request %d: %v, want %v", i, got, want)
		}
		for j := range got {
			if got[j] != want[j] {
				t.Fatalf("request %d: engine generated %v, reference greedy %v", i, got, want)
			}
		}
	}
}

// tinyDrafter is a seeded random DSpark drafter (core/dspark) for the tiny config: one
// draft layer, blocks of 4, taps on the embeddings and the first layer, a gated Markov
// head and a confidence head.
func tinyDrafter(t testing.TB, c *Config) *dspark.Drafter {
	t.Helper()
	cfg := map[string]any{
		"architectures": []string{dspark.Architecture}, "vocab_size": c.VocabSize,
		"hidden_size": c.HiddenSize, "intermediate_size": 64, "num_hidden_layers": 1,
		"num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16, "rope_theta": 10000,
		"max_position_embeddings": 256, "target_layer_ids": []int{-1, 0}, "num_target_layers": c.NumHiddenLayers,
		"block_size": 4, "mask_token_id": c.VocabSize - 1, "markov_rank": 8, "markov_head_type": "gated",
		"enable_confidence_head": true, "confidence_head_with_markov": true,
	}
	data, _ := json.Marshal(cfg)
	dc, err := dspark.ParseConfig(data)
	if err != nil {
		t.Fatal(err)
	}
	d, err := dspark.New(dc, dspark.RandomWeights(dc, 3), 256)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestDSparkTap checks the feature tap DSpark reads: ForwardTap gives Forward's logits,
// the embeddings at layer −1, and a drafter for another target is refused.
func TestDSparkTap(t *testing.T) {
	c, w, m := tinyModel(t, weights.F32)
	pool, kv := newPool(t, c)
	s := runnertest.OpenSeq(t, pool, runnertest.Prompt(6, c.VocabSize, 1))
	p := runnertest.Plan(t, pool, []*runnertest.Seq{s}, []int{6}, true)
	want := make([]float32, len(p.LogitsIndices)*c.VocabSize)
	if err := m.Forward(p, kv, want); err != nil {
		t.Fatal(err)
	}
	tap := dspark.NewFeatureTap([]int{-1, 0}, []int32{0, 5}, c.HiddenSize)
	got := make([]float32, len(want))
	if err := m.ForwardTap(p, kv, got, tap); err != nil {
		t.Fatal(err)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("logit %d: %g with the tap, %g without", i, got[i], want[i])
		}
	}
	h := c.HiddenSize
	for i, r := range tap.Rows {
		emb := w.Embed[int(p.Tokens[r])*h : int(p.Tokens[r]+1)*h]
		for e := range h {
			if tap.Features[i*2*h+e] != emb[e] {
				t.Fatalf("row %d: tap −1 is not the embedding", r)
			}
		}
	}
	d := tinyDrafter(t, c)
	d.Config.NumTargetLayers = c.NumHiddenLayers + 1
	if _, err := NewRunner(m, 4).UseDSpark(d, 0, 0); err == nil {
		t.Fatal("a drafter built for another depth was accepted")
	}
}

// TestDSparkGreedy: greedy decoding with a DSpark drafter through the engine equals the
// reference greedy decoding, drafts rejected or accepted.
func TestDSparkGreedy(t *testing.T) {
	c, _, m := tinyModel(t, weights.F32)
	r := NewRunner(m, 4)
	if _, err := r.UseDSpark(tinyDrafter(t, c), 0, 0); err != nil {
		t.Fatal(err)
	}
	if r.Info().MaxDrafts != 4 {
		t.Fatalf("MaxDrafts %d, want the block size 4", r.Info().MaxDrafts)
	}
	pool, err := r.NewPool(4 << 20)
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.New(r, engine.Config{Pool: pool})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.Run(ctx); close(done) }()
	defer func() { cancel(); <-done; e.Close() }()
	prompts := [][]int32{runnertest.Prompt(7, c.VocabSize, 4), runnertest.Prompt(3, c.VocabSize, 5)}
	var streams []*engine.Stream
	for _, p := range prompts {
		s, err := e.Submit(ctx, engine.Request{Prompt: p, Sampling: engine.SamplingParams{MaxTokens: 8, IgnoreEOS: true}})
		if err != nil {
			t.Fatal(err)
		}
		streams = append(streams, s)
	}
	for i, s := range streams {
		got, ev, err := s.Collect(ctx)
		if err != nil || ev.Err != nil {
			t.Fatal(err, ev.Err)
		}
		if want := greedy(t, m, prompts[i], 8); !equalTokens(got, want) {
			t.Fatalf("request %d: %v with DSpark, reference greedy %v", i, got, want)
		}
	}
	if n := e.Counters(); n.DraftsProposed == 0 {
		t.Fatal("no drafts proposed")
	}
	// The draft context is in the drafter's cache group: the same prompt again is a prefix
	// hit that drafts from its first step, its output unchanged.
	if g := r.Info().CacheGroups; len(g) != 2 || g[1].Name != dspark.CacheGroupName {
		t.Fatalf("cache groups %+v: want the drafter's last", g)
	}
	long := runnertest.Prompt(5, c.VocabSize, 11)
	want := greedy(t, m, long, 8)
	for round := range 2 {
		before := e.Counters()
		s, err := e.Submit(ctx, engine.Request{Prompt: long, Sampling: engine.SamplingParams{MaxTokens: 8, IgnoreEOS: true}})
		if err != nil {
			t.Fatal(err)
		}
		got, ev, err := s.Collect(ctx)
		if err != nil || ev.Err != nil {
			t.Fatal(err, ev.Err)
		}
		if !equalTokens(got, want) {
			t.Fatalf("round %d: %v with DSpark, reference greedy %v", round, got, want)
		}
		after := e.Counters()
		if round == 1 && (after.PrefixHits == before.PrefixHits || after.DraftsProposed == before.DraftsProposed) {
			t.Fatalf("round 1: %d prefix-hit tokens, %d drafts proposed: want a prefix hit that drafts",
				after.PrefixHits-before.PrefixHits, after.DraftsProposed-before.DraftsProposed)
		}
	}
}

// deepSpecTrace is testdata/dspark/trace.json (scripts/dspark_goldens.py --e2e): DeepSpec's
// greedy decoding loop on a tiny Qwen3 target (testdata/dspark/target) with its drafters,
// one trace line per verification.
type deepSpecTrace struct {
	MaxNewTokens int `json:"max_new_tokens"`
	Cases        []struct {
		Drafter   string              `json:"drafter"`
		Threshold float32             `json:"threshold"`
		Prompt    []int32             `json:"prompt"`
		Tokens    []int32             `json:"tokens"`
		Trace     []dspark.TraceEntry `json:"trace"`
	} `json:"cases"`
}

// TestDSparkDeepSpecTrace runs DeepSpec's recorded decoding through the engine with the
// same target and drafters and matches it verification by verification (the block's
// anchor position, its drafts after the confidence cut, how many were accepted, the token
// after them) and token by token. It skips where the goldens are absent (a new scaffold).
func TestDSparkDeepSpecTrace(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "dspark", "trace.json"))
	if errors.Is(err, os.ErrNotExist) {
		t.Skip("no DeepSpec goldens in testdata/dspark: make them with scripts/dspark_goldens.py --e2e")
	}
	if err != nil {
		t.Fatal(err)
	}
	var g deepSpecTrace
	if err := json.Unmarshal(data, &g); err != nil {
		t.Fatal(err)
	}
	type run struct {
		drafter   string
		threshold float32
	}
	runs := map[run][]int{}
	var order []run
	for i, c := range g.Cases {
		k := run{c.Drafter, c.Threshold}
		if runs[k] == nil {
			order = append(order, k)
		}
		runs[k] = append(runs[k], i)
	}
	for _, k := range order {
		r, err := Load(filepath.Join("testdata", "dspark", "target"), Options{MaxContext: 64})
		if err != nil {
			t.Fatal(err)
		}
		d, err := dspark.Load(filepath.Join("testdata", "dspark", k.drafter), 64)
		if err != nil {
			t.Fatal(err)
		}
		spec, err := r.UseDSpark(d, 0, k.threshold)
		if err != nil {
			t.Fatal(err)
		}
		got := map[uint64][]dspark.TraceEntry{}
		spec.Trace = func(e dspark.TraceEntry) { got[e.Request] = append(got[e.Request], e) }
		pool, err := r.NewPool(4 << 20)
		if err != nil {
			t.Fatal(err)
		}
		e, err := engine.New(r, engine.Config{Pool: pool})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { e.Run(ctx); close(done) }()
		var streams []*engine.Stream
		for _, ci := range runs[k] {
			// Room past DeepSpec's tokens, so the engine never feeds fewer drafts than
			// proposed in the verifications DeepSpec recorded.
			sp := engine.SamplingParams{MaxTokens: g.MaxNewTokens + d.Config.BlockSize + 1, IgnoreEOS: true}
			s, err := e.Submit(ctx, engine.Request{Prompt: g.Cases[ci].Prompt, Sampling: sp})
			if err != nil {
				t.Fatal(err)
			}
			streams = append(streams, s)
		}
		var outs [][]int32
		for _, s := range streams {
			toks, ev, err := s.Collect(ctx)
			if err != nil || ev.Err != nil {
				t.Fatal(k, err, ev.Err)
			}
			outs = append(outs, toks)
		}
		// The engine numbers requests in the order they were submitted.
		var ids []uint64
		for id := range got {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		if len(ids) != len(streams) {
			t.Fatalf("%v: traces of %d requests, %d submitted", k, len(ids), len(streams))
		}
		for j := range streams {
			c := &g.Cases[runs[k][j]]
			name := fmt.Sprintf("%s cut %g prompt %v", k.drafter, k.threshold, c.Prompt)
			toks := outs[j]
			if len(toks) < len(c.Tokens) {
				t.Fatalf("%s: %d tokens, DeepSpec %d", name, len(toks), len(c.Tokens))
			}
			if !equalTokens(toks[:len(c.Tokens)], c.Tokens) {
				t.Errorf("%s: tokens %v, DeepSpec %v", name, toks[:len(c.Tokens)], c.Tokens)
			}
			tr := got[ids[j]]
			for v, want := range c.Trace {
				if v >= len(tr) {
					t.Errorf("%s: %d verifications, DeepSpec %d", name, len(tr), len(c.Trace))
					break
				}
				w := tr[v]
				if w.AnchorPosition != want.AnchorPosition || !equalTokens(w.Drafts, want.Drafts) || w.Accepted != want.Accepted || w.Next != want.Next {
					t.Errorf("%s: verification %d: %+v, DeepSpec %+v", name, v, w, want)
					break
				}
			}
		}
		cancel()
		<-done
		e.Close()
	}
}

func equalTokens(a, b []int32) bool {
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

// greedy decodes n tokens by argmax on the reference forward alone.
func greedy(t *testing.T, m *Model, p []int32, n int) []int32 {
	pool, kv := newPool(t, m.Config)
	s := runnertest.OpenSeq(t, pool, append([]int32(nil), p...))
	logits := step(t, m, pool, kv, []*runnertest.Seq{s}, []int{len(p)}, false)
	var out []int32
	for len(out) < n {
		best := int32(0)
		for i, x := range logits {
			if x > logits[best] {
				best = int32(i)
			}
		}
		out = append(out, best)
		s.Tokens = append(s.Tokens, best)
		logits = step(t, m, pool, kv, []*runnertest.Seq{s}, []int{1}, false)
	}
	return out
}

// BenchmarkGenerate measures a batch of 8 sequences on the tiny config: a 64-token
// prefill, then 16 decode steps; it reports decode tokens per second.
func BenchmarkGenerate(b *testing.B) {
	c, _, m := tinyModel(b, weights.F32)
	ones, pre := make([]int, 8), make([]int, 8)
	for i := range ones {
		ones[i], pre[i] = 1, 64
	}
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		pool, kv := newPool(b, c)
		var seqs []*runnertest.Seq
		for j := 0; j < 8; j++ {
			seqs = append(seqs, runnertest.OpenSeq(b, pool, runnertest.Prompt(80, c.VocabSize, j)))
		}
		step(b, m, pool, kv, seqs, pre, false)
		for k := 0; k < 16; k++ {
			step(b, m, pool, kv, seqs, ones, false)
		}
	}
	b.ReportMetric(float64(8*16*b.N)/b.Elapsed().Seconds(), "decode-tokens/s")
}

// TestRandomWeightsThatDoNotFit: a config whose random weights exceed the machine's memory
// is an error naming the figures, not a process killed for out-of-memory.
func TestRandomWeightsThatDoNotFit(t *testing.T) {
	if _, ok := weights.AvailableMemory(); !ok {
		t.Skip("available memory unknown here")
	}
	data, err := os.ReadFile("config.json")
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	m["vocab_size"], m["hidden_size"] = 1<<20, 1<<20 // 4 TiB of embeddings alone
	big, _ := json.Marshal(m)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "config.json"), big, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(dir, Options{}); !errors.Is(err, weights.ErrTooLarge) {
		t.Fatalf("Load of a 4 TiB config: err = %v, want weights.ErrTooLarge", err)
	}
}

// dtypeTol bounds |logit − fp32 logit| / max |fp32 logit| for each dtype the projections
// run in: bf16 rounds each projection's input by at most 2^-9 of it, as llama.cpp's BF16
// does (the tiny model's weights are bf16 already: exact), int8 each weight and
// activation by half its block's scale.
var dtypeTol = map[ref.DType]float64{ref.DTypeBF16: 0.01, ref.DTypeInt8: 0.05}

// TestForwardDTypes: the tiny model's logits with its projections in bf16 and int8 are
// within dtypeTol of fp32's, for a prefill and decode steps after it; and the dtypes hold
// the projections in fewer bytes.
func TestForwardDTypes(t *testing.T) {
	c, _, m32 := tinyModel(t, weights.BF16)
	toks := runnertest.Prompt(12, c.VocabSize, 3)
	run := func(m *Model) []float32 {
		pool, kv := newPool(t, c)
		seq := runnertest.OpenSeq(t, pool, toks)
		out := step(t, m, pool, kv, []*runnertest.Seq{seq}, []int{9}, true)
		for range 3 {
			out = append(out, step(t, m, pool, kv, []*runnertest.Seq{seq}, []int{1}, true)...)
		}
		return out
	}
	want := run(m32)
	var scale float64
	for _, v := range want {
		scale = max(scale, math.Abs(float64(v)))
	}
	for _, dt := range []ref.DType{ref.DTypeBF16, ref.DTypeInt8} {
		_, _, m := tinyModelDType(t, weights.BF16, dt)
		if m.WeightBytes() >= m32.WeightBytes()*3/4 {
			t.Errorf("%s: the projections take %d bytes, fp32 %d", dt, m.WeightBytes(), m32.WeightBytes())
		}
		diff, at := runnertest.MaxAbsDiff(run(m), want)
		t.Logf("%s: max |logit − fp32| = %.3g (%.2g of the largest logit %.3g) at row %d", dt, diff, diff/scale, scale, at/c.VocabSize)
		if !(diff <= dtypeTol[dt]*scale) {
			t.Errorf("%s: logits differ from fp32's by %.3g > %g × %.3g", dt, diff, dtypeTol[dt], scale)
		}
	}
}
