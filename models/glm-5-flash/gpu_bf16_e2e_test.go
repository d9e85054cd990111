package glm5flash

import (
	"os"
	"testing"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/cudart/emutest"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/runnertest"
)

// gpuBF16LogprobTol bounds |gpu − cpu| for a log probability between GPURunner with its
// KDA projections, MLPs, experts and lm_head in bf16 (GPUOptions.KDAWeights and Weights)
// and the CPU TextRunner in fp32 on the same tiny model, the CPU's teacher-forced on the
// GPU's tokens (gpu_forced_test.go). Not derived: the tiny random model amplifies bf16's
// 2^-9 rounding through its DSA top-k and MoE routing choices (a flipped choice moves a
// row by O(1); see gpuBF16WeightsTol), so the bound is the measured worst (logged) with
// room. It catches a wrong weight, layout or path end to end, not rounding; the
// per-layer bound is TestEmulatedGPUBF16Weights'.
const gpuBF16LogprobTol = 2.5

// gpuBF16MedianTol bounds the median of those differences over a run's rows (measured 0.025
// chunked, 0.014 one-shot, 0.012 with MTP drafts; largest 1.34, 1.79, 0.78:
// see the log): most rows keep their routing and top-k choices, so the median is bf16's
// own effect.
const gpuBF16MedianTol = 0.05

// TestEmulatedGPUBF16EndToEnd runs endToEnd's requests through the real engine on
// GPURunner in bf16 (the emulated device) against the fp32 CPU runner of the same tiny
// model: teacher-forced prefill rows, one request, a batch of three decoding together,
// and with RESIN_EMU_CONFORMANCE=1 prefix hits through and between KDA checkpoints, with
// chunked prefill (7 tokens a step; one-shot too with RESIN_EMU_CONFORMANCE=1); and with
// 2 MTP drafts a step (verify rows): every GPU logprob within gpuBF16LogprobTol of the
// CPU's teacher-forced one.
func TestEmulatedGPUBF16EndToEnd(t *testing.T) {
	if emutest.Reexec(t) {
		return
	}
	kit := openGPUTest(t)
	full := os.Getenv("RESIN_EMU_CONFORMANCE") != ""
	vocab := tinyTextModel(t).Config.VocabSize
	type run struct {
		name string
		opts GPUOptions
		cfg  engine.Config
	}
	bf16 := GPUOptions{KDAWeights: cudart.BF16, Weights: cudart.BF16}
	mtp := bf16
	mtp.Drafts = 2
	runs := []run{{"bf16, chunked prefill", bf16, engine.Config{MaxBatchTokens: 7, MaxSeqs: 4}},
		{"bf16 with 2 MTP drafts", mtp, engine.Config{MaxBatchTokens: 64, MaxSeqs: 4}}}
	if full {
		runs = append(runs, run{"bf16, one-shot prefill", bf16, engine.Config{MaxBatchTokens: 128, MaxSeqs: 4}})
	}
	worst := 0.0
	var s runnertest.Suite
	for i, r := range runs {
		gr := kit.runner(t, 4, 128, 128, r.opts)
		if err := gr.UseGraphs(true, nil); err != nil {
			t.Fatal(err)
		}
		gpool, err := gr.NewPool(4 << 20)
		if err != nil {
			t.Fatal(err)
		}
		cr := NewTextRunner(tinyTextModel(t), 0, 0)
		cpool, err := cr.NewPool(4 << 20)
		if err != nil {
			t.Fatal(err)
		}
		ge, ce := s.StartWith(t, gr, gpool, r.cfg), s.StartWith(t, cr, cpool, r.cfg)
		w, med := endToEnd(t, r.name, ge, ce, vocab, 10*i, gpuBF16LogprobTol, gpuBF16MedianTol, full)
		t.Logf("%s: largest |Δ logprob| against the fp32 CPU runner %.3g, median %.3g", r.name, w, med)
		worst = max(worst, w)
		ge.Stop(t)
		ce.Stop(t)
	}
	t.Logf("largest |Δ logprob| bf16 GPU against fp32 CPU: %.3g (tolerance %g)", worst, gpuBF16LogprobTol)
}
