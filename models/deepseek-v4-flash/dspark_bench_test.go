package deepseekv4flash

import (
	"fmt"
	"testing"

	"github.com/resin-llm/resin/core/engine"
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
		full := greedyFull(prompts, outs)
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
					r.forceDraft = oracleDraft(full)
				}
				benchDecode(b, r, pool, prompts, sp, outs)
			})
		}
	}
}
