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

// BenchmarkDSparkDecode measures greedy generation through the engine on the tiny DSpark
// config (block 3), batch 1 and 8 (prompts of 16 tokens, 48 generated each): the main
// model alone ("plain"), with the random drafter's blocks ("dspark", nearly always wrong:
// the cost of speculation at ~0% acceptance) and with the blocks forced to the greedy
// continuation ("dspark-oracle", the ceiling at 100%). It reports generated tokens per
// second and the acceptance rate (the engine's metrics).
func BenchmarkDSparkDecode(b *testing.B) {
	const promptLen, gen = 16, 48
	dir := dsparkRandomDir(b, 3)
	sp := engine.SamplingParams{MaxTokens: gen, IgnoreEOS: true}
	for _, batch := range []int{1, 8} {
		var prompts [][]int32
		for i := range batch {
			prompts = append(prompts, runnertest.Prompt(promptLen+i, 96, 60+i)) // distinct lengths
		}
		plain, pool := openDSpark(b, dir, nil)
		outs, _ := generateB(b, plain, pool, prompts, sp)
		full := map[int][]int32{}
		for i, p := range prompts {
			full[len(p)] = append(slices.Clone(p), outs[i].Tokens...)
		}
		for _, mode := range []struct {
			name           string
			dspark, oracle bool
		}{{"plain", false, false}, {"dspark", true, false}, {"dspark-oracle", true, true}} {
			b.Run(fmt.Sprintf("%s/batch=%d", mode.name, batch), func(b *testing.B) {
				var opts *DSparkOptions
				if mode.dspark {
					opts = &DSparkOptions{}
				}
				r, pool := openDSpark(b, dir, opts)
				if mode.oracle {
					r.forceDraft = func(promptLen, pos int, logits []float32) int32 {
						if seq := full[promptLen]; pos < len(seq) {
							return seq[pos]
						}
						return int32(ref.Argmax(logits))
					}
				}
				s := runnertest.New(b, func(testing.TB) (engine.Runner, *kvslab.Pool) { return r, pool }, runnertest.Options{})
				h := s.StartWith(b, r, pool, engine.Config{})
				b.ResetTimer()
				var decode time.Duration
				for range b.N {
					start := time.Now()
					got := h.GenerateAll(b, prompts, sp)
					decode += time.Since(start)
					for i := range got {
						if !slices.Equal(got[i].Tokens, outs[i].Tokens) {
							b.Fatalf("prompt %d: %v, plain decoding gives %v", i, got[i].Tokens, outs[i].Tokens)
						}
					}
				}
				b.StopTimer()
				drafts := specMetric(b, h.Engine, "resin_spec_decode_draft_tokens_total")
				acc := specMetric(b, h.Engine, "resin_spec_decode_accepted_tokens_total")
				h.Stop(b)
				b.ReportMetric(float64(b.N*batch*gen)/decode.Seconds(), "tok/s")
				if drafts > 0 {
					b.ReportMetric(acc/drafts, "accept")
				}
			})
		}
	}
}
