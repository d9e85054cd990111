package gpurunner_test

import (
	"math"
	"path/filepath"
	"slices"
	"testing"

	"github.com/resin-llm/resin/core/cudart/emutest"
	"github.com/resin-llm/resin/core/dspark"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/gpurunner"
	"github.com/resin-llm/resin/core/runnertest"
	"github.com/resin-llm/resin/models/llama"
)

// The tiny Qwen3 target and DeepSpec drafters of models/llama's DSpark tests
// (scripts/dspark_goldens.py --e2e): vocabulary 16, hidden 16, 4 layers, taps −1, 1, 2.
var dsparkTestdata = filepath.Join("..", "..", "models", "llama", "testdata", "dspark")

// openEmulatedDSpark opens the GPU runner of the DSpark target on the emulated device
// with the drafter in dir (nil: without DSpark).
func openEmulatedDSpark(t *testing.T, drafter string, eager bool) (*gpurunner.Runner, *dspark.Speculator, *runnertest.Engine) {
	t.Helper()
	r, pool := openEmulatedGPU(t, filepath.Join(dsparkTestdata, "target"), 4<<20, eager)
	gr := r.(*gpurunner.Runner)
	var spec *dspark.Speculator
	if drafter != "" {
		d, err := dspark.Load(filepath.Join(dsparkTestdata, drafter), 64)
		if err != nil {
			t.Fatal(err)
		}
		if spec, err = gr.UseDSpark(d, 0, 0); err != nil {
			t.Fatal(err)
		}
		if _, err := gr.UseDSpark(d, 0, 0); err == nil {
			t.Fatal("a second UseDSpark was accepted")
		}
	}
	return gr, spec, (&runnertest.Suite{}).StartWith(t, gr, pool, engine.Config{})
}

// TestEmulatedDSparkTap: the device's feature tap hands over the target's hidden states at
// the drafter's layers (−1, 1, 2) for the rows asked, equal to models/llama's CPU
// ForwardTap within bf16 rounding (the device keeps the residual stream in bf16): within
// 3% of the row's largest magnitude (measured: at most 1.6%, logged).
func TestEmulatedDSparkTap(t *testing.T) {
	if emutest.Reexec(t) {
		return
	}
	r, pool := openEmulatedGPU(t, filepath.Join(dsparkTestdata, "target"), 4<<20, true)
	gr := r.(*gpurunner.Runner)
	d, err := dspark.Load(filepath.Join(dsparkTestdata, "vanilla"), 64)
	if err != nil {
		t.Fatal(err)
	}
	spec, err := gr.UseDSpark(d, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	cpu, err := llama.Load(filepath.Join(dsparkTestdata, "target"), llama.Options{MaxContext: 64})
	if err != nil {
		t.Fatal(err)
	}
	cspec, err := cpu.UseDSpark(d, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	cpool, err := cpu.NewPool(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	prompt := []int32{3, 1, 4, 1, 5, 9, 2}
	rows := []int32{0, 3, 6}
	taps := d.Config.TargetLayerIDs
	h := d.Config.Base.HiddenSize
	run := func(fwd dspark.TapForwarder, plan *engine.BatchPlan) []float32 {
		tap := dspark.NewFeatureTap(taps, rows, h)
		logits := make([]float32, len(plan.LogitsIndices)*16)
		if err := fwd.ForwardTap(plan, logits, tap); err != nil {
			t.Fatal(err)
		}
		return tap.Features
	}
	got := run(spec.Target, runnertest.Plan(t, pool, []*runnertest.Seq{runnertest.OpenSeq(t, pool, prompt)}, []int{len(prompt)}, true))
	want := run(cspec.Target, runnertest.Plan(t, cpool, []*runnertest.Seq{runnertest.OpenSeq(t, cpool, prompt)}, []int{len(prompt)}, true))
	w := len(taps) * h
	for i, row := range rows {
		for j, l := range taps {
			g, c := got[i*w+j*h:i*w+(j+1)*h], want[i*w+j*h:i*w+(j+1)*h]
			var big, worst float64
			for e := range c {
				big = math.Max(big, math.Abs(float64(c[e])))
				worst = math.Max(worst, math.Abs(float64(g[e]-c[e])))
			}
			if worst > 0.03*big || big == 0 {
				t.Errorf("row %d, layer %d: device %v, CPU %v (max |diff| %.3g, row max %.3g)", row, l, g, c, worst, big)
			}
			t.Logf("row %d, layer %d: max |diff| %.3g of row max %.3g", row, l, worst, big)
		}
	}
}

// TestEmulatedDSparkGreedy: greedy decoding through the engine on the emulated device with
// a DSpark drafter (target features from the device's tap, blocks drafted by core/dspark)
// equals greedy decoding on the device without it, prompts of mixed lengths batched, with
// CUDA graphs on; drafts are proposed and some accepted.
func TestEmulatedDSparkGreedy(t *testing.T) {
	if emutest.Reexec(t) {
		return
	}
	prompts := [][]int32{{1, 2, 3, 4}, {5, 6, 7, 8, 9, 10, 11}, {12, 3}}
	sp := engine.SamplingParams{MaxTokens: 20, IgnoreEOS: true}
	_, _, plain := openEmulatedDSpark(t, "", false)
	want := plain.GenerateAll(t, prompts, sp)
	plain.Stop(t)
	for _, drafter := range []string{"vanilla", "rnn"} {
		gr, spec, e := openEmulatedDSpark(t, drafter, false)
		if gr.Info().MaxDrafts != spec.Drafter.Config.BlockSize {
			t.Fatalf("%s: MaxDrafts %d, want the block size %d", drafter, gr.Info().MaxDrafts, spec.Drafter.Config.BlockSize)
		}
		got := e.GenerateAll(t, prompts, sp)
		for i := range prompts {
			if !slices.Equal(got[i].Tokens, want[i].Tokens) {
				t.Errorf("%s, prompt %d: %v with DSpark, %v without", drafter, i, got[i].Tokens, want[i].Tokens)
			}
		}
		c := e.Counters()
		t.Logf("%s: %d drafts proposed, %d accepted; steps %+v", drafter, c.DraftsProposed, c.DraftsAccepted, gr.Stats)
		if c.DraftsProposed == 0 || c.DraftsAccepted == 0 {
			t.Errorf("%s: %d drafts proposed, %d accepted: want drafting that is sometimes right", drafter, c.DraftsProposed, c.DraftsAccepted)
		}
		e.Stop(t)
	}
}
