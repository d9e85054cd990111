package glm5flash

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/cudart/emutest"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/gpurunner"
	"github.com/resin-llm/resin/core/kernels/ref"
	"github.com/resin-llm/resin/core/kvslab"
)

// gpuMTPBF16Tol bounds |gpu − cpu| / (1 + |cpu|) for the MTP layer's output rows and draft
// logits with its eh_proj, MoE (shared and routed experts) and head in bf16 on the device
// (GPUOptions.Weights bf16: weights and activation operands rounded to bf16, 2^-9 relative
// each, fp32 accumulation) against the CPU MTP layer in fp32 on the same rows. The rows
// stay below index_topk·index_kpool tokens, so every pool is picked and no indexer top-k
// can flip; the fp32 router on perturbed inputs can still flip an expert choice. Not
// derived: the measured worst (logged, 0.018 output rows / 0.014 draft logits) with room; a wrong
// weight, layout or half of eh_proj is off by O(1).
const gpuMTPBF16Tol = 5e-2

// gpuMTPFP8Tol is gpuMTPBF16Tol for the FP8 fixture's MTP layer with its FP8 linears as
// stored (MLA q_a/q_b/kv_a/o, the indexer's wq_b/wk, the shared down and the routed expert
// banks; e4m3 activations, 2^-4 relative each) against the CPU layer on the dequantised
// weights. Measured worst 0.12 output rows / 0.11 draft logits (logged).
const gpuMTPFP8Tol = 0.25

// TestEmulatedGPUMTPDTypes: the MTP layer follows the run's dtype on the emulated device.
// Layer by layer (mtpLayerDiff: three sequences of 5, 9 and 13 rows of N(0, 1) hidden
// states and random next tokens, every row's output and each sequence's draft logits
// against TextModel.MTPForward): fp32 within gpuLogprobTol; bf16 weights within
// gpuMTPBF16Tol and not the fp32 outputs, its eh_proj, head and experts bf16 linears; the
// FP8 fixture (OpenGPU's options with drafts) within gpuMTPFP8Tol, its MLA projections,
// routed expert banks and shared down FP8 as stored (eh_proj fp32, as the fixture stores
// it). Through the engine: greedy decoding with 2 MTP drafts equals decoding without them
// (tokens; log probabilities within gpuLogprobTol) with bf16 weights, and through
// OpenGPUSpeculative against OpenGPU on the FP8 fixture (decode graphs on in both), with
// drafts accepted and rejected (greedyEqual).
func TestEmulatedGPUMTPDTypes(t *testing.T) {
	if emutest.Reexec(t) {
		return
	}
	kit := openGPUTest(t)
	m := tinyTextModel(t)
	bf16 := GPUOptions{KDAWeights: cudart.BF16, Weights: cudart.BF16}
	var f32Out []float32
	for _, c := range []struct {
		name string
		opts GPUOptions
		tol  float64
	}{{"fp32", GPUOptions{}, gpuLogprobTol}, {"bf16", bf16, gpuMTPBF16Tol}} {
		opts := c.opts
		opts.Drafts = 1
		gr := kit.runner(t, 3, 32, 32, opts)
		if p := gr.g.mtp; c.name == "bf16" && (p.ehL == nil || p.headL == nil || len(p.moe.gateUpL) == 0 || p.moe.shared.downL == nil) {
			t.Fatalf("bf16: the MTP layer's eh_proj %v, head %v, experts %d, shared down %v: want bf16 linears", p.ehL, p.headL, len(p.moe.gateUpL), p.moe.shared.downL)
		}
		out := mtpLayerDiff(t, c.name, gr, m, c.tol)
		if c.name == "fp32" {
			f32Out = out
		} else if slices.Equal(out, f32Out) {
			t.Errorf("%s: the MTP layer gave the fp32 outputs", c.name)
		}
	}

	dir, _ := fp8Checkpoint(t)
	cpu, err := LoadText(dir, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	gr, err := NewGPURunner(cpu.Model, kit.dev, kit.cache, 3, 32, 32, 0, GPUOptions{Drafts: 1, Checkpoint: dir,
		KDAWeights: shippedKDAType(dir, cpu.Model.Config)})
	if err != nil {
		t.Fatal(err)
	}
	defer gr.Close()
	p := gr.g.mtp
	if p.moe.gateUpBank == nil || p.moe.downBank == nil || p.moe.shared.downL == nil || gr.g.dsa.fp8[p.mla.qb] == nil || p.ehL != nil {
		t.Fatalf("fp8: the MTP layer's expert banks %v %v, shared down %v, q_b %v, eh_proj %v: want the banks, shared down and q_b FP8, eh_proj fp32 as stored",
			p.moe.gateUpBank, p.moe.downBank, p.moe.shared.downL, gr.g.dsa.fp8[p.mla.qb], p.ehL)
	}
	t.Log(gr.Describe())
	mtpLayerDiff(t, "fp8", gr, cpu.Model, gpuMTPFP8Tol)

	// Through the engine: MTP greedy = plain greedy in the run's dtype.
	sp := engine.SamplingParams{MaxTokens: 10, IgnoreEOS: true, Logprobs: true, TopLogprobs: 3}
	prompts := specPrompts(m.Config.VocabSize)[:4]
	mtp := bf16
	mtp.Drafts = 2
	plainR, mtpR := kit.runner(t, 4, 64, 64, bf16), kit.runner(t, 4, 64, 64, mtp)
	greedyEqual(t, "bf16", plainR, mtpR, prompts, sp)

	lim := gpurunner.Options{Limits: gpurunner.Limits{MaxTokens: 64, MaxSeqs: 4, MaxRows: 64}, KernelCache: os.Getenv("RESIN_KERNEL_CACHE")}
	var log strings.Builder
	lim.Log = &log
	pr, _, err := OpenGPU(dir, 4<<20, lim)
	if err != nil {
		t.Fatal(err)
	}
	defer pr.(*GPURunner).Close()
	sr, _, err := OpenGPUSpeculative(dir, 4<<20, lim, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer sr.(*GPURunner).Close()
	t.Log(strings.TrimSpace(log.String()))
	greedyEqual(t, "fp8", pr.(*GPURunner), sr.(*GPURunner), specPrompts(cpu.Model.Config.VocabSize)[:4], sp)
}

// greedyEqual runs the prompts through the engine on plain and on mtp (drafting, its drafts
// forced to plain's tokens but at every third position, as TestEmulatedGPUMTPMatchesCPU
// forces them: the tiny random models' own drafts are never accepted) and checks the
// outputs agree (sameOutput) and drafts were both accepted and rejected.
func greedyEqual(t *testing.T, what string, plain, mtp *GPURunner, prompts [][]int32, sp engine.SamplingParams) {
	t.Helper()
	pools := [2]*kvslab.Pool{}
	for i, r := range []*GPURunner{plain, mtp} {
		var err error
		if pools[i], err = r.NewPool(4 << 20); err != nil {
			t.Fatal(err)
		}
	}
	want, _ := generateAll(t, plain, pools[0], prompts, sp, 13)
	full := map[int][]int32{}
	for i, p := range prompts {
		full[len(p)] = append(slices.Clone(p), want[i].Tokens...)
	}
	V := int32(plain.Model.Config.VocabSize)
	mtp.forceDraft = func(promptLen, pos, _ int, logits []float32) int32 {
		seq := full[promptLen]
		if pos >= len(seq) || pos%3 == 0 {
			return (int32(ref.Argmax(logits)) + 1) % V
		}
		return seq[pos]
	}
	got, c := generateAll(t, mtp, pools[1], prompts, sp, 13)
	for i := range want {
		sameOutput(t, fmt.Sprintf("%s with MTP drafts, request %d", what, i), got[i], want[i])
	}
	t.Logf("%s: %d drafts proposed, %d accepted; greedy equals plain", what, c.DraftsProposed, c.DraftsAccepted)
	if c.DraftsAccepted == 0 || c.DraftsAccepted == c.DraftsProposed {
		t.Errorf("%s: %d drafts proposed, %d accepted", what, c.DraftsProposed, c.DraftsAccepted)
	}
}

// mtpLayerDiff runs gr's MTP layer on the device over three sequences (slots 0-2) of 5, 9
// and 13 rows from position 0 (N(0, 1) hidden states, random next tokens) and m's
// MTPForward on the same rows, checks every row's output and each sequence's draft logits
// within tol·(1+|cpu|) (diffRows) and returns the device's outputs.
func mtpLayerDiff(t *testing.T, what string, gr *GPURunner, m *TextModel, tol float64) []float32 {
	t.Helper()
	c := m.Config
	D, V := c.HiddenSize, c.VocabSize
	rng := rand.New(rand.NewPCG(21, 22))
	lens := []int{5, 9, 13}
	var chunks []MTPChunk
	T := 0
	for _, n := range lens {
		ch := MTPChunk{State: m.NewMTPState(), Hidden: make([]float32, n*D), Next: make([]int32, n), Rows: []int{n - 1}}
		for i := range ch.Hidden {
			ch.Hidden[i] = float32(rng.NormFloat64())
		}
		for i := range ch.Next {
			ch.Next[i] = int32(rng.IntN(V))
		}
		chunks = append(chunks, ch)
		T += n
	}
	wantLogits, wantOut, err := m.MTPForward(chunks)
	if err != nil {
		t.Fatal(err)
	}
	var gotLogits []float32
	gotOut := make([]float32, T*D)
	g := gr.g
	err = gr.dev.Do(func(cx *cudart.Ctx) error {
		hb, err := cx.Alloc(int64(4 * T * D))
		if err != nil {
			return err
		}
		defer cx.Free(hb)
		var dc []mtpChunk
		r0 := 0
		for i, ch := range chunks {
			if err := cudart.Upload(cx, off(hb.Ptr, r0*D), ch.Hidden); err != nil {
				return err
			}
			d := mtpChunk{s: &gpuSeq{slot: i}, Next: ch.Next, Draft: true}
			for j := range ch.Next {
				d.Hidden = append(d.Hidden, off(hb.Ptr, (r0+j)*D))
			}
			dc = append(dc, d)
			r0 += len(ch.Next)
		}
		if gotLogits, err = g.mtpForward(cx, dc); err != nil {
			return err
		}
		return cudart.Download(cx, gotOut, g.mtp.x)
	})
	if err != nil {
		t.Fatal(err)
	}
	worst := [2]float64{}
	for i, pair := range [][2][]float32{{gotOut, wantOut}, {gotLogits, wantLogits}} {
		if len(pair[0]) != len(pair[1]) {
			t.Fatalf("%s: %d values, the CPU layer %d", what, len(pair[0]), len(pair[1]))
		}
		for k, w := range pair[1] {
			worst[i] = max(worst[i], math.Abs(float64(pair[0][k]-w))/(1+math.Abs(float64(w))))
		}
	}
	t.Logf("%s MTP layer against the CPU's: max |Δ|/(1+|cpu|) output rows %.3g, draft logits %.3g (tolerance %g)", what, worst[0], worst[1], tol)
	if err := diffRows(what+" MTP output", gotOut, wantOut, tol); err != nil {
		t.Error(err)
	}
	if err := diffRows(what+" MTP draft logits", gotLogits, wantLogits, tol); err != nil {
		t.Error(err)
	}
	return gotOut
}
