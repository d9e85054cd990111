package gpurunner_test

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/resin-llm/resin/core/cpurunner"
	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/cudart/emutest"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/gpurunner"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/core/runnertest"
	"github.com/resin-llm/resin/models/llama"
)

// The tests named TestEmulated* run the GPU runner on the emulated CUDA device
// (RESIN_CUDA=emulate, in a child of the test binary: emutest.Reexec): the real bindings,
// kernels, cuBLASLt GEMMs, graphs and device sampling, on the CPU. They compare it with
// the CPU runner of models/llama through the real engine.

// emuTolerance bounds |a-b| <= emuTolerance*(1+|b|) between a log probability of the GPU
// runner (bf16 weights and activations, float32 accumulation) and the CPU runner's
// (float32 throughout) for the tiny model below.
const emuTolerance = 0.05

// tinyLlama writes the config of a small llama (two layers, GQA 2, head dim 16, a
// vocabulary that is not a power of two, pages of 16 tokens) into a directory; without
// weights, models/llama builds seeded random ones, the same for the CPU and the GPU.
func tinyLlama(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	cfg := `{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 261,
 "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
 "num_key_value_heads": 2, "head_dim": 16, "hidden_act": "silu", "rms_norm_eps": 1e-5,
 "rope_theta": 10000, "max_position_embeddings": 128, "tie_word_embeddings": false,
 "bos_token_id": 1, "eos_token_id": 2}`
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

type closer interface{ Close() error }

// openEmulatedGPU opens the GPU runner of the model in dir on the emulated device.
func openEmulatedGPU(t testing.TB, dir string, cacheBytes int64, eager bool) (engine.Runner, *kvslab.Pool) {
	t.Helper()
	if !cudart.Emulated() {
		t.Fatal("not on the emulated device")
	}
	r, pool, err := llama.OpenGPU(dir, cacheBytes, gpurunner.Options{Eager: eager, KernelCache: os.Getenv("RESIN_KERNEL_CACHE")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.(closer).Close() })
	return r, pool
}

func openCPU(t testing.TB, dir string, cacheBytes int64) (engine.Runner, *kvslab.Pool) {
	t.Helper()
	r, pool, err := llama.Open(dir, cacheBytes)
	if err != nil {
		t.Fatal(err)
	}
	return r, pool
}

// TestEmulatedGPUSuite runs the GPU runner's own GPU tests (logits against the CPU
// reference for llama and the Qwen variants, graph replay against eager execution, device
// greedy sampling, cache ops) on the emulated device.
func TestEmulatedGPUSuite(t *testing.T) {
	if os.Getenv("RESIN_CUDA") == "emulate" {
		t.Skip("RESIN_CUDA=emulate is set: the TestGPU* tests run on the emulated device directly")
	}
	emutest.RunTests(t, "^TestGPU(DenseMatchesReference|DenseQwenMatchesReference|GraphReplayEqualsEager|DeviceSamplingGreedy|CacheOps)$")
}

// TestEmulatedConformance runs core/runnertest's suite on the GPU runner: prefill against
// decode, chunked prefill, batch invariance, page layout, reproducible sampling, prefix
// hits and aborts, through the engine, its log probabilities within the bf16 tolerance
// (one-shot prefill and decode use different attention kernels).
func TestEmulatedConformance(t *testing.T) {
	if emutest.Reexec(t) {
		return
	}
	dir := tinyLlama(t)
	runnertest.Run(t, func(t testing.TB) (engine.Runner, *kvslab.Pool) { return openEmulatedGPU(t, dir, 4<<20, false) },
		runnertest.Options{Tolerance: emuTolerance, MaxTokens: 5})
}

// sameAsCPU compares what the GPU runner generated with the CPU runner's output for the
// same request: the tokens equal and their log probabilities within emuTolerance, up to
// a near-tie. Where greedy tokens first differ, the GPU's token must be one of the CPU's
// top alternatives within emuTolerance of the CPU's chosen token (bf16 rounding may pick
// either of two tokens that close); the outputs are not compared past it.
func sameAsCPU(t testing.TB, what string, gpu, cpu runnertest.Output) {
	t.Helper()
	if len(gpu.Tokens) != len(cpu.Tokens) || gpu.Finish != cpu.Finish {
		t.Fatalf("%s: %d tokens (finish %s), the CPU runner %d (finish %s)", what, len(gpu.Tokens), gpu.Finish, len(cpu.Tokens), cpu.Finish)
	}
	if len(gpu.Logprobs) != len(gpu.Tokens) || len(cpu.Logprobs) != len(cpu.Tokens) {
		t.Fatalf("%s: %d and %d log probabilities for %d tokens", what, len(gpu.Logprobs), len(cpu.Logprobs), len(gpu.Tokens))
	}
	close := func(a, b float32) bool {
		d := math.Abs(float64(a) - float64(b))
		return d <= emuTolerance*(1+math.Abs(float64(b)))
	}
	worst := 0.0
	for i := range gpu.Tokens {
		g, c := gpu.Logprobs[i], cpu.Logprobs[i]
		if gpu.Tokens[i] != cpu.Tokens[i] {
			for _, alt := range c.Top {
				if alt.Token == gpu.Tokens[i] && close(alt.Logprob, c.Logprob) {
					t.Logf("%s: a near-tie at output position %d (token %d at %.4f, the CPU's %d at %.4f): compared up to it",
						what, i, alt.Token, alt.Logprob, cpu.Tokens[i], c.Logprob)
					return
				}
			}
			t.Fatalf("%s: tokens %v, the CPU runner %v (first difference at output position %d, not a near-tie: CPU top %v)",
				what, gpu.Tokens, cpu.Tokens, i, c.Top)
		}
		if !close(g.Logprob, c.Logprob) {
			t.Fatalf("%s: output position %d: logprob %g, the CPU runner %g", what, i, g.Logprob, c.Logprob)
		}
		worst = max(worst, math.Abs(float64(g.Logprob-c.Logprob)))
	}
	t.Logf("parity %s: %d tokens equal, max |logprob diff| %.3g", what, len(gpu.Tokens), worst)
}

// engines runs the same requests through an engine on the GPU runner and one on the CPU
// runner of dir, each engine configured by cfg, with pools of gpuBytes and cpuBytes.
type engines struct {
	gpu, cpu *runnertest.Engine
}

func startEngines(t *testing.T, dir string, gpuBytes, cpuBytes int64, cfg engine.Config) engines {
	s := &runnertest.Suite{}
	gr, gp := openEmulatedGPU(t, dir, gpuBytes, false)
	cr, cp := openCPU(t, dir, cpuBytes)
	return engines{gpu: s.StartWith(t, gr, gp, cfg), cpu: s.StartWith(t, cr, cp, cfg)}
}

func (e engines) stop(t *testing.T) {
	e.gpu.Stop(t)
	e.cpu.Stop(t)
}

// TestEmulatedMatchesCPURunner runs requests through the engine on the GPU runner
// and on models/llama's CPU runner: one-shot and chunked prefill, a batch decoding at
// different lengths, prefix-cache hits, preemption in a small pool and aborts; every
// output equals the CPU runner's (sameAsCPU). Seeded draws (temperature 0.5, top-k 8)
// are compared too; on the GPU's own logits they are compared bit for bit with the host
// sampler in TestEmulatedDeviceSamplingEqualsHost.
func TestEmulatedMatchesCPURunner(t *testing.T) {
	if emutest.Reexec(t) {
		return
	}
	dir := tinyLlama(t)
	const vocab = 261
	prompts := [][]int32{runnertest.Prompt(5, vocab, 1), runnertest.Prompt(19, vocab, 2), runnertest.Prompt(34, vocab, 3)}
	greedy := engine.SamplingParams{MaxTokens: 6, IgnoreEOS: true, Logprobs: true, TopLogprobs: 5}
	seeded := greedy
	seeded.Temperature, seeded.TopK, seeded.Seed, seeded.HasSeed = 0.5, 8, 7, true
	ctx := context.Background()

	for _, tc := range []struct {
		name string
		cfg  engine.Config
	}{
		{"one-shot prefill, batched decode", engine.Config{}},
		{"chunked prefill of 7 tokens", engine.Config{MaxBatchTokens: 7}},
	} {
		e := startEngines(t, dir, 4<<20, 4<<20, tc.cfg)
		for _, sp := range []engine.SamplingParams{greedy, seeded} {
			kind := "greedy"
			if sp.HasSeed {
				kind = "seeded"
			}
			for i, p := range prompts {
				sameAsCPU(t, fmt.Sprintf("%s, %s, prompt %d alone", tc.name, kind, i), e.gpu.Generate(t, p, sp), e.cpu.Generate(t, p, sp))
			}
			gAll, cAll := e.gpu.GenerateAll(t, prompts, sp), e.cpu.GenerateAll(t, prompts, sp)
			for i := range prompts {
				sameAsCPU(t, fmt.Sprintf("%s, %s, prompt %d of %d in one batch", tc.name, kind, i, len(prompts)), gAll[i], cAll[i])
			}
		}
		// The prompts ran before: these are prefix-cache hits.
		before := e.gpu.Counters().PrefixHits
		for i, p := range prompts {
			sameAsCPU(t, fmt.Sprintf("%s, prompt %d again (prefix hit)", tc.name, i), e.gpu.Generate(t, p, greedy), e.cpu.Generate(t, p, greedy))
		}
		if e.gpu.Counters().PrefixHits == before {
			t.Errorf("%s: repeated prompts made no prefix-cache hit", tc.name)
		}
		e.stop(t)
	}

	// Preemption: a GPU pool of 16 pages (256 tokens) for four requests that grow to 29
	// pages together.
	long := greedy
	long.MaxTokens = 90
	many := append([][]int32{runnertest.Prompt(30, vocab, 4)}, prompts...)
	e := startEngines(t, dir, 64<<10, 4<<20, engine.Config{MaxSeqs: 4})
	pages := fmt.Sprintf("%d slabs of %d bytes", e.gpu.Pool.Slabs(), e.gpu.Pool.SlabBytes())
	gAll := e.gpu.GenerateAll(t, many, long)
	if e.gpu.Counters().Preemptions == 0 {
		t.Errorf("a pool of %s preempted nothing", pages)
	}
	for i, p := range many {
		sameAsCPU(t, fmt.Sprintf("request %d preempted in a pool of %s vs alone", i, pages), gAll[i], e.cpu.Generate(t, p, long))
	}

	// Aborts: a request aborted while running, one aborted while waiting; the request
	// after them equals the CPU's.
	st, err := e.gpu.Submit(ctx, engine.Request{ID: "running", Prompt: prompts[2], Sampling: long})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(ctx); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	waiting, err := e.gpu.Submit(wctx, engine.Request{Prompt: prompts[1], Sampling: long})
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	e.gpu.Abort("running")
	for _, s := range []*engine.Stream{st, waiting} {
		for {
			ev, err := s.Recv(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if ev.Finish != engine.FinishNone {
				break
			}
		}
	}
	sameAsCPU(t, "request after two aborts", e.gpu.Generate(t, prompts[0], greedy), e.cpu.Generate(t, prompts[0], greedy))
	e.stop(t)
	if c, err := cudart.EmulatorCounts(); err == nil {
		t.Logf("emulated device, this test: %v", c)
	}
}

// TestEmulatedGraphsEqualEager runs the same requests on the GPU runner with CUDA graphs
// and with every step eager: the tokens and log probabilities are equal bit for bit.
func TestEmulatedGraphsEqualEager(t *testing.T) {
	if emutest.Reexec(t) {
		return
	}
	dir := tinyLlama(t)
	prompts := [][]int32{runnertest.Prompt(3, 261, 5), runnertest.Prompt(21, 261, 6), runnertest.Prompt(9, 261, 7)}
	sp := engine.SamplingParams{MaxTokens: 8, IgnoreEOS: true, Logprobs: true, TopLogprobs: 3}
	s := &runnertest.Suite{}
	var outs [2][]runnertest.Output
	var stats [2]gpurunner.StepStats
	for i, eager := range []bool{false, true} {
		r, pool := openEmulatedGPU(t, dir, 4<<20, eager)
		h := s.StartWith(t, r, pool, engine.Config{})
		outs[i] = h.GenerateAll(t, prompts, sp)
		h.Stop(t)
		stats[i] = r.(*gpurunner.Runner).Stats
	}
	if g := stats[0]; g.Graph == 0 {
		t.Fatalf("the graph runner replayed no graph: %+v", g)
	}
	for i := range prompts {
		g, e := outs[0][i], outs[1][i]
		if fmt.Sprint(g) != fmt.Sprint(e) {
			t.Fatalf("prompt %d: with graphs %v, eager %v", i, g, e)
		}
	}
	t.Logf("parity graphs vs eager: %d requests equal bit for bit (%+v with graphs)", len(prompts), stats[0])
}

// TestEmulatedDeviceSamplingEqualsHost runs the same requests on two GPU runners, one
// sampling on the device, one bringing every logits row back to engine.Sampler on the
// host (CaptureLogits): greedy, seeded with temperature, top-k, top-p and min-p, the
// tokens equal and their log probabilities within 1e-4.
func TestEmulatedDeviceSamplingEqualsHost(t *testing.T) {
	if emutest.Reexec(t) {
		return
	}
	dir := tinyLlama(t)
	prompts := [][]int32{runnertest.Prompt(4, 261, 8), runnertest.Prompt(23, 261, 9)}
	base := engine.SamplingParams{MaxTokens: 8, IgnoreEOS: true, Logprobs: true, TopLogprobs: 4}
	params := []engine.SamplingParams{base, base, base, base}
	params[1].Temperature, params[1].Seed = 0.9, 11
	params[2].Temperature, params[2].TopK, params[2].TopP, params[2].Seed = 1.3, 20, 0.9, 12
	params[3].Temperature, params[3].MinP, params[3].Seed = 0.7, 0.05, 13
	for i := 1; i < len(params); i++ {
		params[i].HasSeed = true
	}
	s := &runnertest.Suite{Opts: runnertest.Options{Tolerance: 1e-4}}
	var outs [2][]runnertest.Output
	var stats [2]string
	for i, host := range []bool{false, true} {
		r, pool := openEmulatedGPU(t, dir, 4<<20, false)
		g := r.(*gpurunner.Runner)
		if host {
			g.CaptureLogits(func(cpurunner.LogitsRow) {})
		}
		h := s.StartWith(t, r, pool, engine.Config{})
		for _, sp := range params {
			outs[i] = append(outs[i], h.GenerateAll(t, prompts, sp)...)
		}
		h.Stop(t)
		stats[i] = fmt.Sprintf("%+v", g.Stats)
	}
	t.Logf("device %s, host %s", stats[0], stats[1])
	for i := range outs[0] {
		s.Same(t, fmt.Sprintf("parity device sampling vs host, request %d (params %d)", i, i/len(prompts)), outs[0][i], outs[1][i])
	}
}
