package gpurunner_test

import (
	"fmt"
	"math"
	"os"
	"slices"
	"testing"

	"github.com/resin-llm/resin/core/cpurunner"
	"github.com/resin-llm/resin/core/cudart/emutest"
	"github.com/resin-llm/resin/core/cudart/gputest"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/gpurunner"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/core/runnertest"
	"github.com/resin-llm/resin/models/llama"
)

// cpRun generates from prompt on the tiny llama with prefill context parallelism over
// ordinals (NewDenseCP; one entry: one GPU, NewDense's runner through the same group),
// the engine's plans at most budget tokens (0: the engine's default), and returns the
// tokens and, with capture, every step's logits rows (sampled on the host), else none
// (sampled on the device).
func cpRun(t *testing.T, dir string, ordinals []int, prompt []int32, steps, budget int, capture bool, sp engine.SamplingParams) ([]int32, [][]float32) {
	tokens, logits, _ := cpRunStats(t, dir, ordinals, prompt, steps, budget, capture, sp)
	return tokens, logits
}

// cpRunStats is cpRun, with every rank's StepStats.
func cpRunStats(t *testing.T, dir string, ordinals []int, prompt []int32, steps, budget int, capture bool, sp engine.SamplingParams) ([]int32, [][]float32, []gpurunner.StepStats) {
	return cpTPRunStats(t, dir, ordinals, 0, prompt, steps, budget, capture, sp)
}

// cpTPRunStats is cpRunStats over cp TP groups (NewDenseCPTP) when cp is above 0.
func cpTPRunStats(t *testing.T, dir string, ordinals []int, cp int, prompt []int32, steps, budget int, capture bool, sp engine.SamplingParams) ([]int32, [][]float32, []gpurunner.StepStats) {
	t.Helper()
	m, err := llama.Load(dir, llama.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := m.Model.Config.DenseConfig(m.Model.MaxContext(), 16)
	if err != nil {
		t.Fatal(err)
	}
	opts := gpurunner.Options{CacheBytes: 4 << 20, KernelCache: os.Getenv("RESIN_KERNEL_CACHE")}
	var g *gpurunner.TP
	var pool *kvslab.Pool
	if cp > 0 {
		g, pool, err = gpurunner.NewDenseCPTP(gpurunner.CutDense(cfg, m.Model.W.DenseWeights()), ordinals, cp, opts)
	} else {
		g, pool, err = gpurunner.NewDenseCP(cfg, m.Model.W.DenseWeights(), ordinals, opts)
	}
	if err != nil {
		t.Fatal(err)
	}
	var logits [][]float32
	if capture {
		g.CaptureLogits(func(row cpurunner.LogitsRow) { logits = append(logits, slices.Clone(row.Logits)) })
	}
	s := &runnertest.Suite{}
	e := s.StartWith(t, g, pool, engine.Config{MaxBatchTokens: budget})
	sp.MaxTokens, sp.IgnoreEOS = steps, true
	out := e.Generate(t, prompt, sp)
	e.Stop(t)
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	return out.Tokens, logits, g.RankStats()
}

// TestEmulatedCPEqualsOne runs the tiny llama's GPU runner with prefill context
// parallelism (NewDenseCP: each layer's q/k/v rows all-gathered over NCCL and written into
// every rank's cache, each rank's chunk of queries attending them, the normed rows
// gathered for the head) over 2 and 3 ranks on one emulated GPU and on one: a 9-token
// prompt in one plan (chunks 5+4 and 3+3+3), the same prompt in plans of at most 4 tokens
// (the later chunks continuing cached tokens: the page table's keys; over 3 ranks 2+2+0
// twice), and a 4-token prompt over 3 ranks (2+2+0: a rank
// without tokens joins the gathers) give one GPU's greedy
// tokens over 12 steps and every logits row within tpEmuTolerance, with the logits brought
// back and sampled on the host; seeded sampling on the device gives one GPU's tokens; two
// CP=2 runs are bit-identical; greedy on the device in plans of 4 over 3 ranks (chunks
// without logits rows, one rank without tokens: it skips the head as the others do) gives
// one GPU's tokens.
func TestEmulatedCPEqualsOne(t *testing.T) {
	if emutest.Reexec(t) {
		return
	}
	cpEqualsOne(t, 0, 0, tpEmuTolerance)
}

// TestGPUNCCLCPEqualsOne is TestEmulatedCPEqualsOne's two-rank cases on a real GPU: on
// GPUs 0 and 1 where there are two, else both ranks on GPU 0 (NCCL >= 2.30 with
// NCCL_MULTI_RANK_GPU_ENABLE=1, as scripts/gpu-check.sh sets; it skips without them),
// within tpGPUTolerance: cuBLASLt may order a chunk's sums otherwise than the whole
// prompt's.
func TestGPUNCCLCPEqualsOne(t *testing.T) {
	ords := gputest.TwoRankGPUs(t)
	cpEqualsOne(t, ords[0], ords[1], tpGPUTolerance)
}

// cpEqualsOne runs TestEmulatedCPEqualsOne's cases with rank 0 on GPU first and the
// others on GPU rest (the three-rank cases only where both are one GPU, the emulated
// device's), each logits row within tolerance of one GPU's.
func cpEqualsOne(t *testing.T, first, rest int, tolerance float64) {
	dir := tinyLlama(t)
	const steps = 12
	long, short := runnertest.Prompt(9, 261, 4), runnertest.Prompt(4, 261, 7)
	two, three := []int{first, rest}, []int{first, rest, rest}
	for _, c := range []struct {
		name     string
		prompt   []int32
		budget   int
		ordinals []int
		splits   int // the plans split over the group
	}{
		{"9 tokens over 2", long, 0, two, 1},
		{"9 tokens over 3", long, 0, three, 1},
		{"9 tokens in plans of 4 over 2", long, 4, two, 2},
		{"9 tokens in plans of 4 over 3", long, 4, three, 2},
		{"4 tokens over 3", short, 0, three, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			if len(c.ordinals) == 3 && tolerance != tpEmuTolerance {
				t.Skip("three ranks on one real GPU: the emulated device's case")
			}
			one, oneLogits := cpRun(t, dir, []int{first}, c.prompt, steps, c.budget, true, engine.SamplingParams{})
			split, splitLogits, stats := cpRunStats(t, dir, c.ordinals, c.prompt, steps, c.budget, true, engine.SamplingParams{})
			for r, st := range stats {
				if st.Split != c.splits {
					t.Fatalf("rank %d split %d plans, want %d (%+v)", r, st.Split, c.splits, st)
				}
			}
			if len(one) != steps || !slices.Equal(one, split) {
				t.Fatalf("greedy tokens: one GPU %v, CP=%d %v", one, len(c.ordinals), split)
			}
			worst := logitsWithin(t, fmt.Sprintf("CP=%d", len(c.ordinals)), oneLogits, splitLogits, tolerance)
			t.Logf("cp=%d vs one GPU: %d tokens equal, %d logits rows, max relative diff %.3g", len(c.ordinals), steps, len(oneLogits), worst)
		})
	}
	seeded := engine.SamplingParams{Temperature: 0.8, TopP: 0.9, Seed: 7, HasSeed: true}
	one, _ := cpRun(t, dir, []int{first}, long, steps, 0, false, seeded)
	split, _ := cpRun(t, dir, two, long, steps, 0, false, seeded)
	again, _ := cpRun(t, dir, two, long, steps, 0, false, seeded)
	if !slices.Equal(one, split) || !slices.Equal(split, again) {
		t.Fatalf("seeded on the device: one GPU %v, CP=2 %v and %v", one, split, again)
	}
	if tolerance != tpEmuTolerance {
		return
	}
	// Sampled on the device, a prompt's chunks before its last have no logits rows: the
	// rank without tokens (2+2+0) must skip the head as the others do, not fail on it.
	one, _ = cpRun(t, dir, []int{first}, long, steps, 4, false, engine.SamplingParams{})
	split, _ = cpRun(t, dir, three, long, steps, 4, false, engine.SamplingParams{})
	if len(one) != steps || !slices.Equal(one, split) {
		t.Fatalf("plans of 4 over 3, sampled on the device: one GPU %v, CP=3 %v", one, split)
	}
}

// TestEmulatedCPTPEqualsOne runs the tiny llama's GPU runner with prefill CP over TP
// groups (NewDenseCPTP: each TP group runs its chunk of a split plan, the q/k/v rows of
// each rank's heads all-gathered over the ranks of the other groups that hold the same
// heads) on one emulated GPU: a 9-token prompt over CP=2 × TP=2 in one plan and in plans
// of at most 4 tokens, and a 4-token prompt over CP=3 × TP=2 (chunks 2+2+0: a TP group
// without tokens joins the gathers) give one GPU's greedy tokens over 12 steps with every
// logits row within tpEmuTolerance, every rank splitting the prompt's plans; seeded
// sampling on the device gives one GPU's tokens, and two CP × TP runs are bit-identical.
func TestEmulatedCPTPEqualsOne(t *testing.T) {
	if emutest.Reexec(t) {
		return
	}
	cpTPEqualsOne(t, 0, 0, tpEmuTolerance)
}

// TestGPUNCCLCPTPEqualsOne is TestEmulatedCPTPEqualsOne's CP=2 × TP=2 cases on a real GPU,
// each TP group over GPUs 0 and 1 where there are two, else every rank on GPU 0 (four
// ranks share the GPUs either way: NCCL ≥ 2.30 with NCCL_MULTI_RANK_GPU_ENABLE=1, as
// scripts/gpu-check.sh sets; it skips without them), within tpGPUTolerance.
func TestGPUNCCLCPTPEqualsOne(t *testing.T) {
	ords := gputest.TwoRankGPUs(t)
	if os.Getenv("NCCL_MULTI_RANK_GPU_ENABLE") != "1" {
		t.Skip("four ranks on two GPUs need NCCL_MULTI_RANK_GPU_ENABLE=1")
	}
	cpTPEqualsOne(t, ords[0], ords[1], tpGPUTolerance)
}

// cpTPEqualsOne runs TestEmulatedCPTPEqualsOne's cases, each TP group's ranks on GPUs
// first and rest in turn (the CP=3 case only where both are one GPU, the emulated
// device's), each logits row within tolerance of one GPU's (on GPU first).
func cpTPEqualsOne(t *testing.T, first, rest int, tolerance float64) {
	dir := tinyLlama(t)
	ordinals := func(n int) []int {
		out := make([]int, n)
		for w := range out {
			if w%2 == 1 {
				out[w] = rest
			} else {
				out[w] = first
			}
		}
		return out
	}
	const steps = 12
	long, short := runnertest.Prompt(9, 261, 4), runnertest.Prompt(4, 261, 7)
	for _, c := range []struct {
		name       string
		prompt     []int32
		budget     int
		cp, splits int
		ranks      int
	}{
		{"9 tokens over 2x2", long, 0, 2, 1, 4},
		{"9 tokens in plans of 4 over 2x2", long, 4, 2, 2, 4},
		{"4 tokens over 3x2", short, 0, 3, 1, 6},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.cp == 3 && tolerance != tpEmuTolerance {
				t.Skip("six ranks on real GPUs: the emulated device's case")
			}
			one, oneLogits := cpRun(t, dir, []int{first}, c.prompt, steps, c.budget, true, engine.SamplingParams{})
			split, splitLogits, stats := cpTPRunStats(t, dir, ordinals(c.ranks), c.cp, c.prompt, steps, c.budget, true, engine.SamplingParams{})
			for r, st := range stats {
				if st.Split != c.splits {
					t.Fatalf("rank %d split %d plans, want %d (%+v)", r, st.Split, c.splits, st)
				}
			}
			if len(one) != steps || !slices.Equal(one, split) {
				t.Fatalf("greedy tokens: one GPU %v, CP x TP %v", one, split)
			}
			worst := logitsWithin(t, "CP x TP", oneLogits, splitLogits, tolerance)
			t.Logf("cp=%d x tp=%d vs one GPU: %d tokens equal, %d logits rows, max relative diff %.3g", c.cp, c.ranks/c.cp, steps, len(oneLogits), worst)
		})
	}
	seeded := engine.SamplingParams{Temperature: 0.8, TopP: 0.9, Seed: 7, HasSeed: true}
	one, _ := cpRun(t, dir, []int{first}, long, steps, 0, false, seeded)
	split, _, _ := cpTPRunStats(t, dir, ordinals(4), 2, long, steps, 0, false, seeded)
	again, _, _ := cpTPRunStats(t, dir, ordinals(4), 2, long, steps, 0, false, seeded)
	if !slices.Equal(one, split) || !slices.Equal(split, again) {
		t.Fatalf("seeded on the device: one GPU %v, CP=2 x TP=2 %v and %v", one, split, again)
	}
}

// logitsWithin fails t unless got has want's rows, each within tolerance of the row's
// largest |logit| (what names got's layout); it returns the largest relative difference.
func logitsWithin(t *testing.T, what string, want, got [][]float32, tolerance float64) float64 {
	t.Helper()
	if len(want) != len(got) {
		t.Fatalf("%d logits rows on one GPU, %d under %s", len(want), len(got), what)
	}
	worst := 0.0
	for i := range want {
		scale, diff := 0.0, 0.0
		for j, b := range want[i] {
			scale = max(scale, math.Abs(float64(b)))
			diff = max(diff, math.Abs(float64(got[i][j]-b)))
		}
		if !(diff <= tolerance*scale) {
			t.Fatalf("logits row %d: %s differs from one GPU by %.3g of %.3g", i, what, diff, scale)
		}
		worst = max(worst, diff/scale)
	}
	return worst
}
