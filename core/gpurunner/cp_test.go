package gpurunner_test

import (
	"math"
	"os"
	"slices"
	"testing"

	"github.com/resin-llm/resin/core/cpurunner"
	"github.com/resin-llm/resin/core/cudart/emutest"
	"github.com/resin-llm/resin/core/cudart/gputest"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/gpurunner"
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
	t.Helper()
	m, err := llama.Load(dir, llama.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := m.Model.Config.DenseConfig(m.Model.MaxContext(), 16)
	if err != nil {
		t.Fatal(err)
	}
	g, pool, err := gpurunner.NewDenseCP(cfg, m.Model.W.DenseWeights(), ordinals, gpurunner.Options{CacheBytes: 4 << 20, KernelCache: os.Getenv("RESIN_KERNEL_CACHE")})
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
			if len(oneLogits) != len(splitLogits) {
				t.Fatalf("%d logits rows on one GPU, %d at CP=%d", len(oneLogits), len(splitLogits), len(c.ordinals))
			}
			worst := 0.0
			for i := range oneLogits {
				scale, diff := 0.0, 0.0
				for j, b := range oneLogits[i] {
					scale = max(scale, math.Abs(float64(b)))
					diff = max(diff, math.Abs(float64(splitLogits[i][j]-b)))
				}
				if !(diff <= tolerance*scale) {
					t.Fatalf("logits row %d: CP=%d differs from one GPU by %.3g of %.3g", i, len(c.ordinals), diff, scale)
				}
				worst = max(worst, diff/scale)
			}
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
