package deepseekv4flash

import (
	"strings"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/cpurunner"
	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/core/runnertest"
)

// cpRun feeds through forward, on pool: a 37-token prompt in chunks of 13, 11 and 13
// (the first two without logits rows, as the engine schedules a prompt it splits; the
// last with every row's), then 8 greedy decode steps; a 5-token and a 2-token prompt
// whole (every row's logits) and 4 decode steps each; and a 20-token prompt whose first 9
// tokens share a plan with another sequence, its other 11 alone. It returns every step's
// logits and the decoded tokens.
func cpRun(t *testing.T, forward cpurunner.ForwardFunc, pool *kvslab.Pool) ([][]float32, []int32) {
	t.Helper()
	v := tinyConfig(t).VocabSize
	var all [][]float32
	var toks []int32
	step := func(seqs []*runnertest.Seq, n []int, rows bool) []float32 {
		p := runnertest.Plan(t, pool, seqs, n, rows)
		if !rows && len(seqs) == 1 && seqs[0].Computed < len(seqs[0].Tokens) {
			p.LogitsIndices, p.LogitsStart = p.LogitsIndices[:0], []int32{0, 0} // a mid-prompt chunk samples nothing
		}
		logits := make([]float32, len(p.LogitsIndices)*v)
		if err := forward(p, logits); err != nil {
			t.Fatalf("step over %v tokens after %v: %v", n, p.Computed, err)
		}
		all = append(all, logits)
		return logits
	}
	decodeSteps := func(s *runnertest.Seq, last []float32, steps int) {
		for range steps {
			tok := argmaxID(last[len(last)-v:])
			s.Tokens = append(s.Tokens, tok)
			toks = append(toks, tok)
			last = step([]*runnertest.Seq{s}, []int{1}, false)
		}
	}
	a := runnertest.OpenSeq(t, pool, runnertest.Prompt(37, v, 3))
	step([]*runnertest.Seq{a}, []int{13}, false)
	step([]*runnertest.Seq{a}, []int{11}, false)
	decodeSteps(a, step([]*runnertest.Seq{a}, []int{13}, true), 8)
	for i, n := range []int{5, 2} {
		s := runnertest.OpenSeq(t, pool, runnertest.Prompt(n, v, 10+i))
		decodeSteps(s, step([]*runnertest.Seq{s}, []int{n}, true), 4)
	}
	c := runnertest.OpenSeq(t, pool, runnertest.Prompt(20, v, 5))
	other := runnertest.OpenSeq(t, pool, runnertest.Prompt(3, v, 6))
	step([]*runnertest.Seq{c, other}, []int{9, 3}, true)
	decodeSteps(c, step([]*runnertest.Seq{c}, []int{11}, true), 4)
	return all, toks
}

// TestCPEqualsOneRank: prefill CP over 2 and 3 ranks gives one rank's logits (within 1e-5
// of each row's largest) and greedy tokens for a prompt split by the engine into three
// chunks (the later two continuing the state the other ranks keep), prompts of 5 and 2
// tokens (3 ranks: chunks of 2, 2, 1 and of 1, 1, 0), and a prompt continued alone after
// a plan with another sequence (run on rank 0 alone); the plans split are exactly the
// single-sequence prefills the other ranks can run. Two runs are bit-identical.
func TestCPEqualsOneRank(t *testing.T) {
	fwd, pool := oneRank(t)
	want, wantToks := cpRun(t, fwd, pool)
	v := tinyConfig(t).VocabSize
	for _, size := range []int{2, 3} {
		var runs [][][]float32
		for range 2 {
			g, pool, err := OpenCPInProcess(tinyDir(t), tinyOpts, size, 8<<20, dist.Options{Timeout: 30 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			got, toks := cpRun(t, g.Forward, pool)
			if err := g.StopRanks(); err != nil {
				t.Error(err)
			}
			what := "CP=" + string(rune('0'+size))
			closeLogits(t, what, got, want, v, 1e-5)
			sameTokens(t, what, toks, wantToks)
			// The 37-token prompt's 3 chunks, the 5- and 2-token prompts; not the plan of
			// two sequences, nor the continuation after it, nor any decode step.
			if g.cp.SplitSteps() != 5 {
				t.Errorf("%s: %d plans split, want 5", what, g.cp.SplitSteps())
			}
			runs = append(runs, got)
		}
		sameRunBits(t, "CP="+string(rune('0'+size))+" twice", runs[1], runs[0])
	}
}

// TestCPRefusals: a CP group does not draft, and a rank asked to continue a prompt it
// does not hold says so (and the step fails on every rank instead of waiting).
func TestCPRefusals(t *testing.T) {
	if _, _, err := OpenCPInProcess(tinyDir(t), Options{Seed: 7, MaxContext: 512, Drafts: 1}, 2, 8<<20, dist.Options{Timeout: time.Second}); err == nil {
		t.Error("CP with MTP drafts: no error")
	}
	g, pool, err := OpenCPInProcess(tinyDir(t), tinyOpts, 2, 8<<20, dist.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer g.StopRanks()
	v := tinyConfig(t).VocabSize
	s := runnertest.OpenSeq(t, pool, runnertest.Prompt(12, v, 1))
	p := runnertest.Plan(t, pool, []*runnertest.Seq{s}, []int{6}, false)
	p.LogitsIndices, p.LogitsStart = p.LogitsIndices[:0], []int32{0, 0}
	if err := g.Forward(p, nil); err != nil {
		t.Fatal(err)
	}
	// Rank 0 believes the other ranks hold request 9 at 6 tokens; they hold request 1.
	p = runnertest.Plan(t, pool, []*runnertest.Seq{s}, []int{6}, false)
	p.ReqIDs[0] = 9
	g.cp.Hold(9, 6)
	err = g.Forward(p, make([]float32, len(p.LogitsIndices)*v))
	if err == nil || !strings.Contains(err.Error(), "cp rank 1") || !strings.Contains(err.Error(), "holds no state") {
		t.Fatalf("a continuation the other ranks do not hold: %v", err)
	}
	// The group goes on: the next prompt starts afresh on every rank.
	s2 := runnertest.OpenSeq(t, pool, runnertest.Prompt(7, v, 2))
	p = runnertest.Plan(t, pool, []*runnertest.Seq{s2}, []int{7}, true)
	if err := g.Forward(p, make([]float32, len(p.LogitsIndices)*v)); err != nil {
		t.Fatalf("after a refused step: %v", err)
	}
}
