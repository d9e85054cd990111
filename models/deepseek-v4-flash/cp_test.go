package deepseekv4flash

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/dist/cp/cptest"
	"github.com/resin-llm/resin/core/runnertest"
)

// TestCPEqualsOneRank: prefill CP over 2 and 3 ranks gives one rank's logits (within 1e-5
// of each row's largest) and greedy tokens over cptest.Run's plans (a prompt split into
// three chunks, short prompts leaving a rank empty, a continuation run on rank 0 alone),
// splitting exactly the single-sequence prefills the other ranks can run; two runs are
// bit-identical.
func TestCPEqualsOneRank(t *testing.T) {
	fwd, pool := oneRank(t)
	v := tinyConfig(t).VocabSize
	want, wantToks := cptest.Run(t, fwd, pool, v)
	for _, size := range []int{2, 3} {
		what := fmt.Sprintf("CP=%d", size)
		var runs [][][]float32
		for range 2 {
			g, pool, err := OpenCPInProcess(tinyDir(t), tinyOpts, size, 8<<20, dist.Options{Timeout: 30 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			got, toks := cptest.Run(t, g.Forward, pool, v)
			if err := g.StopRanks(); err != nil {
				t.Error(err)
			}
			cptest.Same(t, what, got, want, toks, wantToks, v, 1e-5)
			if g.cp.SplitSteps() != cptest.SplitPlans {
				t.Errorf("%s: %d plans split, want %d", what, g.cp.SplitSteps(), cptest.SplitPlans)
			}
			runs = append(runs, got)
		}
		cptest.SameBits(t, what+" twice", runs[1], runs[0])
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
