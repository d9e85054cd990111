package gpurunner_test

import (
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	"github.com/resin-llm/resin/core/cpurunner"
	"github.com/resin-llm/resin/core/cudart/emutest"
	"github.com/resin-llm/resin/core/cudart/gputest"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/gpurunner"
	"github.com/resin-llm/resin/core/runnertest"
	"github.com/resin-llm/resin/core/weights"
	"github.com/resin-llm/resin/models/llama"
)

// TestVocabParallel: the shards of a vocabulary are vLLM's (padded to 64, split in equal
// shards), cover every token once in rank order, and a late rank of a small vocabulary
// holds padding only.
func TestVocabParallel(t *testing.T) {
	for _, c := range []struct{ vocab, size, rows int }{
		{261, 2, 160}, {65, 4, 32}, {128256, 8, 16032}, {64, 2, 32}, {1, 3, 22}, {151936, 4, 37984},
	} {
		next := 0
		for r := range c.size {
			start, rows, lo, hi := gpurunner.VocabParallel(c.vocab, r, c.size)
			if rows != c.rows || start != r*rows {
				t.Fatalf("vocab %d, tp %d, rank %d: start %d rows %d, want %d rows from %d", c.vocab, c.size, r, start, rows, c.rows, r*c.rows)
			}
			if lo != min(start, c.vocab) || hi != min(start+rows, c.vocab) || lo != next {
				t.Fatalf("vocab %d, tp %d, rank %d: real rows [%d, %d), want from %d", c.vocab, c.size, r, lo, hi, next)
			}
			next = hi
		}
		if next != c.vocab {
			t.Fatalf("vocab %d, tp %d: shards end at %d", c.vocab, c.size, next)
		}
	}
	if _, _, lo, hi := gpurunner.VocabParallel(65, 3, 4); lo != hi {
		t.Fatalf("vocab 65 over 4: the last rank holds [%d, %d), want none", lo, hi)
	}
}

// tinyTPLlama writes a llama config of vocab tokens, heads query and kv key/value heads
// (the others tinyLlama's) and, with save, its seeded random weights as a checkpoint.
func tinyTPLlama(t *testing.T, vocab, heads, kv int, save bool) string {
	return tinyTPModel(t, `"architectures": ["LlamaForCausalLM"], "model_type": "llama", "tie_word_embeddings": false`, vocab, heads, kv, save)
}

// tinyTPModel is tinyTPLlama for the llama-family variant head names (its architectures,
// model_type and variant keys, JSON members).
func tinyTPModel(t *testing.T, head string, vocab, heads, kv int, save bool) string {
	t.Helper()
	dir := t.TempDir()
	cfg := `{` + head + `, "vocab_size": ` + strconv.Itoa(vocab) + `,
 "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": ` + strconv.Itoa(heads) + `,
 "num_key_value_heads": ` + strconv.Itoa(kv) + `, "head_dim": 16, "hidden_act": "silu", "rms_norm_eps": 1e-5,
 "rope_theta": 10000, "max_position_embeddings": 128, "bos_token_id": 1, "eos_token_id": 2}`
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	if save {
		m, err := llama.Load(dir, llama.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Model.W.Save(m.Model.Config, dir, weights.F32); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func denseModel(t *testing.T, dir string) (*gpurunner.DenseConfig, *gpurunner.DenseWeights) {
	t.Helper()
	m, err := llama.Load(dir, llama.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := m.Model.Config.DenseConfig(m.Model.MaxContext(), 16)
	if err != nil {
		t.Fatal(err)
	}
	return cfg, m.Model.W.DenseWeights()
}

// TestShardDenseVocab: a rank's embedding and head are its shard's rows, then zero rows
// to the shard's size; tied embeddings stay one table.
func TestShardDenseVocab(t *testing.T) {
	cfg, w := denseModel(t, tinyLlama(t))
	h := cfg.Hidden
	for r := range 2 {
		sc, sw, err := gpurunner.ShardDense(cfg, w, r, 2)
		if err != nil {
			t.Fatal(err)
		}
		start, rows, lo, hi := gpurunner.VocabParallel(cfg.Vocab, r, 2)
		if sc.VocabStart != start || sc.VocabShard != rows || sc.Vocab != cfg.Vocab {
			t.Fatalf("rank %d: vocab shard %d rows from %d of %d, want %d from %d", r, sc.VocabShard, sc.VocabStart, sc.Vocab, rows, start)
		}
		for _, c := range []struct {
			name       string
			got, whole []float32
		}{{"embed", sw.Embed, w.Embed}, {"head", sw.Head, w.Head}} {
			if len(c.got) != rows*h || !slices.Equal(c.got[:(hi-lo)*h], c.whole[lo*h:hi*h]) {
				t.Fatalf("rank %d %s: not rows [%d, %d) of the whole", r, c.name, lo, hi)
			}
			if slices.ContainsFunc(c.got[(hi-lo)*h:], func(v float32) bool { return v != 0 }) {
				t.Fatalf("rank %d %s: padding rows not zero", r, c.name)
			}
		}
	}
	tied := *cfg
	tied.TiedEmbeddings = true
	tw := *w
	tw.Head = tw.Embed
	_, sw, err := gpurunner.ShardDense(&tied, &tw, 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	if &sw.Head[0] != &sw.Embed[0] {
		t.Fatal("tied embeddings: the shard's head is not its embedding")
	}
}

// TestLoadDenseShardReadsSlices: each rank's part read from a checkpoint is what
// ShardDense cuts from the whole model, and a rank of two reads about half its bytes
// (its slices of the projections, its vocab shard; the norms whole).
func TestLoadDenseShardReadsSlices(t *testing.T) {
	dir := tinyTPLlama(t, 261, 4, 2, true)
	cfg, w := denseModel(t, dir)
	whole := int64(0)
	for _, r := range []int{0, 1} {
		ck, err := weights.Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		lc, lw, err := gpurunner.LoadDenseShard(cfg, ck, r, 2)
		if err != nil {
			t.Fatal(err)
		}
		read := ck.BytesRead()
		ck.Close()
		sc, sw, err := gpurunner.ShardDense(cfg, w, r, 2)
		if err != nil {
			t.Fatal(err)
		}
		if lc.Heads != sc.Heads || lc.KVHeads != sc.KVHeads || lc.Intermediate != sc.Intermediate || lc.VocabStart != sc.VocabStart || lc.VocabShard != sc.VocabShard {
			t.Fatalf("rank %d: config %+v, ShardDense's %+v", r, lc, sc)
		}
		if !slices.Equal(lw.Embed, sw.Embed) || !slices.Equal(lw.Head, sw.Head) || !slices.Equal(lw.Norm, sw.Norm) {
			t.Fatalf("rank %d: embedding, head or norm differ from ShardDense's", r)
		}
		for i := range sw.Layers {
			a, b := lw.Layers[i], sw.Layers[i]
			for _, p := range [][2][]float32{{a.Q, b.Q}, {a.K, b.K}, {a.V, b.V}, {a.O, b.O}, {a.Gate, b.Gate}, {a.Up, b.Up}, {a.Down, b.Down}, {a.AttnNorm, b.AttnNorm}, {a.MLPNorm, b.MLPNorm}} {
				if !slices.Equal(p[0], p[1]) {
					t.Fatalf("rank %d layer %d: a projection differs from ShardDense's", r, i)
				}
			}
		}
		whole = int64(4 * (cfg.WeightBytes() / 2)) // float32 checkpoint
		if frac := float64(read) / float64(whole); frac > 0.6 {
			t.Fatalf("rank %d read %d of the checkpoint's %d bytes (%.2f), want about half", r, read, whole, frac)
		}
		t.Logf("rank %d of 2 read %d of %d checkpoint bytes", r, read, whole)
	}
	if _, _, err := gpurunner.LoadDenseShard(cfg, mustOpen(t, dir), 0, 3); err == nil {
		t.Fatal("tp=3 over 4 heads: no error")
	}
}

func mustOpen(t *testing.T, dir string) *weights.Checkpoint {
	t.Helper()
	ck, err := weights.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ck.Close() })
	return ck
}

// tpStep is one run of the TP runner: its tokens, their logprobs, its logits rows (with
// capture) and its ranks' step counts.
type tpStep struct {
	tokens   []int32
	logprobs []float32
	logits   [][]float32
	stats    []gpurunner.StepStats
}

func runTP(t *testing.T, shard gpurunner.DenseShard, ordinals []int, eager, capture bool, prompt []int32, steps int) tpStep {
	t.Helper()
	g, pool, err := gpurunner.NewDenseTPShards(shard, ordinals, gpurunner.Options{CacheBytes: 4 << 20, Eager: eager, KernelCache: os.Getenv("RESIN_KERNEL_CACHE"),
		Limits: gpurunner.Limits{MaxTokens: 64, MaxSeqs: 4, MaxRows: 64}})
	if err != nil {
		t.Fatal(err)
	}
	var out tpStep
	if capture {
		g.CaptureLogits(func(row cpurunner.LogitsRow) { out.logits = append(out.logits, slices.Clone(row.Logits)) })
	}
	s := &runnertest.Suite{}
	e := s.StartWith(t, g, pool, engine.Config{MaxBatchTokens: 64, MaxSeqs: 4})
	o := e.Generate(t, prompt, engine.SamplingParams{MaxTokens: steps, IgnoreEOS: true, Logprobs: true, TopLogprobs: 2})
	e.Stop(t)
	out.tokens = o.Tokens
	for _, lp := range o.Logprobs {
		out.logprobs = append(out.logprobs, lp.Logprob)
	}
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	out.stats = g.RankStats()
	return out
}

// TestEmulatedTPGraphsEqualEager: under TP=2 the decode steps replay CUDA graphs with the
// NCCL all-reduces, the embedding's all-reduce and the head's all-gather captured inside,
// on every rank, and give bit for bit what the eager steps give: the tokens and logprobs
// sampled on the device, and every logits row brought back to the host.
func TestEmulatedTPGraphsEqualEager(t *testing.T) {
	if emutest.Reexec(t, "RESIN_EMU_DEVICES=2") {
		return
	}
	tpGraphsEqualEager(t, []int{0, 1})
}

// TestGPUNCCLTPGraphsEqualEager is TestEmulatedTPGraphsEqualEager on a real GPU, its ranks
// placed as TestGPUNCCLTPEqualsOne's (scripts/gpu-check.sh's TP section runs both). Bit
// for bit still: a graph replays the kernels and cuBLASLt algorithms the eager step
// launched, and a sum of two ranks is the same in either order.
func TestGPUNCCLTPGraphsEqualEager(t *testing.T) {
	tpGraphsEqualEager(t, gputest.TwoRankGPUs(t))
}

func tpGraphsEqualEager(t *testing.T, ordinals []int) {
	cfg, w := denseModel(t, tinyLlama(t))
	prompt := runnertest.Prompt(9, cfg.Vocab, 5)
	const steps = 12
	for _, capture := range []bool{false, true} {
		eager := runTP(t, gpurunner.CutDense(cfg, w), ordinals, true, capture, prompt, steps)
		graphs := runTP(t, gpurunner.CutDense(cfg, w), ordinals, false, capture, prompt, steps)
		for r, st := range graphs.stats {
			if st.Graph == 0 || eager.stats[r].Graph != 0 {
				t.Fatalf("capture %v, rank %d: %d graph replays with graphs, %d eager-only", capture, r, st.Graph, eager.stats[r].Graph)
			}
		}
		if len(eager.tokens) != steps || !slices.Equal(graphs.tokens, eager.tokens) {
			t.Fatalf("capture %v: tokens with graphs %v, eager %v", capture, graphs.tokens, eager.tokens)
		}
		if !slices.EqualFunc(graphs.logprobs, eager.logprobs, func(a, b float32) bool { return math.Float32bits(a) == math.Float32bits(b) }) {
			t.Fatalf("capture %v: logprobs with graphs %v, eager %v", capture, graphs.logprobs, eager.logprobs)
		}
		if len(graphs.logits) != len(eager.logits) {
			t.Fatalf("%d logits rows with graphs, %d eager", len(graphs.logits), len(eager.logits))
		}
		for i := range eager.logits {
			if !slices.Equal(graphs.logits[i], eager.logits[i]) {
				t.Fatalf("logits row %d: graphs differ from eager", i)
			}
		}
		t.Logf("parity tp=2 graphs vs eager on %v (logits captured %v): %d tokens, logprobs and %d logits rows bit-identical; steps per rank %+v", ordinals, capture, steps, len(eager.logits), graphs.stats)
	}
}

// TestEmulatedTPUnevenVocab: TP=4 over a vocabulary of 65 tokens (padded to 128, shards of
// 32: the third rank holds one real row, the fourth none), every rank read from a
// checkpoint (ReadDense), equals TP=1: the same greedy tokens, logits within
// tpEmuTolerance, the graphs replayed. The four ranks share one emulated GPU.
func TestEmulatedTPUnevenVocab(t *testing.T) {
	if emutest.Reexec(t) {
		return
	}
	dir := tinyTPLlama(t, 65, 4, 4, true)
	cfg, _ := denseModel(t, dir)
	ck := mustOpen(t, dir)
	prompt := runnertest.Prompt(9, cfg.Vocab, 7)
	const steps = 10
	one := runTP(t, gpurunner.ReadDense(cfg, ck), []int{0}, false, true, prompt, steps)
	four := runTP(t, gpurunner.ReadDense(cfg, ck), []int{0, 0, 0, 0}, false, true, prompt, steps)
	if len(one.tokens) != steps || !slices.Equal(one.tokens, four.tokens) {
		t.Fatalf("greedy tokens: TP=1 %v, TP=4 %v", one.tokens, four.tokens)
	}
	if len(one.logits) != len(four.logits) {
		t.Fatalf("%d logits rows at TP=1, %d at TP=4", len(one.logits), len(four.logits))
	}
	for i := range one.logits {
		if len(four.logits[i]) != cfg.Vocab {
			t.Fatalf("logits row %d holds %d values, want the vocabulary's %d", i, len(four.logits[i]), cfg.Vocab)
		}
		scale, diff := 0.0, 0.0
		for j, b := range one.logits[i] {
			scale = max(scale, math.Abs(float64(b)))
			diff = max(diff, math.Abs(float64(four.logits[i][j]-b)))
		}
		if diff > tpEmuTolerance*scale {
			t.Fatalf("logits row %d: TP=4 differs from TP=1 by %.3g of %.3g", i, diff, scale)
		}
	}
	for r, st := range four.stats {
		if st.Graph == 0 {
			t.Fatalf("rank %d replayed no graph: %+v", r, st)
		}
	}
	t.Logf("TP=4 over vocab 65: %d tokens, %d logits rows within %g of TP=1", steps, len(one.logits), tpEmuTolerance)
}

// TestEmulatedTPVariants: the Qwen-style variants at TP=2, each rank reading its slices of
// a checkpoint (LoadDenseShard's bias, q/k-norm and tied-head paths): llama with q/k/v and
// o biases and tied embeddings (the head is the embedding's vocab shard), and Qwen3 with
// per-head q/k norms. Each rank's part equals ShardDense's cut, and TP=2 gives TP=1's
// greedy tokens with logits within tpEmuTolerance.
func TestEmulatedTPVariants(t *testing.T) {
	if emutest.Reexec(t, "RESIN_EMU_DEVICES=2") {
		return
	}
	for _, v := range []struct{ name, head string }{
		{"llama biased tied", `"architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": true, "tie_word_embeddings": true`},
		{"qwen3", `"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "tie_word_embeddings": false`},
	} {
		dir := tinyTPModel(t, v.head, 261, 4, 2, true)
		cfg, w := denseModel(t, dir)
		if v.name == "qwen3" && !cfg.QKNorm || v.name != "qwen3" && (!cfg.QKVBias || !cfg.OBias || !cfg.TiedEmbeddings) {
			t.Fatalf("%s: config %+v lacks the variant", v.name, cfg)
		}
		ck := mustOpen(t, dir)
		for r := range 2 {
			_, lw, err := gpurunner.LoadDenseShard(cfg, ck, r, 2)
			if err != nil {
				t.Fatalf("%s: %v", v.name, err)
			}
			_, sw, err := gpurunner.ShardDense(cfg, w, r, 2)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(lw.Head, sw.Head) || (cfg.TiedEmbeddings && &lw.Head[0] != &lw.Embed[0]) {
				t.Fatalf("%s rank %d: the head is not ShardDense's (or not the embedding when tied)", v.name, r)
			}
			for i := range sw.Layers {
				a, b := lw.Layers[i], sw.Layers[i]
				for _, p := range [][2][]float32{{a.QBias, b.QBias}, {a.KBias, b.KBias}, {a.VBias, b.VBias}, {a.OBias, b.OBias}, {a.QNorm, b.QNorm}, {a.KNorm, b.KNorm}} {
					if !slices.Equal(p[0], p[1]) {
						t.Fatalf("%s rank %d layer %d: a bias or norm differs from ShardDense's", v.name, r, i)
					}
				}
			}
		}
		prompt := runnertest.Prompt(9, cfg.Vocab, 3)
		const steps = 8
		one := runTP(t, gpurunner.ReadDense(cfg, ck), []int{0}, false, true, prompt, steps)
		two := runTP(t, gpurunner.ReadDense(cfg, ck), []int{0, 1}, false, true, prompt, steps)
		if len(one.tokens) != steps || !slices.Equal(one.tokens, two.tokens) || len(one.logits) != len(two.logits) {
			t.Fatalf("%s: greedy tokens TP=1 %v, TP=2 %v (%d and %d logits rows)", v.name, one.tokens, two.tokens, len(one.logits), len(two.logits))
		}
		worst := 0.0
		for i := range one.logits {
			scale, diff := 0.0, 0.0
			for j, b := range one.logits[i] {
				scale = max(scale, math.Abs(float64(b)))
				diff = max(diff, math.Abs(float64(two.logits[i][j]-b)))
			}
			if diff > tpEmuTolerance*scale {
				t.Fatalf("%s logits row %d: TP=2 differs from TP=1 by %.3g of %.3g", v.name, i, diff, scale)
			}
			worst = max(worst, diff/scale)
		}
		t.Logf("%s: TP=2 from its checkpoint slices equals TP=1 (%d tokens, max relative logits diff %.3g)", v.name, steps, worst)
	}
}
