package glm5flash

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/cudart/emutest"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/gpurunner"
)

// TestEmulatedGPUFP8ExpertBanks: FP8 routed experts run as one bank a projection, grouped
// over the masked layout (Linears.Experts: the layout's counts read on the device), equal
// the per-expert path (GPUOptions.perExpertFP8, one linear an expert, each checked against
// its specification by TestEmulatedGPUFP8Linears) on the emulated device, for the fixture's
// fused banks (experts.gate_up_proj / down_proj, the MTP layer's too) and for per-expert
// tensors stacked into banks (perExpertFP8Checkpoints, 128-wide experts): every MoE layer's
// output over 5 rows of N(0, 1) inputs within 1e-6·(1+|v|) of the per-expert path's (the
// largest difference logged), with every layer holding its banks (and no per-expert
// linears) and the same FP8 linears counted. Then through the engine on the fixture, decode
// steps replaying CUDA graphs with the banks inside equal the eager runner bit for bit.
func TestEmulatedGPUFP8ExpertBanks(t *testing.T) {
	if emutest.Reexec(t) {
		return
	}
	fp8ExpertBanks(t, openGPUTest(t))
}

// TestGPUFP8ExpertBanks is TestEmulatedGPUFP8ExpertBanks on GPU 0 of a machine with a GPU
// (RESIN_GPU=1; scripts/gpu-check.sh --glm runs it): the fixture's experts are too narrow
// for cuBLASLt's FP8 path, so both forms run the fallback kernel there too.
func TestGPUFP8ExpertBanks(t *testing.T) {
	if os.Getenv("RESIN_GPU") == "" {
		t.Skip("set RESIN_GPU=1 on a machine with a GPU to run the FP8 expert banks against the per-expert path")
	}
	fp8ExpertBanks(t, openGPUTest(t))
}

// fp8ExpertBanks is TestEmulatedGPUFP8ExpertBanks on kit's device.
func fp8ExpertBanks(t *testing.T, kit *gpuTestKit) {
	fusedDir, _ := fp8Checkpoint(t)
	perDir, _ := perExpertFP8Checkpoints(t)
	for _, c := range []struct {
		name, dir string
		drafts    int
	}{{"fused banks", fusedDir, 1}, {"per-expert tensors", perDir, 0}} {
		cpu, err := LoadText(c.dir, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		m := cpu.Model
		E, D := m.Config.NRoutedExperts, m.Config.HiddenSize
		var runs [2]*GPURunner
		for i, per := range []bool{false, true} {
			r, err := NewGPURunner(m, kit.dev, kit.cache, 1, 16, 4, 0, GPUOptions{Checkpoint: c.dir, Drafts: c.drafts, perExpertFP8: per})
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			runs[i] = r
		}
		if a, b := runs[0].g.fp8Count, runs[1].g.fp8Count; a != b {
			t.Errorf("%s: %d FP8 linears as banks, %d per expert", c.name, a, b)
		}
		moes := func(g *gpuModel) []*gpuMoE {
			var ms []*gpuMoE
			for _, l := range g.layers {
				if l.moe != nil {
					ms = append(ms, l.moe)
				}
			}
			if g.mtp != nil {
				ms = append(ms, g.mtp.moe)
			}
			return ms
		}
		for i, e := range moes(runs[0].g) {
			pe := moes(runs[1].g)[i]
			if e.gateUpBank == nil || e.downBank == nil || e.gateUpL != nil || e.downL != nil || e.gateUpBank.Experts != E {
				t.Fatalf("%s: MoE %d: banks %v %v, per-expert linears %d %d: want two banks of %d experts alone", c.name, i, e.gateUpBank, e.downBank,
					len(e.gateUpL), len(e.downL), E)
			}
			if len(pe.gateUpL) != E || len(pe.downL) != E || pe.gateUpBank != nil {
				t.Fatalf("%s: MoE %d per expert: %d and %d linears, bank %v", c.name, i, len(pe.gateUpL), len(pe.downL), pe.gateUpBank)
			}
		}
		const n = 5
		x := make([]float32, n*D)
		rng := rand.New(rand.NewPCG(8, 9))
		for i := range x {
			x[i] = float32(rng.NormFloat64())
		}
		var outs [2][][]float32
		for ri, r := range runs {
			g := r.g
			err := r.dev.Do(func(cx *cudart.Ctx) error {
				for _, e := range moes(g) {
					if err := cudart.Upload(cx, g.w.x, x); err != nil {
						return err
					}
					if err := g.moe(cx, e, g.w.ffn, g.w.x, n); err != nil {
						return err
					}
					if err := cx.Synchronize(); err != nil {
						return err
					}
					y := make([]float32, n*D)
					if err := cudart.Download(cx, y, g.w.ffn); err != nil {
						return err
					}
					outs[ri] = append(outs[ri], y)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		}
		worst := 0.0
		for i, want := range outs[1] {
			for k, v := range want {
				worst = max(worst, math.Abs(float64(outs[0][i][k]-v))/(1+math.Abs(float64(v))))
			}
			if err := diffRows(fmt.Sprintf("%s: MoE %d as banks", c.name, i), outs[0][i], want, 1e-6); err != nil {
				t.Error(err)
			}
		}
		t.Logf("%s: %d MoE layers as FP8 banks against one linear an expert: max |Δ|/(1+|v|) %.3g", c.name, len(outs[0]), worst)
	}

	// Graph replay with the banks = eager, through the engine.
	var outs [2][]string
	for i, eager := range []bool{true, false} {
		r, _, err := OpenGPU(fusedDir, 4<<20, gpurunner.Options{Limits: gpurunner.Limits{MaxTokens: 64, MaxSeqs: 4, MaxRows: 64},
			KernelCache: os.Getenv("RESIN_KERNEL_CACHE"), Eager: eager})
		if err != nil {
			t.Fatal(err)
		}
		gr := r.(*GPURunner)
		pool, err := gr.NewPool(4 << 20)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := generateAll(t, gr, pool, specPrompts(gr.Model.Config.VocabSize)[:3], engine.SamplingParams{MaxTokens: 8, IgnoreEOS: true, Logprobs: true}, 64)
		for _, o := range got {
			outs[i] = append(outs[i], fmt.Sprintf("%v %v", o.Tokens, o.Logprobs))
		}
		graph, _ := gr.StepCounts()
		if !eager && graph == 0 {
			t.Error("no decode step replayed a graph")
		}
		gr.Close()
	}
	for i := range outs[0] {
		if outs[0][i] != outs[1][i] {
			t.Errorf("request %d: graphs %s, eager %s", i, outs[1][i], outs[0][i])
		}
	}
}
