package glm5flash

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/cudart/emutest"
)

// gpuBF16WeightsTol bounds |bf16 − fp32| / (1 + |fp32|) for the outputs of a dense MLP, a
// MoE layer (the fp32 router on the same input routes both runs alike) and lm_head on the
// device with their weights in bf16 (GPUOptions.Weights: weights and activation operands
// rounded to bf16, 2^-9 relative each, fp32 accumulation) against the same device's fp32
// weights, on the same inputs: sums of up to 48 products of N(0, 1) inputs and the tiny
// model's weights land within 1e-2 (the largest is logged); a wrong operand, layout or
// expert is off by O(1). Through the whole model the difference is not bounded this way:
// the tiny model's logits moved by up to 1.28 relative against the fp32 CPU runner in a
// 23-token prefill with only its dense and shared MLPs in bf16 (a perturbed hidden state
// flipping a top-k routing choice is the likely cause, not traced), so no end-to-end
// tolerance on logits is stated.
const gpuBF16WeightsTol = 2e-2

// TestEmulatedGPUBF16Weights runs a dense MLP, a MoE layer and lm_head of the tiny model
// over 5 rows of N(0, 1) inputs on two GPURunners (the emulated device), fp32 weights and
// bf16 (GPUOptions.Weights): every output within gpuBF16WeightsTol, the bf16 outputs not
// the fp32 ones (the rounding is applied); and f16 weights are refused.
func TestEmulatedGPUBF16Weights(t *testing.T) {
	if emutest.Reexec(t) {
		return
	}
	kit := openGPUTest(t)
	m := tinyTextModel(t)
	c := m.Config
	D, n := c.HiddenSize, 5
	x := make([]float32, n*D)
	r := rand.New(rand.NewPCG(3, 4))
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	dense := slices.IndexFunc(m.W.layers, func(l textLayer) bool { return l.dense != nil })
	sparse := slices.IndexFunc(m.W.layers, func(l textLayer) bool { return l.moe != nil })
	if dense < 0 || sparse < 0 {
		t.Fatal("the tiny model has no dense or no MoE layer")
	}
	var got [2][3][]float32
	for i, wt := range []cudart.DType{cudart.F32, cudart.BF16} {
		gr := kit.runner(t, 1, 32, 32, GPUOptions{Weights: wt})
		g := gr.g
		err := gr.dev.Do(func(cx *cudart.Ctx) error {
			w := &g.w
			if err := cudart.Upload(cx, w.x, x); err != nil {
				return err
			}
			for j, f := range []func() (int, error){
				func() (int, error) { return n * D, g.mlp(cx, g.layers[dense].dense, w.ffn, w.x, n) },
				func() (int, error) { return n * D, g.moe(cx, g.layers[sparse].moe, w.ffn, w.x, n) },
				func() (int, error) {
					return n * c.VocabSize, g.linear(cx, g.headL, w.ffn, w.x, g.head, n, D, c.VocabSize)
				},
			} {
				size, err := f()
				if err != nil {
					return err
				}
				if err := cx.Synchronize(); err != nil {
					return err
				}
				got[i][j] = make([]float32, size)
				if err := cudart.Download(cx, got[i][j], w.ffn); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for j, name := range []string{"dense MLP", "MoE layer", "lm_head"} {
		worst := 0.0
		for k, want := range got[0][j] {
			worst = max(worst, math.Abs(float64(got[1][j][k]-want))/(1+math.Abs(float64(want))))
		}
		t.Logf("bf16 %s: max |Δ|/(1+|fp32|) %.3g (tolerance %g)", name, worst, gpuBF16WeightsTol)
		if err := diffRows("bf16 "+name, got[1][j], got[0][j], gpuBF16WeightsTol); err != nil {
			t.Error(err)
		}
		if slices.Equal(got[0][j], got[1][j]) {
			t.Errorf("the bf16 %s gave the fp32 outputs", name)
		}
	}
	if _, err := NewGPURunner(m, kit.dev, kit.cache, 1, 32, 32, 0, GPUOptions{Weights: cudart.F16}); err == nil {
		t.Error("f16 weights accepted")
	}
}
