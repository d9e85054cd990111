package pydemo

// This file is the scaffold's: `resin-new update` rewrites it. It runs the checks every
// runtime passes whatever its model, on the runner that testRunner (model_test.go, yours)
// returns, and the Python package's own tests.

import (
	"context"
	"testing"

	"github.com/resin-llm/resin/core/runnertest"
)

// TestRunnerConformance runs core/runnertest's model-agnostic suite on the Python runner
// through the real engine and the runner protocol: prefill equals decode, chunked prefill,
// batch and page-layout invariance, reproducibility, prefix-cache hits and aborts.
func TestRunnerConformance(t *testing.T) {
	runnertest.Run(t, testRunner, runnertest.Options{})
}

// TestPythonPackage runs the Python package's tests (python/tests: the paged forward
// against the naive one, the weight loader) with the runtime's interpreter.
func TestPythonPackage(t *testing.T) {
	runPythonTests(t, needPython(t), "discover", "-s", "python/tests", "-t", "python")
}

// BenchmarkExecute measures one decode step of 8 sequences with 32 tokens of context (the
// same plan replayed) through the protocol: encoding, the pipe, the Python forward and
// sampling, decoding the result.
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
