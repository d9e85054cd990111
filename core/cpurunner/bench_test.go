package cpurunner_test

import (
	"context"
	"testing"

	"github.com/resin-llm/resin/core/cpurunner"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/core/runnertest"
)

// BenchmarkExecute measures what Runner adds to a model's forward on a decode step of 32
// sequences over a 32000-token vocabulary (the forward here writes the logits once, then
// leaves them): sizing, sampling with logprobs for half of the sequences, filling the
// StepResult; and the same while capturing every row. Both must report 0 allocs/op.
func BenchmarkExecute(b *testing.B) {
	const v, seqs = 32000, 32
	groups := []kvslab.GroupSpec{{Name: "kv", Kind: kvslab.Full, Layers: 1, BytesPerToken: 8, PageTokens: 16}}
	pool, err := engine.NewHostPool(groups, 16<<20)
	if err != nil {
		b.Fatal(err)
	}
	var ss []*runnertest.Seq
	n := make([]int, seqs)
	for i := range n {
		ss = append(ss, runnertest.OpenSeq(b, pool, runnertest.Prompt(9, v, i)))
		n[i] = 9
	}
	runnertest.Plan(b, pool, ss, n, false) // the prompts; the plan below decodes
	for i := range n {
		ss[i].Tokens = append(ss[i].Tokens, int32(i))
		n[i] = 1
	}
	p := runnertest.Plan(b, pool, ss, n, false)
	for i := range n {
		if i%2 == 0 {
			p.Logprobs[i] = 5
		}
	}
	info := engine.RunnerInfo{Name: "bench", VocabSize: v, MaxContext: 4096, CacheGroups: groups}
	filled := false
	r := cpurunner.New(info, cpurunner.ForwardFunc(func(_ *engine.BatchPlan, logits []float32) error {
		// The runner reuses its buffer: logits written once stay for every later step.
		if !filled {
			for j := range logits {
				logits[j] = float32(j%977) * 0.01
			}
			filled = true
		}
		return nil
	}))
	ctx := context.Background()
	for _, capture := range []bool{false, true} {
		name := "plain"
		if capture {
			name = "capture"
			rows := 0
			r.CaptureLogits(func(cpurunner.LogitsRow) { rows++ })
		}
		b.Run(name, func(b *testing.B) {
			if _, err := r.Execute(ctx, p); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if _, err := r.Execute(ctx, p); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
