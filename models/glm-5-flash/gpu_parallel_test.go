package glm5flash

import (
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/cpurunner"
	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/cudart/emutest"
	"github.com/resin-llm/resin/core/cudart/gputest"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/gpurunner"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/core/runnertest"
)

// gpuEPTol bounds |ep − one| / max|one| per logits row between GPUGroup and one GPURunner
// on the emulated device: fp32 both, the same kernels, but each rank's partial sum of its
// experts' weighted rows (rank 0's with the shared experts) added by the all-reduce
// instead of every expert in one MoECombine, so the sums round in another order.
const gpuEPTol = 1e-5

// epForward returns m's GPU runner over size emulated GPUs by expert parallelism
// (NewGPULayout; size 1: one GPURunner, the reference, ep nil) with decode graphs on: its
// forward (rank 0 broadcasting each plan to the others) and rank 0's pool.
func epForward(t *testing.T, m *TextModel, size int) (cpurunner.ForwardFunc, *kvslab.Pool, *GPUGroup) {
	return layoutForward(t, m, Layout{EP: size}, nil)
}

// layoutForward is epForward for any layout l the GPU runs, rank r on GPU ordinals[r]
// (nil: GPU r).
func layoutForward(t *testing.T, m *TextModel, l Layout, ordinals []int) (cpurunner.ForwardFunc, *kvslab.Pool, *GPUGroup) {
	size := l.Size()
	t.Helper()
	if ordinals == nil {
		for r := range size {
			ordinals = append(ordinals, r)
		}
	}
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
		d, err := cudart.OpenDevice(ordinals[r])
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		devs = append(devs, d)
	}
	if size == 1 {
		r, err := NewGPURunner(m, devs[0], cache, 4, 32, 4, 0, GPUOptions{})
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
	g, pool, err := NewGPULayout(m.Config, l, func(rank int) (*TextWeights, error) { return gpuRankWeights(m.Config, m.W, l, rank), nil },
		devs, cache, 4, 32, 4, 0, GPUOptions{}, 8<<20)
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

// ungroupedTiny is the tiny model with its routing ungrouped (n_group 1): a token's two
// experts may then sit on two ranks.
func ungroupedTiny(t *testing.T) *TextModel {
	t.Helper()
	js := strings.Replace(tinyTextConfigJSON, `"n_group": 2, "topk_group": 1`, `"n_group": 1, "topk_group": 1`, 1)
	c, err := ParseTextConfig([]byte(js))
	if err != nil {
		t.Fatal(err)
	}
	m, err := RandomTextModel(c, 7)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestEmulatedEPEqualsOne runs a tiny model (4 routed experts, top-2, on 3 sparse
// layers) on GPUGroup over 2 and 3 emulated GPUs and on one GPURunner, through decode (a
// prefill step of two prompts, 19 rows, then 6 decode steps of both, replayed as CUDA
// graphs with the all-reduces inside): EP=2 holds experts 2 + 2, EP=3 2 + 2 + 0 (uneven,
// rank 2 expert-less, still in every all-reduce). Greedy tokens equal, every logits row
// within gpuEPTol, and two EP=2 runs bit-identical, the second after a plan rank 0
// refused (a token outside the vocabulary) before any rank saw it. The model is ungroupedTiny, whose
// tokens split their experts over the ranks (the tiny config's grouped routing puts both
// on one rank, and its logits came out equal to one GPU's: x + 0 is x). New allocations read NaN
// (RESIN_EMU_POISON), so a rank that added stale rows of the other ranks' experts' blocks
// (zeroOthersExperts skipped) fails, as does one whose partial sums are not all-reduced.
func TestEmulatedEPEqualsOne(t *testing.T) {
	if emutest.Reexec(t, "RESIN_EMU_DEVICES=3", "RESIN_EMU_POISON=1") {
		return
	}
	const steps = 6
	m := ungroupedTiny(t)
	f1, p1, _ := epForward(t, m, 1)
	wantLogits, wantToks := decode(t, f1, p1, steps)
	var first [][]float32
	for _, c := range []struct {
		size    int
		experts string
	}{{2, "[[0 2] [2 4]]"}, {2, "[[0 2] [2 4]]"}, {3, "[[0 2] [2 4] [4 4]]"}} {
		f, p, g := epForward(t, m, c.size)
		if got := fmt.Sprint(g.Experts()); got != c.experts {
			t.Fatalf("ep=%d: the ranks hold experts %s, want %s", c.size, got, c.experts)
		}
		if first != nil {
			// A plan rank 0 refuses before broadcasting it leaves the group whole: the
			// run after it must still equal the first.
			bad := runnertest.Plan(t, p, []*runnertest.Seq{runnertest.OpenSeq(t, p, []int32{3, int32(m.Config.VocabSize)})}, []int{2}, false)
			if err := f(bad, make([]float32, m.Config.VocabSize)); err == nil || !strings.Contains(err.Error(), "outside the vocabulary") {
				t.Fatalf("ep=%d: a plan with token id %d: %v, want it refused", c.size, m.Config.VocabSize, err)
			}
		}
		logits, toks := decode(t, f, p, steps)
		if !slices.Equal(toks, wantToks) {
			t.Fatalf("ep=%d: greedy tokens %v, one GPU %v", c.size, toks, wantToks)
		}
		worst := 0.0
		for s := range logits {
			d := relDiff(logits[s], wantLogits[s])
			if worst = max(worst, d); !(d <= gpuEPTol) {
				t.Errorf("ep=%d, step %d: logits differ from one GPU's by %.3g of their largest (tolerance %g)", c.size, s, d, gpuEPTol)
			}
		}
		t.Logf("ep=%d: logits within %.3g of one GPU's (relative to each row's largest)", c.size, worst)
		if graph, _ := g.StepCounts(); graph == 0 {
			t.Errorf("ep=%d: no decode step replayed a graph", c.size)
		}
		if c.size == 2 {
			if first == nil {
				first = logits
			} else if !slices.EqualFunc(first, logits, slices.Equal[[]float32]) {
				t.Errorf("ep=2: two runs' logits differ")
			}
		}
	}
}

// relDiff is max|a−b| / max|b|.
func relDiff(a, b []float32) float64 {
	var d, m float64
	for i := range b {
		d = max(d, math.Abs(float64(a[i]-b[i])))
		m = max(m, math.Abs(float64(b[i])))
	}
	return d / m
}

// TestEmulatedEPAllToAllEqualsOne: expert parallelism on the GPU by the all-to-all
// dispatch (moeA2A: each rank sends its share of the step's rows to its experts' ranks,
// the shares' outputs all-gathered), EP=2 and EP=3 with an expert-less rank, the routing
// ungrouped so that a token's experts sit on two ranks, gives one GPU's greedy tokens and
// logits within gpuEPTol; graphs are refused for it by name.
func TestEmulatedEPAllToAllEqualsOne(t *testing.T) {
	if emutest.Reexec(t, "RESIN_EMU_DEVICES=3", "RESIN_EMU_POISON=1") {
		return
	}
	const steps = 6
	m := ungroupedTiny(t)
	f1, p1, _ := epForward(t, m, 1)
	wantLogits, wantToks := decode(t, f1, p1, steps)
	for _, size := range []int{2, 3} {
		f, p, g := layoutForward(t, m, Layout{EP: size, Dispatch: DispatchAllToAll}, nil)
		logits, toks := decode(t, f, p, steps)
		if !slices.Equal(toks, wantToks) {
			t.Fatalf("ep=%d all-to-all: greedy tokens %v, one GPU %v", size, toks, wantToks)
		}
		worst := 0.0
		for s := range logits {
			d := relDiff(logits[s], wantLogits[s])
			if worst = max(worst, d); !(d <= gpuEPTol) {
				t.Errorf("ep=%d all-to-all, step %d: logits differ from one GPU's by %.3g of their largest (tolerance %g)", size, s, d, gpuEPTol)
			}
		}
		t.Logf("ep=%d all-to-all: logits within %.3g of one GPU's", size, worst)
		if !slices.EqualFunc(logits, wantLogits, slices.Equal[[]float32]) { // each row's experts summed as one GPU sums them
			t.Errorf("ep=%d all-to-all: logits not bit for bit one GPU's", size)
		}
		if err := g.UseGraphs(true, nil); err == nil || !strings.Contains(err.Error(), "gather exchange only") {
			t.Errorf("ep=%d all-to-all: graphs: %v, want them refused", size, err)
		}
	}
	// TP × EP: the shared experts' columns split, each rank's share of the rows summed
	// with every rank's shared partials (within gpuEPTol: TP's sums round otherwise).
	f, p, _ := layoutForward(t, m, Layout{TP: 2, EP: 2, Dispatch: DispatchAllToAll}, nil)
	logits, toks := decode(t, f, p, steps)
	if !slices.Equal(toks, wantToks) {
		t.Fatalf("tp=2 ep=2 all-to-all: greedy tokens %v, one GPU %v", toks, wantToks)
	}
	closeLogits(t, "tp=2 ep=2 all-to-all", logits, wantLogits, m.Config.VocabSize, gpuEPTol)
}

// TestEmulatedOpenGPULayout opens a tiny checkpoint directory (random weights) through
// OpenGPULayout over 2 emulated GPUs, EP=2 without drafts and EP=2, TP=2 and TP=2 × EP=2
// with 2 MTP drafts a step (the MTP layer split like a layer, every rank drafting on each
// step's result), and checks that the engine's greedy tokens equal OpenGPU's on one, for
// two prompts in one batch and a third that resumes from the second's cached prefix.
func TestEmulatedOpenGPULayout(t *testing.T) {
	if emutest.Reexec(t, "RESIN_EMU_DEVICES=2") {
		return
	}
	dir := tinyDir(t)
	opts := gpurunner.Options{Limits: gpurunner.Limits{MaxTokens: 64, MaxSeqs: 4}, KernelCache: os.Getenv("RESIN_KERNEL_CACHE")}
	cfg := engine.Config{MaxBatchTokens: 64, MaxSeqs: 4}
	sp := engine.SamplingParams{MaxTokens: 5, IgnoreEOS: true}
	vocab := tinyTextModel(t).Config.VocabSize
	prompts := [][]int32{runnertest.Prompt(9, vocab, 5), runnertest.Prompt(20, vocab, 6)}
	// A prompt sharing 18 tokens of the second: a prefix hit through its pages on every
	// rank (each holds what it wrote there itself).
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
	for _, c := range []struct {
		l      Layout
		drafts int
	}{{Layout{EP: 2}, 0}, {Layout{EP: 2}, 2}, {Layout{TP: 2}, 2}, {Layout{TP: 2, EP: 2}, 2}} {
		drafts := c.drafts
		g, pool, err := OpenGPULayout(dir, 4<<20, opts, c.l, drafts)
		if err != nil {
			t.Fatal(err)
		}
		if d := g.Info().MaxDrafts; d != drafts {
			t.Errorf("tp=%d ep=%d: the runner proposes %d drafts, want %d", c.l.TP, c.l.EP, d, drafts)
		}
		e := s.StartWith(t, g, pool, cfg)
		got := e.GenerateAll(t, prompts, sp)
		before := e.Counters().PrefixHits
		got = append(got, e.Generate(t, hit, sp))
		if e.Counters().PrefixHits <= before {
			t.Errorf("tp=%d ep=%d with %d drafts: the prompt sharing 18 tokens got no prefix hit", c.l.TP, c.l.EP, drafts)
		}
		e.Stop(t)
		if err := g.Close(); err != nil {
			t.Fatal(err)
		}
		for i := range want {
			if fmt.Sprint(got[i].Tokens) != fmt.Sprint(want[i].Tokens) {
				t.Errorf("tp=%d ep=%d with %d drafts, prompt %d: tokens %v, one GPU %v", c.l.TP, c.l.EP, drafts, i, got[i].Tokens, want[i].Tokens)
			}
		}
	}
}

// TestEmulatedTPEqualsOne is TestEmulatedEPEqualsOne for tensor parallelism on the GPU
// (NewGPULayout): TP=2 splits the tiny model's MLA and KDA heads (one each a rank), the
// dense MLPs' and every expert's intermediate columns, each attention and MLP block ending
// in an all-reduce; TP=2 × EP=2 splits the attention and the dense and shared MLPs by TP
// and the routed experts whole by EP. The vocabulary (96 tokens) splits 64 + 32, padded to
// 64 + 64: the embedding's lookups all-reduced, the heads' shards all-gathered. Greedy tokens
// equal one GPU's and every logits row is within gpuEPTol of it.
func TestEmulatedTPEqualsOne(t *testing.T) {
	if emutest.Reexec(t, "RESIN_EMU_DEVICES=2", "RESIN_EMU_POISON=1") {
		return
	}
	layoutsEqualOne(t, []Layout{{TP: 2}, {TP: 2, EP: 2}}, nil, gpuEPTol)
}

// gpuNCCLTol is TestGPUNCCLLayoutEqualsOne's bound: fp32, but cuBLASLt may pick another
// algorithm, so another summation order, for a rank's narrower GEMMs.
const gpuNCCLTol = 1e-3

// TestGPUNCCLLayoutEqualsOne is TestEmulatedTPEqualsOne with EP=2, TP=2 and TP=2 × EP=2 on
// a real GPU (RESIN_GPU=1): on GPUs 0 and 1 where there are two, else both ranks on GPU 0,
// which needs NCCL >= 2.30 with NCCL_MULTI_RANK_GPU_ENABLE=1 (it skips otherwise, as
// core/gpurunner's TestGPUNCCLTPEqualsOne does); logits within gpuNCCLTol.
func TestGPUNCCLLayoutEqualsOne(t *testing.T) {
	if os.Getenv("RESIN_GPU") == "" {
		t.Skip("set RESIN_GPU=1 on a machine with a GPU and NCCL (the emulated device runs TestEmulatedTPEqualsOne and TestEmulatedEPEqualsOne)")
	}
	ordinals := gputest.TwoRankGPUs(t)
	layoutsEqualOne(t, []Layout{{EP: 2}, {TP: 2}, {TP: 2, EP: 2}}, ordinals, gpuNCCLTol)
}

// layoutsEqualOne runs ungroupedTiny through decode on each layout (ranks on ordinals,
// nil: GPU r) and on one GPU (ordinals[0], or 0): greedy tokens equal, every logits row
// within tol of one GPU's relative to its largest, and a decode step replayed a graph.
func layoutsEqualOne(t *testing.T, layouts []Layout, ordinals []int, tol float64) {
	const steps = 6
	m := ungroupedTiny(t)
	f1, p1, _ := layoutForward(t, m, Layout{}, ordinals[:min(1, len(ordinals))])
	wantLogits, wantToks := decode(t, f1, p1, steps)
	for _, l := range layouts {
		f, p, g := layoutForward(t, m, l, ordinals)
		logits, toks := decode(t, f, p, steps)
		if !slices.Equal(toks, wantToks) {
			t.Fatalf("tp=%d ep=%d: greedy tokens %v, one GPU %v", l.TP, l.EP, toks, wantToks)
		}
		worst := 0.0
		for s := range logits {
			d := relDiff(logits[s], wantLogits[s])
			if worst = max(worst, d); !(d <= tol) {
				t.Errorf("tp=%d ep=%d, step %d: logits differ from one GPU's by %.3g of their largest (tolerance %g)", l.TP, l.EP, s, d, tol)
			}
		}
		if graph, _ := g.StepCounts(); graph == 0 {
			t.Errorf("tp=%d ep=%d: no decode step replayed a graph", l.TP, l.EP)
		}
		t.Logf("tp=%d ep=%d: logits within %.3g of one GPU's (relative to each row's largest)", max(l.TP, 1), max(l.EP, 1), worst)
	}
}
