package glm5flash

import (
	"fmt"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/cudart/emutest"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/runnertest"
)

// TestEmulatedGPUGraphsEqualEager runs the same requests through the engine on two
// GPURunners of the tiny model on the emulated device, one eager and one replaying decode
// graphs (buckets 1, 2 and 4 of 4 slots): one request alone (bucket 1, decoding across a
// KDA block end, whose checkpoint a graph step writes), three decoding together (bucket 4
// with a padding row), and prompts that resume from the prefix cache: one sharing a long
// prompt's first 40 tokens (a hit between checkpoints) and one extending the first
// request's prompt and output (a hit through the checkpoint the graph step wrote, where
// the engine caches it). Every output equals the eager runner's bit for bit (tokens, log
// probabilities and top log probabilities), the prefix hits are the same, and steps
// replayed graphs; then, in new pools, one request again (the graphs captured anew).
func TestEmulatedGPUGraphsEqualEager(t *testing.T) {
	if emutest.Reexec(t) {
		return
	}
	kit := openGPUTest(t)
	vocab := tinyTextModel(t).Config.VocabSize
	var log strings.Builder
	eager, graphs := kit.runner(t, 4, 64, 4, GPUOptions{}), kit.runner(t, 4, 64, 4, GPUOptions{})
	if err := graphs.UseGraphs(true, &log); err != nil {
		t.Fatal(err)
	}
	var s runnertest.Suite
	cfg := engine.Config{MaxBatchTokens: 64, MaxSeqs: 4}
	start := func(r *GPURunner) *runnertest.Engine {
		pool, err := r.NewPool(4 << 20)
		if err != nil {
			t.Fatal(err)
		}
		return s.StartWith(t, r, pool, cfg)
	}
	ee, ge := start(eager), start(graphs)
	greedy := engine.SamplingParams{MaxTokens: 6, IgnoreEOS: true, Logprobs: true, TopLogprobs: 3}
	same := func(what string, g, e runnertest.Output) {
		t.Helper()
		if len(e.Tokens) == 0 || fmt.Sprint(g) != fmt.Sprint(e) {
			t.Fatalf("%s: graphs %v, eager %v", what, g, e)
		}
	}
	cat := func(a []int32, b ...int32) []int32 { return append(append([]int32(nil), a...), b...) }
	first := runnertest.Prompt(13, vocab, 1) // decodes positions 13..18: the block end 15
	out := ee.Generate(t, first, greedy)
	same("one request", ge.Generate(t, first, greedy), out)
	batch := [][]int32{runnertest.Prompt(3, vocab, 2), runnertest.Prompt(19, vocab, 3), runnertest.Prompt(9, vocab, 4)}
	eAll, gAll := ee.GenerateAll(t, batch, greedy), ge.GenerateAll(t, batch, greedy)
	for i := range batch {
		same(fmt.Sprintf("request %d of a batch of 3", i), gAll[i], eAll[i])
	}
	long := runnertest.Prompt(50, vocab, 5)
	same("a long prompt", ge.Generate(t, long, greedy), ee.Generate(t, long, greedy))
	for _, hit := range []struct {
		name string
		p    []int32
	}{
		{"sharing 40 tokens of a prompt", cat(long[:40], 1, 2)},
		{"extending a request's prompt and output", cat(cat(first, out.Tokens[:5]...), 3)},
	} {
		eb, gb := ee.Counters().PrefixHits, ge.Counters().PrefixHits
		same("a prompt "+hit.name, ge.Generate(t, hit.p, greedy), ee.Generate(t, hit.p, greedy))
		if de, dg := ee.Counters().PrefixHits-eb, ge.Counters().PrefixHits-gb; de != dg {
			t.Errorf("a prompt %s: %d prefix hits with graphs, %d eager", hit.name, dg, de)
		}
	}
	if ee.Counters().PrefixHits == 0 {
		t.Error("no prefix hit")
	}
	replayed, captured := graphs.StepCounts()
	if replayed == 0 || captured == 0 {
		t.Errorf("%d steps replayed a graph, %d ran a bucket eagerly", replayed, captured)
	}
	if g, e := eager.StepCounts(); g+e != 0 {
		t.Errorf("the eager runner counted %d graph steps", g+e)
	}
	if log.Len() > 0 {
		t.Errorf("captures failed: %s", log.String())
	}
	t.Logf("%d decode steps replayed a graph, %d captured", replayed, captured)
	// A new pool (another arena): the graphs, which hold the old one's state pointers,
	// are captured again.
	ee.Stop(t)
	ge.Stop(t)
	ee, ge = start(eager), start(graphs)
	defer ee.Stop(t)
	defer ge.Stop(t)
	same("one request in a new pool", ge.Generate(t, first, greedy), ee.Generate(t, first, greedy))
	if _, again := graphs.StepCounts(); again == captured {
		t.Error("a new pool reused the graphs of the old one")
	}
}

// TestEmulatedGPUGraphsEqualEagerBF16 is TestEmulatedGPUGraphsEqualEager's batch with
// bf16 weights (GPUOptions.KDAWeights and Weights: the bf16 casts and core/gpurunner's
// Linears inside the graph): three requests decoding in bucket 4, graph replay equal to
// the eager runner bit for bit.
func TestEmulatedGPUGraphsEqualEagerBF16(t *testing.T) {
	if emutest.Reexec(t) {
		return
	}
	kit := openGPUTest(t)
	vocab := tinyTextModel(t).Config.VocabSize
	opts := GPUOptions{KDAWeights: cudart.BF16, Weights: cudart.BF16}
	eager, graphs := kit.runner(t, 4, 64, 4, opts), kit.runner(t, 4, 64, 4, opts)
	if err := graphs.UseGraphs(true, nil); err != nil {
		t.Fatal(err)
	}
	var s runnertest.Suite
	cfg := engine.Config{MaxBatchTokens: 64, MaxSeqs: 4}
	var es []*runnertest.Engine
	for _, r := range []*GPURunner{eager, graphs} {
		pool, err := r.NewPool(4 << 20)
		if err != nil {
			t.Fatal(err)
		}
		e := s.StartWith(t, r, pool, cfg)
		defer e.Stop(t)
		es = append(es, e)
	}
	greedy := engine.SamplingParams{MaxTokens: 5, IgnoreEOS: true, Logprobs: true, TopLogprobs: 3}
	batch := [][]int32{runnertest.Prompt(3, vocab, 2), runnertest.Prompt(19, vocab, 3), runnertest.Prompt(9, vocab, 4)}
	eAll, gAll := es[0].GenerateAll(t, batch, greedy), es[1].GenerateAll(t, batch, greedy)
	for i := range batch {
		if fmt.Sprint(gAll[i]) != fmt.Sprint(eAll[i]) {
			t.Fatalf("request %d: graphs %v, eager %v", i, gAll[i], eAll[i])
		}
	}
	if replayed, _ := graphs.StepCounts(); replayed == 0 {
		t.Error("no step replayed a graph")
	}
}
