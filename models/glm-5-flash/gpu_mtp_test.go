package glm5flash

import (
	"fmt"
	"slices"
	"testing"

	"github.com/resin-llm/resin/core/cudart/emutest"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kernels/ref"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/core/runnertest"
)

// TestEmulatedGPUMTPMatchesCPU decodes a batch of prompts (chunked prefill of 13 tokens a
// step) through the real engine with the MTP layer on the emulated device proposing 2
// drafts a step: the tokens equal the CPU runner's without drafts and the log
// probabilities are within gpuLogprobTol; the device's MTP layer gives every draft
// position the logits the CPU runner's MTP layer gives it (within gpuLogprobTol·(1+|l|))
// and so proposes the same drafts, accepted as often; and with drafts forced
// right but at every third position (rejections at every offset of the pools and
// blocks, whose KDA states must come back exactly) the tokens still equal. Then, on the
// same engine, a prompt sharing 26 tokens with the 31-token one, admitted after it,
// resumes from the prefix cache (the MTP layer's rows and the last token's hidden state
// from the pages and the KDA checkpoint at 16): its tokens and drafts equal too.
func TestEmulatedGPUMTPMatchesCPU(t *testing.T) {
	if emutest.Reexec(t) {
		return
	}
	kit := openGPUTest(t)
	m := tinyTextModel(t)
	V := m.Config.VocabSize
	all := specPrompts(V)
	prompts := [][]int32{all[0], all[2], all[4]} // 5, 22 and 31 tokens
	sp := engine.SamplingParams{MaxTokens: 10, IgnoreEOS: true, Logprobs: true, TopLogprobs: 3}
	const budget, drafts = 13, 2
	plain := NewTextRunner(m, 0, 0)
	ppool, err := plain.NewPool(16 << 20)
	if err != nil {
		t.Fatal(err)
	}
	hit := append(slices.Clone(all[4][:26]), 1, 2, 3)
	want, _ := generateThenHit(t, plain, ppool, prompts, hit, sp, budget)
	type draftKey struct{ promptLen, pos, j int }
	record := func(into map[draftKey][]float32) func(promptLen, pos, j int, logits []float32) int32 {
		return func(promptLen, pos, j int, logits []float32) int32 {
			into[draftKey{promptLen, pos, j}] = slices.Clone(logits)
			return int32(max(ref.Argmax(logits), 0))
		}
	}
	cpuDrafts, gpuDrafts := map[draftKey][]float32{}, map[draftKey][]float32{}
	cr, cpool := mtpTextRunner(t, m, drafts)
	cr.forceDraft = record(cpuDrafts)
	_, cc := generateThenHit(t, cr, cpool, prompts, hit, sp, budget)
	full := map[int][]int32{}
	for i, p := range prompts {
		full[len(p)] = append(slices.Clone(p), want[i].Tokens...)
	}
	for _, forced := range []bool{false, true} {
		gr := kit.runner(t, 4, 64, 64, GPUOptions{Drafts: drafts})
		gpool, err := gr.NewPool(8 << 20)
		if err != nil {
			t.Fatal(err)
		}
		what := fmt.Sprintf("forced %v", forced)
		gr.forceDraft = record(gpuDrafts)
		if forced {
			gr.forceDraft = func(promptLen, pos, _ int, logits []float32) int32 {
				seq := full[promptLen]
				if pos >= len(seq) || pos%3 == 0 {
					return (int32(ref.Argmax(logits)) + 1) % int32(V)
				}
				return seq[pos]
			}
		}
		got, gc := generateThenHit(t, gr, gpool, prompts, hit, sp, budget)
		if gc.PrefixHits == 0 {
			t.Errorf("%s: the prompt sharing 26 tokens got no prefix hit", what)
		}
		for i := range want {
			sameOutput(t, fmt.Sprintf("%s, request %d", what, i), got[i], want[i])
		}
		t.Logf("%s: %d drafts, %d accepted; the CPU runner's MTP layer: %d, %d", what, gc.DraftsProposed, gc.DraftsAccepted,
			cc.DraftsProposed, cc.DraftsAccepted)
		if !forced {
			if len(gpuDrafts) != len(cpuDrafts) {
				t.Errorf("the device drafted at %d positions, the CPU runner at %d", len(gpuDrafts), len(cpuDrafts))
			}
			for k, want := range cpuDrafts {
				got, ok := gpuDrafts[k]
				if !ok {
					t.Errorf("no device draft for %+v", k)
					continue
				}
				if err := diffRows(fmt.Sprintf("MTP logits at %+v", k), got, want, gpuLogprobTol); err != nil {
					t.Error(err)
				}
			}
		}
		switch {
		case gc.DraftsProposed == 0:
			t.Errorf("%s: no drafts proposed", what)
		case forced && (gc.DraftsAccepted == 0 || gc.DraftsAccepted == gc.DraftsProposed):
			t.Errorf("%s: %d drafts, %d accepted", what, gc.DraftsProposed, gc.DraftsAccepted)
		case !forced && (gc.DraftsProposed != cc.DraftsProposed || gc.DraftsAccepted != cc.DraftsAccepted):
			t.Errorf("the device's MTP layer: %d drafts, %d accepted; the CPU runner's %d, %d", gc.DraftsProposed, gc.DraftsAccepted,
				cc.DraftsProposed, cc.DraftsAccepted)
		}
	}
}

// generateThenHit runs the prompts together through the engine on r, then, on the same
// engine, the prompt hit alone, and returns the outputs (hit's last) and the engine's
// counters.
func generateThenHit(t *testing.T, r engine.Runner, pool *kvslab.Pool, prompts [][]int32, hit []int32, sp engine.SamplingParams, budget int) ([]runnertest.Output, engine.Counters) {
	t.Helper()
	s := runnertest.New(t, func(testing.TB) (engine.Runner, *kvslab.Pool) { return r, pool }, runnertest.Options{})
	h := s.StartWith(t, r, pool, engine.Config{MaxBatchTokens: budget})
	outs := append(h.GenerateAll(t, prompts, sp), h.Generate(t, hit, sp))
	c := h.Counters()
	h.Stop(t)
	return outs, c
}
