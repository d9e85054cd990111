package glm5flash

import (
	"bytes"
	"fmt"
	"os"
	"slices"
	"testing"

	"github.com/resin-llm/resin/core/cpurunner"
	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/cudart/emutest"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/gpurunner"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/core/runnertest"
)

// TestEmulatedCPEqualsOne runs the tiny model (KDA and MLA-DSA layers, a shared indexer,
// pools of 4, 16-token blocks) with prefill context parallelism over 2 and 3 emulated
// GPUs (NewGPUCP) and on one GPURunner: a 21-token prompt in one plan (split 11 + 10, and
// 7 + 7 + 7: the KDA recurrence crosses a block end and checkpoints, the indexer's pools
// close across the ranks' chunks), decode steps (every rank whole, decode graphs), then a
// second prompt of 11 tokens in plans of 4, 4 and 3 (each split again from the slot and
// state page every rank holds; under CP=3 a plan of 4 leaves the third rank no tokens,
// and it runs the exchanges and the recurrence alone) and its decode. The logits equal
// one GPU's bit for bit, the greedy tokens too, and the prompts' plans ran split. New
// allocations read NaN (RESIN_EMU_POISON), so a latent, key or recurrence input no rank
// wrote, or a gathered row read past a rank's chunk, fails; and every rank's cache pool
// ends holding one GPU's bytes, the KDA block checkpoints a prefix hit resumes from
// included.
func TestEmulatedCPEqualsOne(t *testing.T) {
	if emutest.Reexec(t, "RESIN_EMU_DEVICES=3", "RESIN_EMU_POISON=1") {
		return
	}
	m := ungroupedTiny(t)
	f1, p1, _ := layoutForward(t, m, Layout{}, nil)
	wantLogits, wantToks := cpDecode(t, f1, p1)
	for _, size := range []int{2, 3} {
		g, pool := cpGroup(t, m, size)
		logits, toks := cpDecode(t, g.group.Forward, pool)
		sameCPRun(t, fmt.Sprintf("cp=%d", size), g.ranks, g.SplitSteps(), toks, logits, wantToks, wantLogits, p1)
		if graph, _ := g.ranks[0].StepCounts(); graph == 0 {
			t.Errorf("cp=%d: no decode step replayed a graph", size)
		}
	}
}

// sameCPRun fails unless a CP run (its ranks, the steps rank 0 ran split) printed the
// reference's greedy tokens and logits bit for bit, every rank's cache pool (the MLA rows'
// pages, the pools, the KDA states and block checkpoints) ends holding the reference's
// pool's bytes, and the prompts' 4 plans ran split.
func sameCPRun(t *testing.T, what string, ranks []*GPURunner, split int, toks []int32, logits [][]float32, wantToks []int32, wantLogits [][]float32, ref *kvslab.Pool) {
	t.Helper()
	if !slices.Equal(toks, wantToks) {
		t.Fatalf("%s: greedy tokens %v, want %v", what, toks, wantToks)
	}
	for s := range wantLogits {
		if !slices.Equal(logits[s], wantLogits[s]) {
			t.Fatalf("%s: step %d's logits differ from the reference's by %.3g of their largest", what, s, relDiff(logits[s], wantLogits[s]))
		}
	}
	want := arenaBytes(t, ref)
	for r, rr := range ranks {
		if got := arenaBytes(t, rr.g.pool); !bytes.Equal(got, want) {
			t.Errorf("%s: rank %d's cache pool differs from the reference's", what, r)
		}
	}
	if split != 4 {
		t.Errorf("%s: %d steps ran split, want the prompts' 4", what, split)
	}
}

// arenaBytes is pool's device memory (a DeviceArena's).
func arenaBytes(t *testing.T, pool *kvslab.Pool) []byte {
	t.Helper()
	b, err := pool.Arena().(*cudart.DeviceArena).Download()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// cpGroup is the tiny model m over size emulated GPUs by prefill CP, decode graphs on.
func cpGroup(t *testing.T, m *TextModel, size int) (*GPUCP, *kvslab.Pool) {
	t.Helper()
	cache, err := cudart.OpenKernelCache(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var devs []*cudart.Device
	for r := range size {
		d, err := cudart.OpenDevice(r)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		devs = append(devs, d)
	}
	g, pool, err := NewGPUCP(m, devs, cache, 4, 32, 4, 0, GPUOptions{}, 8<<20)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := g.Close(); err != nil {
			t.Error(err)
		}
	})
	if err := g.UseGraphs(true, nil); err != nil {
		t.Fatal(err)
	}
	return g, pool
}

// cpDecode runs TestEmulatedCPEqualsOne's plans through forward and returns every
// plan's logits and the greedy tokens.
func cpDecode(t *testing.T, forward cpurunner.ForwardFunc, pool *kvslab.Pool) ([][]float32, []int32) {
	t.Helper()
	v := tinyTextModel(t).Config.VocabSize
	var all [][]float32
	var toks []int32
	step := func(s *runnertest.Seq, n int) int32 {
		plan := runnertest.Plan(t, pool, []*runnertest.Seq{s}, []int{n}, false)
		logits := make([]float32, v)
		if err := forward(plan, logits); err != nil {
			t.Fatal(err)
		}
		all = append(all, logits)
		return int32(argmax(logits))
	}
	run := func(s *runnertest.Seq, chunks []int, decode int) {
		var tok int32
		for _, n := range chunks {
			tok = step(s, n)
		}
		for range decode {
			s.Tokens = append(s.Tokens, tok)
			toks = append(toks, tok)
			tok = step(s, 1)
		}
		toks = append(toks, tok)
	}
	run(runnertest.OpenSeq(t, pool, runnertest.Prompt(21, v, 1)), []int{21}, 4)
	run(runnertest.OpenSeq(t, pool, runnertest.Prompt(11, v, 2)), []int{4, 4, 3}, 3)
	if testing.Verbose() {
		t.Log(fmt.Sprint("tokens ", toks))
	}
	return all, toks
}

// TestEmulatedCPOverEPEqualsEP runs TestEmulatedCPEqualsOne's plans with prefill CP over
// the ranks of an expert-parallel layout (Layout.CP: each rank its experts alone, a split
// step's MoE over every rank's rows) on 2 and 3 emulated GPUs (3: an expert-less rank; a
// plan of 4 leaves it no tokens, and it runs its part of the others' MoE alone), by the
// gather dispatch and by the all-to-all one (each rank's chunk its share of the rows),
// against the same EP layout without CP: the logits equal bit for bit (a split step's MoE sums
// the same partials in the same order), every rank's cache pool holds the EP layout's
// rank 0's bytes, and the prompts' plans ran split.
func TestEmulatedCPOverEPEqualsEP(t *testing.T) {
	if emutest.Reexec(t, "RESIN_EMU_DEVICES=3", "RESIN_EMU_POISON=1") {
		return
	}
	m := ungroupedTiny(t)
	for _, l := range []Layout{{EP: 2}, {EP: 3}, {EP: 2, Dispatch: DispatchAllToAll}, {EP: 3, Dispatch: DispatchAllToAll}} {
		size := fmt.Sprintf("%d %s", l.EP, l.Dispatch)
		fe, pe, _ := layoutForward(t, m, l, nil)
		wantLogits, wantToks := cpDecode(t, fe, pe)
		l.CP = true
		f, _, g := layoutForward(t, m, l, nil)
		logits, toks := cpDecode(t, f, g.ranks[0].g.pool)
		sameCPRun(t, "cp over ep="+size, g.ranks, g.SplitSteps(), toks, logits, wantToks, wantLogits, pe)
		if graph, _ := g.StepCounts(); graph == 0 && l.Dispatch == DispatchGather { // all-to-all steps run eagerly
			t.Errorf("cp over ep=%s: no decode step replayed a graph", size)
		}
	}
}

// TestEmulatedOpenGPUCP serves through the engine, on 2 emulated GPUs, OpenGPUCP's prefill
// CP and OpenGPULayout's CP over EP=2 against OpenGPU on one: two prompts in one batch (a
// plan of two sequences, run whole on every rank), then a prompt sharing 18 tokens of the
// second, which resumes from its cached prefix (the KDA checkpoint at 16 and the MLA rows
// through each rank's own pages) and runs its other tokens split. The greedy tokens equal
// one GPU's, the third prompt hit the prefix cache, and it ran split.
func TestEmulatedOpenGPUCP(t *testing.T) {
	if emutest.Reexec(t, "RESIN_EMU_DEVICES=2") {
		return
	}
	dir := tinyDir(t)
	opts := gpurunner.Options{Limits: gpurunner.Limits{MaxTokens: 64, MaxSeqs: 4}, KernelCache: os.Getenv("RESIN_KERNEL_CACHE")}
	cfg := engine.Config{MaxBatchTokens: 64, MaxSeqs: 4}
	sp := engine.SamplingParams{MaxTokens: 5, IgnoreEOS: true}
	vocab := tinyTextModel(t).Config.VocabSize
	prompts := [][]int32{runnertest.Prompt(9, vocab, 5), runnertest.Prompt(20, vocab, 6)}
	hit := append(slices.Clone(prompts[1][:18]), 7, 8, 9, 10, 11)
	var s runnertest.Suite
	one, pool, err := OpenGPU(dir, 4<<20, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer one.(*GPURunner).Close()
	e := s.StartWith(t, one, pool, cfg)
	want := append(e.GenerateAll(t, prompts, sp), e.Generate(t, hit, sp))
	e.Stop(t)
	type cpRunner interface {
		engine.Runner
		SplitSteps() int
		Close() error
	}
	for _, c := range []struct {
		what string
		open func() (cpRunner, *kvslab.Pool, error)
	}{
		{"cp=2", func() (cpRunner, *kvslab.Pool, error) { return OpenGPUCP(dir, 4<<20, opts, 2) }},
		{"cp over ep=2", func() (cpRunner, *kvslab.Pool, error) {
			return OpenGPULayout(dir, 4<<20, opts, Layout{EP: 2, CP: true}, 0)
		}},
	} {
		r, pool, err := c.open()
		if err != nil {
			t.Fatal(err)
		}
		e := s.StartWith(t, r, pool, cfg)
		got := e.GenerateAll(t, prompts, sp)
		before, split := e.Counters().PrefixHits, r.SplitSteps()
		got = append(got, e.Generate(t, hit, sp))
		if e.Counters().PrefixHits <= before {
			t.Errorf("%s: the prompt sharing 18 tokens got no prefix hit", c.what)
		}
		if r.SplitSteps() <= split {
			t.Errorf("%s: the prompt after its prefix hit did not run split", c.what)
		}
		e.Stop(t)
		if err := r.Close(); err != nil {
			t.Fatal(err)
		}
		for i := range want {
			if fmt.Sprint(got[i].Tokens) != fmt.Sprint(want[i].Tokens) {
				t.Errorf("%s, prompt %d: tokens %v, one GPU %v", c.what, i, got[i].Tokens, want[i].Tokens)
			}
		}
	}
}
