package engine_test

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/resin-llm/resin/core/engine"
)

// BenchmarkSampler measures Sample on one row of 32000 logits (a llama vocabulary) for
// each kind of request a decode step serves: greedy without logprobs (what a batch-1
// greedy decode pays per token besides its forward), greedy with the token's logprob and
// with 5 alternatives, and sampled with temperature, top-k, top-p and min-p. The logits
// are a spread of normal draws with a few standing out, as a model's are. cpu-µs/op is
// the process's CPU time per call: on a shared machine the figure less swayed by load.
func BenchmarkSampler(b *testing.B) {
	const vocab = 32000
	rng := rand.New(rand.NewPCG(1, 2))
	logits := make([]float32, vocab)
	for i := range logits {
		logits[i] = float32(rng.NormFloat64() * 2)
	}
	for i := range 20 {
		logits[rng.IntN(vocab)] = float32(8 + i%5)
	}
	for _, c := range []struct {
		name string
		row  engine.SamplingRow
	}{
		{"greedy", engine.SamplingRow{Logprobs: -1}},
		{"greedy-logprob", engine.SamplingRow{Logprobs: 0}},
		{"greedy-top5", engine.SamplingRow{Logprobs: 5}},
		{"temperature", engine.SamplingRow{Temperature: 0.8, Seed: 1, Logprobs: -1}},
		{"top-k-40", engine.SamplingRow{Temperature: 0.8, TopK: 40, Seed: 1, Logprobs: -1}},
		{"top-p-0.9", engine.SamplingRow{Temperature: 0.8, TopP: 0.9, Seed: 1, Logprobs: -1}},
		{"min-p-0.05", engine.SamplingRow{Temperature: 0.8, MinP: 0.05, Seed: 1, Logprobs: -1}},
	} {
		b.Run(c.name, func(b *testing.B) {
			var s engine.Sampler
			var top []engine.TopLogprob
			var sink float32
			b.ReportAllocs()
			cpu0 := processCPU()
			for i := range b.N {
				var lp float32
				_, lp, top = s.Sample(logits, c.row, i, top[:0])
				sink += lp
			}
			if cpu := processCPU() - cpu0; cpu > 0 {
				b.ReportMetric(float64(cpu.Nanoseconds())/1e3/float64(b.N), "cpu-µs/op")
			}
			if math.IsNaN(float64(sink)) {
				b.Log(sink)
			}
		})
	}
}
