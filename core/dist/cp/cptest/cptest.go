// Package cptest checks a model's prefill context parallelism (core/dist/cp) against its
// single-rank forward: the same plans through both, the same logits and tokens.
package cptest

import (
	"math"
	"testing"

	"github.com/resin-llm/resin/core/cpurunner"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/core/runnertest"
)

// Run feeds through forward, on pool, plans as the engine schedules them: a 37-token
// prompt in chunks of 13, 11 and 13 (the first two without logits rows, as the engine
// schedules a prompt it splits; the last with every row's), then 8 greedy decode steps;
// a 5-token and a 2-token prompt whole (every row's logits) and 4 decode steps each; and
// a 20-token prompt whose first 9 tokens share a plan with another sequence, its other
// 11 alone. It returns every step's logits and the decoded tokens. Under CP over 2 or 3
// ranks the single-sequence prefills split (SplitPlans of them): the 37-token prompt's
// three chunks (the later two continuing the state the other ranks keep) and the 5- and
// 2-token prompts (over 3 ranks chunks of 2, 2, 1 and of 1, 1, 0), not the plan of two
// sequences, nor the continuation after it (the other ranks do not hold that prompt),
// nor a decode step.
func Run(t *testing.T, forward cpurunner.ForwardFunc, pool *kvslab.Pool, vocab int) ([][]float32, []int32) {
	t.Helper()
	var all [][]float32
	var toks []int32
	step := func(seqs []*runnertest.Seq, n []int, rows bool) []float32 {
		p := runnertest.Plan(t, pool, seqs, n, rows)
		if !rows && len(seqs) == 1 && seqs[0].Computed < len(seqs[0].Tokens) {
			p.LogitsIndices, p.LogitsStart = p.LogitsIndices[:0], []int32{0, 0} // a mid-prompt chunk samples nothing
		}
		logits := make([]float32, len(p.LogitsIndices)*vocab)
		if err := forward(p, logits); err != nil {
			t.Fatalf("step over %v tokens after %v: %v", n, p.Computed, err)
		}
		all = append(all, logits)
		return logits
	}
	decode := func(s *runnertest.Seq, last []float32, steps int) {
		for range steps {
			tok := argmax(last[len(last)-vocab:])
			s.Tokens = append(s.Tokens, tok)
			toks = append(toks, tok)
			last = step([]*runnertest.Seq{s}, []int{1}, false)
		}
	}
	a := runnertest.OpenSeq(t, pool, runnertest.Prompt(37, vocab, 3))
	step([]*runnertest.Seq{a}, []int{13}, false)
	step([]*runnertest.Seq{a}, []int{11}, false)
	decode(a, step([]*runnertest.Seq{a}, []int{13}, true), 8)
	for i, n := range []int{5, 2} {
		s := runnertest.OpenSeq(t, pool, runnertest.Prompt(n, vocab, 10+i))
		decode(s, step([]*runnertest.Seq{s}, []int{n}, true), 4)
	}
	c := runnertest.OpenSeq(t, pool, runnertest.Prompt(20, vocab, 5))
	other := runnertest.OpenSeq(t, pool, runnertest.Prompt(3, vocab, 6))
	step([]*runnertest.Seq{c, other}, []int{9, 3}, true)
	decode(c, step([]*runnertest.Seq{c}, []int{11}, true), 4)
	return all, toks
}

// Continuation feeds through forward, on pool, a 37-token prompt in chunks of 13, 11 and
// 13 tokens (every row's logits), 8 greedy decode steps, then a second prompt sharing the
// first's 24 tokens, opened through pool's prefix cache, its other 10 tokens in one plan
// and 8 more decode steps. It returns every step's logits and the decoded tokens. Under
// CP the chunks and the rest after the prefix hit split (ContinuationSplits of them),
// the later ones over cached keys.
func Continuation(t *testing.T, forward cpurunner.ForwardFunc, pool *kvslab.Pool, vocab int) ([][]float32, []int32) {
	t.Helper()
	var all [][]float32
	var toks []int32
	step := func(s *runnertest.Seq, n int, rows bool) []float32 {
		p := runnertest.Plan(t, pool, []*runnertest.Seq{s}, []int{n}, rows)
		logits := make([]float32, len(p.LogitsIndices)*vocab)
		if err := forward(p, logits); err != nil {
			t.Fatalf("step over %d tokens after %v: %v", n, p.Computed, err)
		}
		all = append(all, logits)
		return logits
	}
	decode := func(s *runnertest.Seq, last []float32) {
		for range 8 {
			tok := argmax(last[len(last)-vocab:])
			s.Tokens = append(s.Tokens, tok)
			toks = append(toks, tok)
			last = step(s, 1, false)
		}
	}
	first := runnertest.Prompt(37, vocab, 3)
	a := runnertest.OpenSeq(t, pool, append([]int32(nil), first...))
	step(a, 13, true)
	step(a, 11, true)
	last := step(a, 13, true)
	if err := pool.Commit(a.ID, a.Tokens[:a.Computed]); err != nil {
		t.Fatal(err)
	}
	decode(a, last)
	second := append(append([]int32(nil), first[:24]...), runnertest.Prompt(10, vocab, 4)...)
	id, hit, err := pool.Open(second[:len(second)-1])
	if err != nil {
		t.Fatal(err)
	}
	if hit != 24 {
		t.Fatalf("the prefix cache served %d tokens of the second prompt, want 24", hit)
	}
	b := &runnertest.Seq{ID: id, Tokens: second, Computed: hit}
	decode(b, step(b, 10, true))
	return all, toks
}

// ContinuationSplits is how many of Continuation's plans split under CP.
const ContinuationSplits = 4

// SameContinuation runs Continuation through one rank's forward on its pool and through
// a CP group's on its own, and fails unless ContinuationSplits of the group's plans split
// (splits: core/dist/cp's Splits) and its logits and tokens are one rank's (Same, within
// 1e-5). It returns the group's logits.
func SameContinuation(t *testing.T, what string, one cpurunner.ForwardFunc, onePool *kvslab.Pool, group cpurunner.ForwardFunc, groupPool *kvslab.Pool, vocab int, splits func(*engine.BatchPlan) bool) [][]float32 {
	t.Helper()
	want, wantToks := Continuation(t, one, onePool, vocab)
	n := 0
	got, gotToks := Continuation(t, func(p *engine.BatchPlan, logits []float32) error {
		if splits(p) {
			n++
		}
		return group(p, logits)
	}, groupPool, vocab)
	if n != ContinuationSplits {
		t.Fatalf("%s: %d plans split, want %d", what, n, ContinuationSplits)
	}
	Same(t, what, got, want, gotToks, wantToks, vocab, 1e-5)
	return got
}

// SplitPlans is how many of Run's plans split under CP.
const SplitPlans = 5

// Same fails unless got's logits are want's within tol of each row's largest magnitude
// and the tokens are equal.
func Same(t *testing.T, what string, got, want [][]float32, gotToks, wantToks []int32, vocab int, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d steps, one rank %d", what, len(got), len(want))
	}
	worst := 0.0
	for s := range want {
		if len(got[s]) != len(want[s]) {
			t.Fatalf("%s: step %d: %d logits, one rank %d", what, s, len(got[s]), len(want[s]))
		}
		for r := 0; r < len(want[s]); r += vocab {
			row, ref := got[s][r:r+vocab], want[s][r:r+vocab]
			scale := 0.0
			for _, x := range ref {
				scale = max(scale, math.Abs(float64(x)))
			}
			for i := range ref {
				d := math.Abs(float64(row[i]-ref[i])) / scale
				worst = max(worst, d)
				if !(d <= tol) {
					t.Fatalf("%s: step %d row %d logit %d: %g, one rank %g", what, s, r/vocab, i, row[i], ref[i])
				}
			}
		}
	}
	for i := range wantToks {
		if gotToks[i] != wantToks[i] {
			t.Fatalf("%s: decode step %d: token %d, one rank %d", what, i, gotToks[i], wantToks[i])
		}
	}
	t.Logf("%s: largest relative difference %.2g", what, worst)
}

// SameBits fails unless two runs' logits are bit-identical.
func SameBits(t *testing.T, what string, got, want [][]float32) {
	t.Helper()
	for s := range want {
		for i := range want[s] {
			if math.Float32bits(got[s][i]) != math.Float32bits(want[s][i]) {
				t.Fatalf("%s: step %d logit %d: %g, then %g", what, s, i, got[s][i], want[s][i])
			}
		}
	}
}

func argmax(x []float32) int32 {
	best := 0
	for i, v := range x {
		if v > x[best] {
			best = i
		}
	}
	return int32(best)
}
