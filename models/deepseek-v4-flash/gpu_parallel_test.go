package deepseekv4flash

import (
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/cpurunner"
	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/cudart/emutest"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/gpurunner"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/core/runnertest"
)

// gpuEPTol bounds |ep − one| / max|one| per logits row between GPUGroup and one GPURunner
// on the emulated device: fp32 both, the same kernels, but each rank's partial sum of its
// experts' weighted rows (rank 0's with the shared expert) added by the all-reduce instead
// of every expert in one MoECombine, so the sums round in another order.
const gpuEPTol = 1e-5

// epForward returns the tiny model's GPU runner over size emulated GPUs by expert
// parallelism (NewGPULayout; size 1: one GPURunner, the reference, g nil) with decode
// graphs on: its forward (rank 0 broadcasting each plan to the others) and rank 0's pool.
func epForward(t *testing.T, m *Model, size int) (cpurunner.ForwardFunc, *kvslab.Pool, *GPUGroup) {
	t.Helper()
	if size == 1 {
		return layoutForward(t, m, Layout{})
	}
	return layoutForward(t, m, Layout{EP: size})
}

// layoutForward is epForward for any layout l the GPU runs (the zero layout: one
// GPURunner).
func layoutForward(t *testing.T, m *Model, l Layout) (cpurunner.ForwardFunc, *kvslab.Pool, *GPUGroup) {
	t.Helper()
	size := l.Size()
	cache, devs := openRankDevices(t, size)
	if size == 1 {
		r, err := NewGPURunner(m, devs[0], cache, cudart.F32, 4, 32, 4)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
		if err := r.UseGraphs(true, nil); err != nil {
			t.Fatal(err)
		}
		pool, err := r.NewPool(8 << 20)
		if err != nil {
			t.Fatal(err)
		}
		return r.forward, pool, nil
	}
	g, pool, err := NewGPULayout(m.Config, l, func(rank int) (*Weights, error) { return gpuRankWeights(m.Config, m.W, l, rank), nil },
		devs, cache, 4, 32, 4, m.maxContext, 0, 8<<20)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := g.Close(); err != nil {
			t.Error(err)
		}
	})
	if l.Dispatch != DispatchAllToAll { // its sends are planned on the host: eager
		if err := g.UseGraphs(true, nil); err != nil {
			t.Fatal(err)
		}
	}
	return g.group.Forward, pool, g
}

// openRankDevices opens the kernel cache (RESIN_KERNEL_CACHE, else a temporary one) and
// emulated GPUs 0..size-1, closed when the test ends.
func openRankDevices(t *testing.T, size int) (*cudart.KernelCache, []*cudart.Device) {
	t.Helper()
	dir := os.Getenv("RESIN_KERNEL_CACHE")
	if dir == "" {
		dir = t.TempDir()
	}
	cache, err := cudart.OpenKernelCache(dir)
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
	return cache, devs
}

// TestEmulatedEPEqualsOne runs the tiny model (4 routed experts, top-2; a hash-routed
// layer and three learned ones) on GPUGroup over 2 and 3 emulated GPUs and on one
// GPURunner, through decode (a prefill step of two prompts, 19 rows, then 4 decode steps
// of both, replayed as CUDA graphs with the all-reduces inside): EP=2 holds experts 2 + 2,
// EP=3 2 + 2 + 0 (uneven, rank 2 expert-less, still in every all-reduce). Greedy tokens
// equal, every logits row within gpuEPTol, and two EP=2 runs bit-identical, the second
// after a plan rank 0 refused (a token outside the vocabulary) before any rank saw it.
// New allocations read NaN (RESIN_EMU_POISON), so a rank that adds stale rows of the
// other ranks' experts' blocks (zeroOthers skipped) fails, as does one whose partial sums
// are not all-reduced.
func TestEmulatedEPEqualsOne(t *testing.T) {
	if emutest.Reexec(t, "RESIN_EMU_DEVICES=3", "RESIN_EMU_POISON=1") {
		return
	}
	const steps = 4
	c := tinyConfig(t)
	m, err := NewModel(c, RandomWeights(c, 7, false), 512)
	if err != nil {
		t.Fatal(err)
	}
	f1, p1, _ := epForward(t, m, 1)
	wantLogits, wantToks := decode(t, f1, p1, steps)
	var first [][]float32
	for _, tc := range []struct {
		size    int
		experts string
	}{{2, "[[0 2] [2 4]]"}, {2, "[[0 2] [2 4]]"}, {3, "[[0 2] [2 4] [4 4]]"}} {
		f, p, g := epForward(t, m, tc.size)
		if got := fmt.Sprint(g.Experts()); got != tc.experts {
			t.Fatalf("ep=%d: the ranks hold experts %s, want %s", tc.size, got, tc.experts)
		}
		if first != nil {
			// A plan rank 0 refuses before broadcasting it leaves the group whole: the
			// run after it must still equal the first.
			bad := runnertest.Plan(t, p, []*runnertest.Seq{runnertest.OpenSeq(t, p, []int32{3, int32(c.VocabSize)})}, []int{2}, false)
			if err := f(bad, make([]float32, c.VocabSize)); err == nil || !strings.Contains(err.Error(), "outside the vocabulary") {
				t.Fatalf("ep=%d: a plan with token id %d: %v, want it refused", tc.size, c.VocabSize, err)
			}
		}
		logits, toks := decode(t, f, p, steps)
		if !slices.Equal(toks, wantToks) {
			t.Fatalf("ep=%d: greedy tokens %v, one GPU %v", tc.size, toks, wantToks)
		}
		closeLogits(t, fmt.Sprintf("ep=%d", tc.size), logits, wantLogits, c.VocabSize, gpuEPTol)
		if graph, _ := g.StepCounts(); graph == 0 {
			t.Errorf("ep=%d: no decode step replayed a graph", tc.size)
		}
		if tc.size == 2 {
			if first == nil {
				first = logits
			} else if !slices.EqualFunc(first, logits, slices.Equal[[]float32]) {
				t.Errorf("ep=2: two runs' logits differ")
			}
		}
	}
}

// TestEmulatedEPAllToAllEqualsOne: expert parallelism on the GPU by the all-to-all
// dispatch (forwardA2A: each rank sends its share of the step's rows to its experts'
// ranks, the shares' outputs all-gathered), EP=2 and EP=3 with an expert-less rank, over
// a prompt of two sequences and decode steps of two rows (a share each, and an empty one
// under EP=3), gives one GPU's greedy tokens and logits within gpuEPTol; graphs are
// refused for it by name (its sends are planned on the host).
func TestEmulatedEPAllToAllEqualsOne(t *testing.T) {
	if emutest.Reexec(t, "RESIN_EMU_DEVICES=3", "RESIN_EMU_POISON=1") {
		return
	}
	const steps = 4
	c := tinyConfig(t)
	m, err := NewModel(c, RandomWeights(c, 7, false), 512)
	if err != nil {
		t.Fatal(err)
	}
	f1, p1, _ := epForward(t, m, 1)
	wantLogits, wantToks := decode(t, f1, p1, steps)
	for _, size := range []int{2, 3} {
		f, p, g := layoutForward(t, m, Layout{EP: size, Dispatch: DispatchAllToAll})
		logits, toks := decode(t, f, p, steps)
		if !slices.Equal(toks, wantToks) {
			t.Fatalf("ep=%d all-to-all: greedy tokens %v, one GPU %v", size, toks, wantToks)
		}
		closeLogits(t, fmt.Sprintf("ep=%d all-to-all", size), logits, wantLogits, c.VocabSize, gpuEPTol)
		if !slices.EqualFunc(logits, wantLogits, slices.Equal[[]float32]) { // each row's experts summed as one GPU sums them
			t.Errorf("ep=%d all-to-all: logits not bit for bit one GPU's", size)
		}
		if err := g.UseGraphs(true, nil); err == nil || !strings.Contains(err.Error(), "gather exchange only") {
			t.Errorf("ep=%d all-to-all: graphs: %v, want them refused", size, err)
		}
	}
	// TP × EP: the shared expert's columns split, each rank's share of the rows summed
	// with every rank's shared partials (within gpuEPTol: TP's sums round otherwise).
	f, p, _ := layoutForward(t, m, Layout{TP: 2, EP: 2, Dispatch: DispatchAllToAll})
	logits, toks := decode(t, f, p, steps)
	if !slices.Equal(toks, wantToks) {
		t.Fatalf("tp=2 ep=2 all-to-all: greedy tokens %v, one GPU %v", toks, wantToks)
	}
	closeLogits(t, "tp=2 ep=2 all-to-all", logits, wantLogits, c.VocabSize, gpuEPTol)
	// TP alone has no experts to send: refused by name.
	cache, devs := openRankDevices(t, 2)
	l := Layout{TP: 2, Dispatch: DispatchAllToAll}
	if _, _, err := NewGPULayout(m.Config, l, func(rank int) (*Weights, error) { return gpuRankWeights(m.Config, m.W, l, rank), nil },
		devs, cache, 4, 32, 4, m.maxContext, 0, 8<<20); err == nil || !strings.Contains(err.Error(), "runs under expert parallelism") {
		t.Errorf("tp=2 all-to-all: %v, want a refusal naming expert parallelism", err)
	}
}

// TestEmulatedOpenGPULayout opens a tiny config directory (seeded random weights)
// through OpenGPULayout, EP=2 with 2 MTP drafts a step (the MTP block's experts split like
// a layer's, every rank drafting on each step's result), TP=2 without and with 2 drafts (the
// MTP block's heads split like a layer's, its input tokens looked up in each rank's
// vocabulary shard on the device, the drafts' argmax on the logits put in order on the
// device) and TP=2 × EP=2 with drafts, and checks that the engine's greedy tokens equal
// OpenGPU's on one GPU, for two prompts in one batch and a third that resumes from the
// second's cached prefix (a prefix hit through each rank's own device pool); TP and EP of
// different sizes are refused by name.
func TestEmulatedOpenGPULayout(t *testing.T) {
	if emutest.Reexec(t, "RESIN_EMU_DEVICES=2") {
		return
	}
	dir := tinyDir(t)
	opts := gpurunner.Options{Limits: gpurunner.Limits{MaxTokens: 64, MaxSeqs: 4}, KernelCache: os.Getenv("RESIN_KERNEL_CACHE"), Eager: true}
	cfg := engine.Config{MaxBatchTokens: 64, MaxSeqs: 4}
	sp := engine.SamplingParams{MaxTokens: 4, IgnoreEOS: true}
	vocab := tinyConfig(t).VocabSize
	prompts := [][]int32{runnertest.Prompt(9, vocab, 5), runnertest.Prompt(20, vocab, 6)}
	hit := append(slices.Clone(prompts[1][:18]), 7, 8)
	var s runnertest.Suite
	one, pool, err := OpenGPU(dir, 4<<20, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer one.(*GPURunner).Close()
	e := s.StartWith(t, one, pool, cfg)
	want := append(e.GenerateAll(t, prompts, sp), e.Generate(t, hit, sp))
	e.Stop(t)
	// One GPU drafting 2 tokens a step: the drafts every layout's ranks must propose.
	spec, pool, err := OpenGPUSpeculative(dir, 4<<20, opts, 2)
	if err != nil {
		t.Fatal(err)
	}
	ref := &draftRecorder{Runner: spec, drafts: map[draftKey]int32{}}
	e = s.StartWith(t, ref, pool, cfg)
	e.GenerateAll(t, prompts, sp)
	e.Generate(t, hit, sp)
	e.Stop(t)
	spec.(*GPURunner).Close()
	wantDrafts := ref.drafts
	if distinct := slices.Compact(slices.Sorted(maps.Values(wantDrafts))); len(distinct) < 2 {
		t.Fatalf("one GPU's drafts %v: fewer than two distinct tokens, the comparison shows nothing", wantDrafts)
	}
	for _, c := range []struct {
		l      Layout
		drafts int
		graphs bool // decode steps and the drafting chain replayed as CUDA graphs
	}{{Layout{EP: 2}, 2, false}, {Layout{TP: 2}, 0, false}, {Layout{TP: 2}, 2, false}, {Layout{TP: 2, EP: 2}, 2, false}, {Layout{TP: 2}, 2, true}} {
		o := opts
		o.Eager = !c.graphs
		g, pool, err := OpenGPULayout(dir, 4<<20, o, c.l, c.drafts)
		if err != nil {
			t.Fatal(err)
		}
		if d := g.Info().MaxDrafts; d != c.drafts {
			t.Errorf("%+v: the runner proposes %d drafts, want %d", c.l, d, c.drafts)
		}
		rec := &draftRecorder{Runner: g, drafts: map[draftKey]int32{}}
		e := s.StartWith(t, rec, pool, cfg)
		got := e.GenerateAll(t, prompts, sp)
		before := e.Counters().PrefixHits
		got = append(got, e.Generate(t, hit, sp))
		if e.Counters().PrefixHits <= before {
			t.Errorf("%+v with %d drafts: the prompt sharing 18 tokens got no prefix hit", c.l, c.drafts)
		}
		e.Stop(t)
		chains := g.ranks[0].g.Stats.DraftGraph
		if err := g.Close(); err != nil {
			t.Fatal(err)
		}
		for i := range want {
			if fmt.Sprint(got[i].Tokens) != fmt.Sprint(want[i].Tokens) {
				t.Errorf("%+v with %d drafts, prompt %d: tokens %v, one GPU %v", c.l, c.drafts, i, got[i].Tokens, want[i].Tokens)
			}
		}
		if c.drafts > 0 && !maps.Equal(rec.drafts, wantDrafts) {
			t.Errorf("%+v (graphs %v): drafts %v, one GPU's %v", c.l, c.graphs, rec.drafts, wantDrafts)
		}
		if c.graphs && chains == 0 {
			t.Errorf("%+v with graphs: no drafting chain replayed a graph", c.l)
		}
	}
	for _, c := range []struct {
		l      Layout
		drafts int
		want   string
	}{{Layout{TP: 2, EP: 4}, 0, "must be equal"}} {
		if _, _, err := OpenGPULayout(dir, 4<<20, opts, c.l, c.drafts); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v with %d drafts on the GPU: %v, want a refusal naming %q", c.l, c.drafts, err, c.want)
		}
	}
}

// draftRecorder records the drafts a runner proposes, keyed as draftLog keys them (the
// prompt's length, the length drafted after, the index): the same for any schedule.
type draftRecorder struct {
	engine.Runner
	drafts map[draftKey]int32
}

func (d *draftRecorder) Execute(ctx context.Context, p *engine.BatchPlan) (engine.StepResult, error) {
	res, err := d.Runner.Execute(ctx, p)
	if err != nil || len(res.NumNextDrafts) == 0 {
		return res, err
	}
	at := 0
	for i := range p.ReqIDs {
		k := int(res.NumNextDrafts[i])
		var drafted, accepted int32
		if p.NumDrafts != nil {
			drafted = p.NumDrafts[i]
		}
		if res.Accepted != nil {
			accepted = res.Accepted[i]
		}
		end := int(p.Computed[i]+p.Scheduled[i]-drafted+accepted) - 1
		for j, t := range res.Drafts[at : at+k] {
			d.drafts[draftKey{int(p.PromptLen[i]), end, j}] = t
		}
		at += k
	}
	return res, nil
}

// TestEmulatedTPEqualsOne is TestEmulatedEPEqualsOne for tensor parallelism on the GPU:
// TP=2 splits the tiny model's 4 heads and 2 output groups (2 and 1 a rank), the shared
// and every routed expert's 16 intermediate columns, and the 96-token vocabulary (64 + 32
// real rows, padded to 64 + 64: the embedding's lookups all-reduced, lm_head's shards
// all-gathered and put in order on the host); each attention ends in an all-reduce after
// wo_b, each MoE in one of its partials. Greedy tokens equal one GPU's, every logits row
// within gpuEPTol of it, with decode graphs replayed. TP=2 × EP=2 splits the attention,
// the vocabulary and the shared expert by TP and the routed experts whole by EP (2 + 2).
// RESIN_EMU_POISON makes a missing all-reduce or zero row show.
func TestEmulatedTPEqualsOne(t *testing.T) {
	if emutest.Reexec(t, "RESIN_EMU_DEVICES=2", "RESIN_EMU_POISON=1") {
		return
	}
	const steps = 4
	c := tinyConfig(t)
	m, err := NewModel(c, RandomWeights(c, 7, false), 512)
	if err != nil {
		t.Fatal(err)
	}
	f1, p1, _ := layoutForward(t, m, Layout{})
	wantLogits, wantToks := decode(t, f1, p1, steps)
	for _, l := range []Layout{{TP: 2}, {TP: 2, EP: 2}} {
		what := fmt.Sprintf("tp=%d ep=%d", l.TP, max(l.EP, 1))
		f, p, g := layoutForward(t, m, l)
		logits, toks := decode(t, f, p, steps)
		if !slices.Equal(toks, wantToks) {
			t.Fatalf("%s: greedy tokens %v, one GPU %v", what, toks, wantToks)
		}
		closeLogits(t, what, logits, wantLogits, c.VocabSize, gpuEPTol)
		if graph, _ := g.StepCounts(); graph == 0 {
			t.Errorf("%s: no decode step replayed a graph", what)
		}
	}
}
