package deepseekv4flash

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kernels/ref"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/core/runnertest"
)

// BenchmarkMTPDecode measures greedy generation through the engine on the tiny config,
// batch 1 and 8 (prompts of 16 tokens, 48 generated each): without drafts ("plain"),
// with the MTP head's drafts ("mtp"; random weights make them nearly always wrong, so
// this is the cost of speculation at ~0% acceptance), and with drafts forced to the
// greedy continuation ("mtp-oracle", the ceiling at 100%; "mtp3-oracle" with 3 drafts
// per step). It reports generated tokens
// per second and the acceptance rate (the engine's resin_spec_decode_accepted_tokens_total
// over resin_spec_decode_draft_tokens_total).
func BenchmarkMTPDecode(b *testing.B) {
	const promptLen, gen = 16, 48
	m := tinyModel(b)
	v := m.Config.VocabSize
	sp := engine.SamplingParams{MaxTokens: gen, IgnoreEOS: true}
	for _, batch := range []int{1, 8} {
		var prompts [][]int32
		for i := range batch {
			prompts = append(prompts, runnertest.Prompt(promptLen+i, v, 60+i)) // distinct lengths
		}
		// The greedy continuations, for the oracle's drafts.
		plain := NewRunner(m, 8)
		pool, err := plain.NewPool(32 << 20)
		if err != nil {
			b.Fatal(err)
		}
		outs, _ := generateB(b, plain, pool, prompts, sp)
		full := greedyFull(prompts, outs)
		for _, mode := range []struct {
			name   string
			drafts int
			oracle bool
		}{{"plain", 0, false}, {"mtp", 1, false}, {"mtp-oracle", 1, true}, {"mtp3-oracle", 3, true}} {
			b.Run(fmt.Sprintf("%s/batch=%d", mode.name, batch), func(b *testing.B) {
				r := NewRunner(m, 8)
				if mode.drafts > 0 {
					if r, err = NewMTPRunner(m, 8, mode.drafts); err != nil {
						b.Fatal(err)
					}
				}
				if mode.oracle {
					r.forceDraft = oracleDraft(full)
				}
				pool, err := r.NewPool(32 << 20)
				if err != nil {
					b.Fatal(err)
				}
				benchDecode(b, r, pool, prompts, sp, outs)
			})
		}
	}
}

// greedyFull maps each prompt's length to the prompt followed by its greedy continuation
// (prompts of distinct lengths), for oracleDraft.
func greedyFull(prompts [][]int32, outs []runnertest.Output) map[int][]int32 {
	full := map[int][]int32{}
	for i, p := range prompts {
		full[len(p)] = append(slices.Clone(p), outs[i].Tokens...)
	}
	return full
}

// oracleDraft is a forceDraft that drafts the greedy continuation in full (the ceiling
// at 100% acceptance), the main model's argmax past its end.
func oracleDraft(full map[int][]int32) func(promptLen, pos int, logits []float32) int32 {
	return func(promptLen, pos int, logits []float32) int32 {
		if seq := full[promptLen]; pos < len(seq) {
			return seq[pos]
		}
		return int32(ref.Argmax(logits))
	}
}

// forcedDraft is a forceDraft that drafts the greedy continuation but a wrong token (the
// argmax's successor in a vocabulary of vocab) at every every-th position and past the
// continuation's end, so that drafts are accepted and rejected at every offset.
func forcedDraft(full map[int][]int32, every, vocab int) func(promptLen, pos int, logits []float32) int32 {
	return func(promptLen, pos int, logits []float32) int32 {
		if seq := full[promptLen]; pos < len(seq) && pos%every != 0 {
			return seq[pos]
		}
		return (int32(ref.Argmax(logits)) + 1) % int32(vocab)
	}
}

// benchDecode generates the prompts together through a fresh engine on r b.N times, each
// run equal to outs (plain greedy decoding), and reports generated tokens per second of
// the timed generation (the prompts are prefilled in its first step) and the acceptance
// rate from the engine's metrics, which must agree with its counters.
func benchDecode(b *testing.B, r *Runner, pool *kvslab.Pool, prompts [][]int32, sp engine.SamplingParams, outs []runnertest.Output) {
	b.Helper()
	s := runnertest.New(b, func(testing.TB) (engine.Runner, *kvslab.Pool) { return r, pool }, runnertest.Options{})
	h := s.StartWith(b, r, pool, engine.Config{})
	b.ResetTimer()
	var decode time.Duration
	tokens := 0
	for range b.N {
		start := time.Now()
		got := h.GenerateAll(b, prompts, sp)
		decode += time.Since(start)
		for i := range got {
			if !slices.Equal(got[i].Tokens, outs[i].Tokens) {
				b.Fatalf("prompt %d: %v, plain decoding gives %v", i, got[i].Tokens, outs[i].Tokens)
			}
			tokens += len(got[i].Tokens)
		}
	}
	b.StopTimer()
	c := h.Counters()
	drafts := specMetric(b, h.Engine, "resin_spec_decode_draft_tokens_total")
	acc := specMetric(b, h.Engine, "resin_spec_decode_accepted_tokens_total")
	if acc != float64(c.DraftsAccepted) || drafts != float64(c.DraftsProposed) {
		b.Fatalf("metrics say %g/%g drafts accepted, counters %d/%d", acc, drafts, c.DraftsAccepted, c.DraftsProposed)
	}
	h.Stop(b)
	b.ReportMetric(float64(tokens)/decode.Seconds(), "tok/s")
	if drafts > 0 {
		b.ReportMetric(acc/drafts, "accept")
	}
}

// generateB runs the prompts together through a fresh engine on r.
func generateB(b *testing.B, r *Runner, pool *kvslab.Pool, prompts [][]int32, sp engine.SamplingParams) ([]runnertest.Output, engine.Counters) {
	b.Helper()
	s := runnertest.New(b, func(testing.TB) (engine.Runner, *kvslab.Pool) { return r, pool }, runnertest.Options{})
	h := s.StartWith(b, r, pool, engine.Config{})
	outs := h.GenerateAll(b, prompts, sp)
	c := h.Counters()
	h.Stop(b)
	return outs, c
}

// specMetric reads a counter of the engine's Prometheus registry.
func specMetric(t testing.TB, e *engine.Engine, name string) float64 {
	t.Helper()
	mfs, err := e.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			sum := 0.0
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
			return sum
		}
	}
	t.Fatalf("the engine exports no %s", name)
	return 0
}
