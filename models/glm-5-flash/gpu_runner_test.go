package glm5flash

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/resin-llm/resin/core/cudart/emutest"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/gpurunner"
	"github.com/resin-llm/resin/core/runnertest"
)

// gpuLogprobTol bounds |gpu − cpu| / (1 + |cpu|) for a sampled token's log probability
// between GPURunner (fp32 on the emulated device: cuBLASLt's summation order, the
// kernels' exp) and TextRunner on the same tiny model.
const gpuLogprobTol = 1e-4

// TestEmulatedGPUEngineMatchesCPU runs requests through the real engine on GPURunner (the
// emulated device) and on the CPU TextRunner of the same tiny model (KDA, full and
// shared-indexer MLA, dense and MoE layers), with one-shot and with chunked prefill (7
// tokens a step): one request alone, three of different lengths decoding in one batch,
// and prompts that resume from the prefix cache through a KDA checkpoint, one whose shared
// part ends between two checkpoints; greedy tokens equal, every log probability within
// gpuLogprobTol, and the GPU engine counts the prefix hits.
func TestEmulatedGPUEngineMatchesCPU(t *testing.T) {
	if emutest.Reexec(t) {
		return
	}
	engineMatchesCPU(t, openGPUTest(t))
}

// TestGPUEngineMatchesCPU is TestEmulatedGPUEngineMatchesCPU on GPU 0 of a machine with
// a GPU (RESIN_GPU=1; scripts/gpu-check.sh sets it), within the same tolerance.
func TestGPUEngineMatchesCPU(t *testing.T) {
	if os.Getenv("RESIN_GPU") == "" {
		t.Skip("set RESIN_GPU=1 on a machine with a GPU to run the GPU runner against the CPU runner")
	}
	engineMatchesCPU(t, openGPUTest(t))
}

// TestGPUTruncatedMatchesCPU runs the model of RESIN_GLM_CONFIG (scripts/gpu-check.sh
// --glm: testdata/gpu-check/config.json, the first 4 layers of GLM-5.3-Flash at its real
// dimensions, 3 KDA and 1 DSA+MoE; seeded random weights) on GPU 0 (RESIN_GPU=1) and on
// the CPU runner through the engine: a prompt of 40 tokens (two KDA blocks, ten index
// pools of 4) and 4 greedy tokens, then a prompt sharing its first 36 tokens (a prefix hit
// through the checkpoint at 32); tokens equal, log probabilities within
// gpuTruncatedLogprobTol, the largest difference logged as a parity line.
func TestGPUTruncatedMatchesCPU(t *testing.T) {
	path := os.Getenv("RESIN_GLM_CONFIG")
	if os.Getenv("RESIN_GPU") == "" || path == "" {
		t.Skip("set RESIN_GPU=1 and RESIN_GLM_CONFIG to a config.json (scripts/gpu-check.sh --glm) on a machine with a GPU")
	}
	m := configModel(t, path)
	c := m.Config
	kit := openGPUTest(t)
	gr, err := NewGPURunner(m, kit.dev, kit.cache, 4, 128, 4, 0, GPUOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer gr.Close()
	gpool, err := gr.NewPool(1 << 30)
	if err != nil {
		t.Fatal(err)
	}
	cr := NewTextRunner(m, 0, 0)
	cpool, err := cr.NewPool(1 << 30)
	if err != nil {
		t.Fatal(err)
	}
	var s runnertest.Suite
	cfg := engine.Config{MaxBatchTokens: 128, MaxSeqs: 4}
	ge, ce := s.StartWith(t, gr, gpool, cfg), s.StartWith(t, cr, cpool, cfg)
	defer ge.Stop(t)
	defer ce.Stop(t)
	greedy := engine.SamplingParams{MaxTokens: 4, IgnoreEOS: true, Logprobs: true}
	a := runnertest.Prompt(40, c.VocabSize, 1)
	b := append(append([]int32(nil), a[:36]...), 7, 8, 9)
	worst := 0.0
	for _, p := range [][]int32{a, b} {
		g, cp := ge.Generate(t, p, greedy), ce.Generate(t, p, greedy)
		if fmt.Sprint(g.Tokens) != fmt.Sprint(cp.Tokens) {
			t.Fatalf("a prompt of %d tokens: GPU tokens %v, CPU %v", len(p), g.Tokens, cp.Tokens)
		}
		for i := range cp.Logprobs {
			d := math.Abs(float64(g.Logprobs[i].Logprob-cp.Logprobs[i].Logprob)) / (1 + math.Abs(float64(cp.Logprobs[i].Logprob)))
			worst = max(worst, d)
			if !(d <= gpuTruncatedLogprobTol) {
				t.Errorf("a prompt of %d tokens, output %d: logprob %g, the CPU runner %g", len(p), i, g.Logprobs[i].Logprob, cp.Logprobs[i].Logprob)
			}
		}
	}
	t.Logf("parity glm-5-flash truncated (4 layers, real dims, fp32): max |Δ logprob|/(1+|cpu|) %.3g (tolerance %g)", worst, gpuTruncatedLogprobTol)
}

// gpuTruncatedLogprobTol is TestGPUTruncatedMatchesCPU's bound: fp32 on both sides, but
// sums of 4096 to 12288 terms in another order than the Go reference's.
const gpuTruncatedLogprobTol = 1e-3

// sameOutput fails t unless g (the GPU runner's) has c's tokens and log probabilities
// within gpuLogprobTol.
func sameOutput(t *testing.T, what string, g, c runnertest.Output) {
	t.Helper()
	if len(g.Tokens) != len(c.Tokens) || len(g.Logprobs) != len(c.Logprobs) {
		t.Fatalf("%s: %d tokens, the CPU runner %d", what, len(g.Tokens), len(c.Tokens))
	}
	for i := range c.Tokens {
		if g.Tokens[i] != c.Tokens[i] {
			t.Fatalf("%s: tokens %v, the CPU runner %v", what, g.Tokens, c.Tokens)
		}
		if d := math.Abs(float64(g.Logprobs[i].Logprob - c.Logprobs[i].Logprob)); !(d <= gpuLogprobTol*(1+math.Abs(float64(c.Logprobs[i].Logprob)))) {
			t.Fatalf("%s: output %d: logprob %g, the CPU runner %g", what, i, g.Logprobs[i].Logprob, c.Logprobs[i].Logprob)
		}
	}
}

// engineMatchesCPU runs TestEmulatedGPUEngineMatchesCPU's requests on the kit's device.
func engineMatchesCPU(t *testing.T, kit *gpuTestKit) {
	vocab := tinyTextModel(t).Config.VocabSize
	greedy := engine.SamplingParams{MaxTokens: 6, IgnoreEOS: true, Logprobs: true, TopLogprobs: 3}
	cat := func(a []int32, b ...int32) []int32 { return append(append([]int32(nil), a...), b...) }
	for ci, cfg := range []engine.Config{{MaxBatchTokens: 64}, {MaxBatchTokens: 7}} {
		gr := kit.runner(t, 8, 64, 8, GPUOptions{})
		gpool, err := gr.NewPool(4 << 20)
		if err != nil {
			t.Fatal(err)
		}
		cr := NewTextRunner(tinyTextModel(t), 0, 0)
		cpool, err := cr.NewPool(4 << 20)
		if err != nil {
			t.Fatal(err)
		}
		var s runnertest.Suite
		ge, ce := s.StartWith(t, gr, gpool, cfg), s.StartWith(t, cr, cpool, cfg)
		salt := 10 * ci
		// 23 tokens cross a 16-token KDA block end and several index pools.
		p := runnertest.Prompt(23, vocab, salt+1)
		sameOutput(t, fmt.Sprintf("config %d, one request", ci), ge.Generate(t, p, greedy), ce.Generate(t, p, greedy))
		batch := [][]int32{runnertest.Prompt(3, vocab, salt+2), runnertest.Prompt(19, vocab, salt+3), runnertest.Prompt(30, vocab, salt+4)}
		gAll, cAll := ge.GenerateAll(t, batch, greedy), ce.GenerateAll(t, batch, greedy)
		for i := range batch {
			sameOutput(t, fmt.Sprintf("config %d, request %d of a batch", ci, i), gAll[i], cAll[i])
		}
		// Prefix hits: a prompt of 70 tokens leaves KDA checkpoints at block ends 16 ...
		// 64; one sharing its first 60 tokens resumes at 48 (between the checkpoints at 48
		// and 64), one sharing 32 at the block end 32, and the same prompt again at 64.
		a := runnertest.Prompt(70, vocab, salt+5)
		sameOutput(t, fmt.Sprintf("config %d, a long prompt", ci), ge.Generate(t, a, greedy), ce.Generate(t, a, greedy))
		for _, hit := range []struct {
			name string
			p    []int32
		}{
			{"sharing 60 tokens", cat(a[:60], 1, 2, 3)},
			{"sharing 32 tokens", cat(a[:32], 4)},
			{"the same prompt", a},
		} {
			before := ge.Counters().PrefixHits
			sameOutput(t, fmt.Sprintf("config %d, a prompt %s", ci, hit.name), ge.Generate(t, hit.p, greedy), ce.Generate(t, hit.p, greedy))
			if ge.Counters().PrefixHits <= before {
				t.Errorf("config %d: a prompt %s got no prefix hit", ci, hit.name)
			}
		}
		ge.Stop(t)
		ce.Stop(t)
	}
}

// TestEmulatedOpenGPU opens a tiny checkpoint directory (random weights) through OpenGPU,
// the cli.GPUOpener, on the emulated device with steps of more rows than the model's
// context, and checks that it serves the CPU runner's context and one greedy request
// through the engine as Open's CPU runner does; and OpenGPUSpeculative with 2 MTP drafts
// a step the same.
func TestEmulatedOpenGPU(t *testing.T) {
	if emutest.Reexec(t) {
		return
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(tinyTextConfigJSON), 0o644); err != nil {
		t.Fatal(err)
	}
	gr, gpool, err := OpenGPU(dir, 4<<20, gpurunner.Options{Limits: gpurunner.Limits{MaxTokens: 1024, MaxSeqs: 4, MaxRows: 4},
		KernelCache: os.Getenv("RESIN_KERNEL_CACHE")})
	if err != nil {
		t.Fatal(err)
	}
	defer gr.(*GPURunner).Close()
	cr, cpool, err := Open(dir, 4<<20)
	if err != nil {
		t.Fatal(err)
	}
	if g, c := gr.Info().MaxContext, cr.Info().MaxContext; g != c {
		t.Errorf("the GPU runner serves %d tokens of context, the CPU runner %d", g, c)
	}
	var s runnertest.Suite
	cfg := engine.Config{MaxBatchTokens: 64, MaxSeqs: 4}
	ge, ce := s.StartWith(t, gr, gpool, cfg), s.StartWith(t, cr, cpool, cfg)
	defer ge.Stop(t)
	defer ce.Stop(t)
	sp := engine.SamplingParams{MaxTokens: 4, IgnoreEOS: true}
	p := runnertest.Prompt(9, tinyTextModel(t).Config.VocabSize, 5)
	want := ce.Generate(t, p, sp)
	if g := ge.Generate(t, p, sp); fmt.Sprint(g.Tokens) != fmt.Sprint(want.Tokens) {
		t.Fatalf("GPU tokens %v, CPU %v", g.Tokens, want.Tokens)
	}
	// OpenGPUSpeculative: 2 MTP drafts a step on the device, the same tokens; its logits
	// rows default to a verify step's.
	sr, spool, err := OpenGPUSpeculative(dir, 4<<20, gpurunner.Options{Limits: gpurunner.Limits{MaxTokens: 64, MaxSeqs: 4},
		KernelCache: os.Getenv("RESIN_KERNEL_CACHE")}, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer sr.(*GPURunner).Close()
	if d := sr.Info().MaxDrafts; d != 2 {
		t.Errorf("OpenGPUSpeculative's runner proposes %d drafts, want 2", d)
	}
	se := s.StartWith(t, sr, spool, cfg)
	defer se.Stop(t)
	if g := se.Generate(t, p, sp); fmt.Sprint(g.Tokens) != fmt.Sprint(want.Tokens) {
		t.Fatalf("GPU tokens with MTP drafts %v, CPU %v", g.Tokens, want.Tokens)
	}
}

// TestEmulatedGPURunnerRefusals checks that GPURunner's forward refuses, naming the
// reason, draft tokens and a plan without the pool's pages, and that a plan of its pool
// still runs after them.
func TestEmulatedGPURunnerRefusals(t *testing.T) {
	if emutest.Reexec(t) {
		return
	}
	r := openGPUTest(t).runner(t, 2, 16, 2, GPUOptions{})
	pool, err := r.NewPool(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	vocab := r.Model.Config.VocabSize
	plan := func(id uint64, computed int32, tokens []int32, drafts int32) *engine.BatchPlan {
		pos := make([]int32, len(tokens))
		for i := range pos {
			pos[i] = computed + int32(i)
		}
		return &engine.BatchPlan{ReqIDs: []uint64{id}, Computed: []int32{computed}, Scheduled: []int32{int32(len(tokens))},
			NumDrafts: []int32{drafts}, Tokens: tokens, Positions: pos, QueryStart: []int32{0, int32(len(tokens))},
			LogitsIndices: []int32{int32(len(tokens) - 1)}}
	}
	logits := make([]float32, 2*vocab)
	for _, c := range []struct {
		name string
		p    *engine.BatchPlan
		want string
	}{
		{"drafts", plan(2, 0, []int32{3, 4}, 1), "draft tokens"},
		{"no pages", plan(1, 0, []int32{3, 4}, 0), "cache groups"},
	} {
		if err := r.forward(c.p, logits); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one naming %q", c.name, err, c.want)
		}
	}
	seq := runnertest.OpenSeq(t, pool, runnertest.Prompt(5, vocab, 1))
	if err := r.forward(runnertest.Plan(t, pool, []*runnertest.Seq{seq}, []int{5}, false), logits); err != nil {
		t.Fatal(err)
	}
}

// configModels holds the random-weight models configModel built, by config path: the
// truncated real-dimension model takes minutes to build, and its test and benchmark share
// it.
var configModels sync.Map

// configModel returns the model of the config.json at path with seeded random weights
// (seed 1), built once per process.
func configModel(tb testing.TB, path string) *TextModel {
	tb.Helper()
	if m, ok := configModels.Load(path); ok {
		return m.(*TextModel)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	c, err := ParseTextConfig(raw)
	if err != nil {
		tb.Fatal(err)
	}
	m, err := RandomTextModel(c, 1)
	if err != nil {
		tb.Fatal(err)
	}
	configModels.Store(path, m)
	return m
}
