package glm5flash

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/cudart/emutest"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/runnertest"
)

// TestBlockEnds checks the block ends of a chunk fall where gpuKDA.forward cuts its
// segments: aligned and unaligned starts, a chunk inside one block, none at all.
func TestBlockEnds(t *testing.T) {
	for _, c := range []struct {
		pos0, T, block int
		want           []int
	}{
		{0, 16, 16, []int{16}}, {0, 32, 16, []int{16, 32}}, {5, 16, 16, []int{11}}, {5, 32, 16, []int{11, 27}},
		{1, 14, 16, nil}, {15, 1, 16, []int{1}}, {48, 64, 16, []int{16, 32, 48, 64}},
	} {
		if got := blockEnds(c.pos0, c.T, c.block); !slices.Equal(got, c.want) {
			t.Errorf("blockEnds(%d, %d, %d) = %v, want %v", c.pos0, c.T, c.block, got, c.want)
		}
	}
}

// TestEmulatedGPUPrefillGraphsEqualEager runs the same requests through the engine on two
// GPURunners of the tiny model on the emulated device, one eager and one with graphs on,
// with chunked prefill of 16 tokens a step (the prefill bucket 16, one sequence a step):
// prompts of 48 tokens (three chunks, each ending a KDA block whose checkpoint the graph
// writes) and 37 (two chunks and an eager tail), fp32 and bf16 weights, and prompts that
// resume from the prefix cache through the checkpoints the graphs wrote (sharing 40
// tokens: a graph chunk at 32; the same prompt again). Every output equals the eager
// runner's bit for bit (tokens, log probabilities, top log probabilities), the prefix hits
// are the same, and prefill steps replayed graphs.
func TestEmulatedGPUPrefillGraphsEqualEager(t *testing.T) {
	if emutest.Reexec(t) {
		return
	}
	kit := openGPUTest(t)
	vocab := tinyTextModel(t).Config.VocabSize
	greedy := engine.SamplingParams{MaxTokens: 3, IgnoreEOS: true, Logprobs: true, TopLogprobs: 3}
	for _, opts := range []GPUOptions{{}, {KDAWeights: cudart.BF16, Weights: cudart.BF16}} {
		var log strings.Builder
		eager, graphs := kit.runner(t, 4, 64, 4, opts), kit.runner(t, 4, 64, 4, opts)
		if err := graphs.UseGraphs(true, &log); err != nil {
			t.Fatal(err)
		}
		var s runnertest.Suite
		cfg := engine.Config{MaxBatchTokens: 16, MaxSeqs: 4}
		start := func(r *GPURunner) *runnertest.Engine {
			pool, err := r.NewPool(4 << 20)
			if err != nil {
				t.Fatal(err)
			}
			return s.StartWith(t, r, pool, cfg)
		}
		ee, ge := start(eager), start(graphs)
		what := fmt.Sprintf("weights %v/%v", opts.KDAWeights, opts.Weights)
		same := func(name string, g, e runnertest.Output) {
			t.Helper()
			if len(e.Tokens) == 0 || fmt.Sprint(g) != fmt.Sprint(e) {
				t.Fatalf("%s, %s: graphs %v, eager %v", what, name, g, e)
			}
		}
		long := runnertest.Prompt(48, vocab, 1)
		same("a prompt of 48 tokens", ge.Generate(t, long, greedy), ee.Generate(t, long, greedy))
		p37 := runnertest.Prompt(37, vocab, 2)
		same("a prompt of 37 tokens", ge.Generate(t, p37, greedy), ee.Generate(t, p37, greedy))
		for _, hit := range []struct {
			name string
			p    []int32
		}{{"sharing 40 tokens", append(append([]int32(nil), long[:40]...), runnertest.Prompt(9, vocab, 3)...)}, {"the same prompt", long}} {
			eb, gb := ee.Counters().PrefixHits, ge.Counters().PrefixHits
			same("a prompt "+hit.name, ge.Generate(t, hit.p, greedy), ee.Generate(t, hit.p, greedy))
			if de, dg := ee.Counters().PrefixHits-eb, ge.Counters().PrefixHits-gb; de != dg || de == 0 {
				t.Errorf("%s, a prompt %s: %d prefix hits with graphs, %d eager", what, hit.name, dg, de)
			}
		}
		replayed, captured := graphs.PrefillStepCounts()
		if replayed == 0 || captured == 0 {
			t.Errorf("%s: %d prefill steps replayed a graph, %d ran a bucket eagerly", what, replayed, captured)
		}
		if g, e := eager.PrefillStepCounts(); g+e != 0 {
			t.Errorf("%s: the eager runner counted %d prefill graph steps", what, g+e)
		}
		if log.Len() > 0 {
			t.Errorf("%s: captures failed: %s", what, log.String())
		}
		t.Logf("%s: %d prefill steps replayed a graph, %d captured", what, replayed, captured)
		ee.Stop(t)
		ge.Stop(t)
	}
}
