package tp_test

import (
	"sync"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/dist/tp"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kernels/ref"
	"github.com/resin-llm/resin/core/runnertest"
	"github.com/resin-llm/resin/models/llama"
)

// BenchmarkTP times a 128-token prefill and a decode step (at 128 tokens of context) of a
// 4-layer llama (hidden 512, 8 heads, 4 KV heads, intermediate 1536, vocab 8192) at TP=1
// and TP=2 over in-process ranks, and reports tokens/s and the share of rank 0's step
// spent in collectives (comm-share). On a 2-core machine TP=2 cannot be faster: the
// figure to read is the communication share.
func BenchmarkTP(b *testing.B) {
	c, err := llama.LoadConfig("../../../models/llama")
	if err != nil {
		b.Fatal(err)
	}
	c.HiddenSize, c.NumAttentionHeads, c.NumKeyValueHeads, c.HeadDim = 512, 8, 4, 64
	c.IntermediateSize, c.NumHiddenLayers, c.VocabSize = 1536, 4, 8192
	c.Window = 0
	m, err := llama.NewModel(c, llama.RandomWeights(c, 3), 256)
	if err != nil {
		b.Fatal(err)
	}
	rope, _ := c.RopeTable(256)
	d, w := fromLlama(m, rope)
	for _, phase := range []struct {
		name string
		n    int
	}{{"prefill", 128}, {"decode", 1}} {
		for _, size := range []int{1, 2} {
			b.Run(phase.name+"/tp="+string(rune('0'+size)), func(b *testing.B) {
				pool, err := engine.NewHostPool(llama.CacheGroups(c, 16), 64<<20)
				if err != nil {
					b.Fatal(err)
				}
				seq := runnertest.OpenSeq(b, pool, runnertest.Prompt(129, c.VocabSize, 1))
				plan := runnertest.Plan(b, pool, []*runnertest.Seq{seq}, []int{128}, false)
				if phase.n == 1 {
					plan = runnertest.Plan(b, pool, []*runnertest.Seq{seq}, []int{1}, false)
				}
				comms, _ := dist.NewInProcess(size, dist.Options{Timeout: time.Minute})
				ranks := make([]*dist.Timed, size)
				shards := make([]*tp.Shard, size)
				for r := range size {
					ranks[r] = dist.NewTimed(comms[r])
					shards[r], _ = tp.NewShard(d, w, r, size)
				}
				caches := make([][]ref.PagedKV, size)
				for r := range size {
					caches[r] = shards[r].NewCache(64, 16)
				}
				step := func() {
					var wg sync.WaitGroup
					for r := range size {
						wg.Add(1)
						go func() {
							defer wg.Done()
							if err := shards[r].Forward(ranks[r], plan, caches[r], make([]float32, c.VocabSize)); err != nil {
								b.Error(err)
							}
						}()
					}
					wg.Wait()
				}
				step()
				spent0, _ := ranks[0].Spent()
				b.ResetTimer()
				start := time.Now()
				for range b.N {
					step()
				}
				el := time.Since(start)
				b.ReportMetric(float64(phase.n*b.N)/el.Seconds(), "tok/s")
				spent, _ := ranks[0].Spent()
				b.ReportMetric((spent-spent0).Seconds()/el.Seconds(), "comm-share")
			})
		}
	}
}
