package llama

// This file is the scaffold's: `resin-new update` rewrites it. It runs the checks every
// runtime passes whatever its model, on the runner that testRunner (model_test.go, yours)
// returns.

import (
	"context"
	"testing"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kernels/ref"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/core/runnertest"
)

// TestRunnerConformance runs core/runnertest's model-agnostic suite on the runner through
// the real engine: prefill equals decode, chunked prefill, batch and page-layout
// invariance, reproducibility, prefix-cache hits and aborts.
func TestRunnerConformance(t *testing.T) {
	runnertest.Run(t, testRunner, runnertest.Options{})
}

// TestRunnerConformanceDTypes runs the suite with the projections held in bf16 and int8
// (ref.DType): batching, chunking and paging must not change what either computes.
func TestRunnerConformanceDTypes(t *testing.T) {
	for _, dt := range []ref.DType{ref.DTypeBF16, ref.DTypeInt8} {
		t.Run(string(dt), func(t *testing.T) {
			runnertest.Run(t, func(t testing.TB) (engine.Runner, *kvslab.Pool) { return testRunnerDType(t, dt) }, runnertest.Options{})
		})
	}
}

// BenchmarkExecute measures the runner on one decode step of 8 sequences with 32 tokens
// of context (the same plan replayed), with its allocations.
func BenchmarkExecute(b *testing.B) {
	r, pool := testRunner(b)
	vocab := r.Info().VocabSize
	var seqs []*runnertest.Seq
	ones, pre := make([]int, 8), make([]int, 8)
	for j := range ones {
		seqs = append(seqs, runnertest.OpenSeq(b, pool, runnertest.Prompt(33, vocab, j)))
		ones[j], pre[j] = 1, 32
	}
	if _, err := r.Execute(context.Background(), runnertest.Plan(b, pool, seqs, pre, false)); err != nil {
		b.Fatal(err)
	}
	p := runnertest.Plan(b, pool, seqs, ones, false)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := r.Execute(context.Background(), p); err != nil {
			b.Fatal(err)
		}
	}
}
