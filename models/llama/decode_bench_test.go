package llama

import (
	"context"
	"os"
	"testing"

	"github.com/resin-llm/resin/core/kernels/ref"
	"github.com/resin-llm/resin/core/runnertest"
)

// BenchmarkDecodeBatch1 measures one batch-1 decode step of the llama bench config
// (scripts/llama-bench-config.json: ~120M parameters, vocabulary 32000, random weights)
// at a context of 512 tokens, for each dtype: "forward" is Model.Forward alone (the weight
// GEMVs and everything between them), "execute" the runner's Execute (the forward, then
// greedy sampling of the 32000 logits and the StepResult), so their difference is what
// the runner adds per token. The same plan is replayed (its key and value land in the
// same slot each time). Besides ns/op it reports the process's CPU time per token
// (cpu-ms/token: on a shared machine the figure less swayed by other load) and the
// weights' bytes (weight-MB/token), what a token streams from memory at least.
func BenchmarkDecodeBatch1(b *testing.B) {
	data, err := os.ReadFile("../../scripts/llama-bench-config.json")
	if err != nil {
		b.Fatal(err)
	}
	c, err := ParseConfig(data)
	if err != nil {
		b.Fatal(err)
	}
	w := RandomWeights(c, 1)
	const promptLen = 512
	for _, dt := range []ref.DType{ref.DTypeFP32, ref.DTypeBF16, ref.DTypeInt8} {
		b.Run(string(dt), func(b *testing.B) {
			m, err := NewModelDType(c, w, 1024, dt)
			if err != nil {
				b.Fatal(err)
			}
			r := NewRunner(m, 16)
			pool, err := r.NewPool(64 << 20)
			if err != nil {
				b.Fatal(err)
			}
			// The prompt's pages are reserved but not prefilled (that would take longer than
			// the decode steps measured, and swamp a profile): its keys and values are
			// written as varied numbers instead. Untouched memory would read as the kernel's
			// shared zero page, from cache.
			s := runnertest.OpenSeq(b, pool, runnertest.Prompt(promptLen+1, c.VocabSize, 0))
			runnertest.Plan(b, pool, []*runnertest.Seq{s}, []int{promptLen}, false)
			for _, l := range r.kv.Layers {
				for _, x := range [][]float32{l.K, l.V} {
					for i := range x {
						x[i] = float32(i%61-30) / 30
					}
				}
			}
			ctx := context.Background()
			p := runnertest.Plan(b, pool, []*runnertest.Seq{s}, []int{1}, false)
			logits := make([]float32, c.VocabSize)
			for _, part := range []struct {
				name string
				step func() error
			}{
				{"forward", func() error { return m.Forward(p, r.kv, logits) }},
				{"execute", func() error { _, err := r.Execute(ctx, p); return err }},
			} {
				b.Run(part.name, func(b *testing.B) {
					if err := part.step(); err != nil { // warm: buffers sized, pool started
						b.Fatal(err)
					}
					b.ReportAllocs()
					cpu0 := processCPU()
					b.ResetTimer()
					for range b.N {
						if err := part.step(); err != nil {
							b.Fatal(err)
						}
					}
					b.StopTimer()
					if cpu := processCPU() - cpu0; cpu > 0 {
						b.ReportMetric(float64(cpu.Microseconds())/1e3/float64(b.N), "cpu-ms/token")
					}
					b.ReportMetric(float64(m.WeightBytes())/1e6, "weight-MB/token")
				})
			}
		})
	}
}
