package deepseekv4flash

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/runnertest"
)

// truncatedConfig is scripts/gpu-check.sh --v4's model: DeepSeek-V4-Flash's first 4
// layers (sliding, CSA, HCA, CSA) at its real dimensions, experts of the real size but 32
// of them instead of 256 (the CPU reference holds every weight in float32: ~22 GB with
// the MTP layer, as on the GPU), a context of 4096.
const truncatedConfig = "testdata/gpu-check/config.json"

// TestTruncatedConfig checks that the truncated config keeps the real model's dimensions
// (the defaults of ParseConfig for an empty config, which are DeepSeek-V4-Flash's) but
// for the layer count, the expert count and the context, and that its random weights fit
// the figure the check states.
func TestTruncatedConfig(t *testing.T) {
	raw, err := os.ReadFile(truncatedConfig)
	if err != nil {
		t.Fatal(err)
	}
	c, err := ParseConfig(raw)
	if err != nil {
		t.Fatal(err)
	}
	full, err := ParseConfig([]byte(`{"model_type": "deepseek_v4"}`))
	if err != nil {
		t.Fatal(err)
	}
	same := func(what string, got, want any) {
		t.Helper()
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: %v, DeepSeek-V4-Flash has %v", what, got, want)
		}
	}
	same("vocab", c.VocabSize, full.VocabSize)
	same("hidden", c.HiddenSize, full.HiddenSize)
	same("heads", c.NumAttentionHeads, full.NumAttentionHeads)
	same("head_dim", c.HeadDim, full.HeadDim)
	same("q_lora_rank", c.QLoraRank, full.QLoraRank)
	same("o_groups", c.OGroups, full.OGroups)
	same("o_lora_rank", c.OLoraRank, full.OLoraRank)
	same("moe width", c.MoEIntermediateSize, full.MoEIntermediateSize)
	same("top-k", c.NumExpertsPerTok, full.NumExpertsPerTok)
	same("indexer", [3]int{c.IndexNHeads, c.IndexHeadDim, c.IndexTopK}, [3]int{full.IndexNHeads, full.IndexHeadDim, full.IndexTopK})
	same("sliding window", c.SlidingWindow, full.SlidingWindow)
	same("hc_mult", c.HCMult, full.HCMult)
	same("compress rates", c.CompressRates, full.CompressRates)
	same("layer types", c.LayerTypes, []string{SlidingAttention, CompressedSparse, HeavilyCompressed, CompressedSparse})
	same("mlp types", c.MLPLayerTypes, full.MLPLayerTypes[:4])
	if gb := float64(WeightBytes(c, true)) / 1e9; gb < 15 || gb > 30 {
		t.Errorf("random float32 weights of %.1f GB, the check states ~22", gb)
	}
}

// truncatedModel is the model of the config.json at path with seeded random weights (MTP
// head included) and a context of 1024, built once per test binary: TestGPUTruncatedMatchesCPU
// and TestGPUTruncatedFigures share its ~22 GB (minutes to build).
var truncatedModel = func() func(path string) (*Model, error) {
	var once sync.Once
	var m *Model
	var err error
	return func(path string) (*Model, error) {
		once.Do(func() {
			var c *Config
			if c, err = LoadConfig(filepath.Dir(path)); err == nil {
				m, err = NewModel(c, RandomWeights(c, 1, true), 1024)
			}
		})
		return m, err
	}
}()

// gpuTruncatedLogprobTol is TestGPUTruncatedMatchesCPU's bound: float32 on both sides,
// but sums of up to 32768 terms in another order than the Go reference's.
const gpuTruncatedLogprobTol = 1e-3

// TestGPUTruncatedMatchesCPU runs the model of RESIN_V4_CONFIG (scripts/gpu-check.sh
// --v4: testdata/gpu-check/config.json; seeded random weights) on GPU 0 (RESIN_GPU=1)
// and on the CPU runner through the engine: a prompt of 200 tokens (an HCA window of 128
// and a block end inside it) and 4 greedy tokens, then a prompt sharing its first 150
// tokens (a prefix hit through the checkpoint at 128), in chunks of 64; tokens equal,
// log probabilities within gpuTruncatedLogprobTol, the largest difference logged as a
// parity line. Then the GPU runner with one MTP draft a step must give the same tokens.
func TestGPUTruncatedMatchesCPU(t *testing.T) {
	path := os.Getenv("RESIN_V4_CONFIG")
	if os.Getenv("RESIN_GPU") == "" || path == "" {
		t.Skip("set RESIN_GPU=1 and RESIN_V4_CONFIG to a config.json (scripts/gpu-check.sh --v4) on a machine with a GPU")
	}
	m, err := truncatedModel(path)
	if err != nil {
		t.Fatal(err)
	}
	c := m.Config
	dev, err := cudart.OpenDevice(0)
	if err != nil {
		t.Fatalf("RESIN_GPU is set but GPU 0 does not open: %v", err)
	}
	defer dev.Close()
	cache, err := cudart.OpenKernelCache(os.Getenv("RESIN_KERNEL_CACHE"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := engine.Config{MaxBatchTokens: 64, MaxSeqs: 4}
	greedy := engine.SamplingParams{MaxTokens: 4, IgnoreEOS: true, Logprobs: true}
	a := runnertest.Prompt(200, c.VocabSize, 1)
	b := append(slices.Clone(a[:150]), 7, 8, 9)
	var outs [3][]runnertest.Output
	for k := range outs {
		var s runnertest.Suite
		var e *runnertest.Engine
		switch k {
		case 0:
			cr := NewRunner(m, 0)
			pool, err := cr.NewPool(1 << 30)
			if err != nil {
				t.Fatal(err)
			}
			e = s.StartWith(t, cr, pool, cfg)
		default:
			var gr *GPURunner
			if k == 1 {
				gr, err = NewGPURunner(m, dev, cache, cudart.F32, 4, 64, 4)
			} else {
				gr, err = NewGPUMTPRunner(m, dev, cache, cudart.F32, 4, 64, 8, 1)
			}
			if err != nil {
				t.Fatal(err)
			}
			defer gr.Close()
			pool, err := gr.NewPool(1 << 30)
			if err != nil {
				t.Fatal(err)
			}
			e = s.StartWith(t, gr, pool, cfg)
		}
		for _, p := range [][]int32{a, b} {
			outs[k] = append(outs[k], e.Generate(t, p, greedy))
		}
		e.Stop(t)
	}
	worst := 0.0
	for k, what := range []string{"GPU", "GPU with MTP"} {
		for i := range outs[0] {
			g, cp := outs[k+1][i], outs[0][i]
			if fmt.Sprint(g.Tokens) != fmt.Sprint(cp.Tokens) {
				t.Fatalf("prompt %d: %s tokens %v, CPU %v", i, what, g.Tokens, cp.Tokens)
			}
			for j := range cp.Logprobs {
				d := math.Abs(float64(g.Logprobs[j].Logprob-cp.Logprobs[j].Logprob)) / (1 + math.Abs(float64(cp.Logprobs[j].Logprob)))
				worst = max(worst, d)
				if !(d <= gpuTruncatedLogprobTol) {
					t.Errorf("prompt %d, output %d: %s logprob %g, the CPU runner %g", i, j, what, g.Logprobs[j].Logprob, cp.Logprobs[j].Logprob)
				}
			}
		}
	}
	t.Logf("parity deepseek-v4-flash truncated (4 layers, real dims, 32 experts, fp32; prefix hit, MTP): max |Δ logprob|/(1+|cpu|) %.3g (tolerance %g)", worst, gpuTruncatedLogprobTol)
}
