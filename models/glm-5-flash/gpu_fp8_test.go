package glm5flash

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/cudart/emutest"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/gpurunner"
	"github.com/resin-llm/resin/core/kernels/cuda"
	"github.com/resin-llm/resin/core/runnertest"
	"github.com/resin-llm/resin/core/weights"
)

// quantizeBlocks stores x ([..., rows, cols] F32) as F8_E4M3 with one float32
// weight_scale_inv per 128×128 block of each matrix (block amax / 448, the e4m3 code
// nearest to v / scale), as GLM-5.3-Flash's FP8 checkpoint stores its linears.
func quantizeBlocks(t *testing.T, x weights.Tensor) (weights.Tensor, weights.Tensor) {
	t.Helper()
	v, err := decodeF32(x)
	if err != nil {
		t.Fatal(err)
	}
	nd := len(x.Shape)
	rows, cols := x.Shape[nd-2], x.Shape[nd-1]
	br, bc := (rows+127)/128, (cols+127)/128
	mats := len(v) / (rows * cols)
	q, s := make([]byte, len(v)), make([]float32, mats*br*bc)
	for m := range mats {
		w := v[m*rows*cols : (m+1)*rows*cols]
		for bi := range br {
			for bj := range bc {
				amax := float32(0)
				for r := bi * 128; r < min(rows, (bi+1)*128); r++ {
					for c := bj * 128; c < min(cols, (bj+1)*128); c++ {
						amax = max(amax, float32(math.Abs(float64(w[r*cols+c]))))
					}
				}
				sc := max(amax/448, 1e-30)
				s[(m*br+bi)*bc+bj] = sc
				for r := bi * 128; r < min(rows, (bi+1)*128); r++ {
					for c := bj * 128; c < min(cols, (bj+1)*128); c++ {
						q[m*rows*cols+r*cols+c] = cuda.Float32ToE4M3(w[r*cols+c] / sc)
					}
				}
			}
		}
	}
	shape := append(append([]int(nil), x.Shape[:nd-2]...), br, bc)
	st, err := weights.NewTensor(x.Name+"_scale_inv", weights.F32, shape, s)
	if err != nil {
		t.Fatal(err)
	}
	return weights.Tensor{Name: x.Name, DType: weights.F8E4M3, Shape: x.Shape, Data: q}, st
}

// fp8Checkpoint writes the module golden as GLM-5.3-Flash's FP8 checkpoint ships its
// linears: every MLA, indexer (wq_b, wk, weights_proj), MLP, shared and routed expert
// projection of the decoder and MTP layers in FP8 with 128×128 blocks, the KDA
// projections in bf16, everything else (embeddings, lm_head, router, norms, mHC, the KPool
// gate) as it was; config.json gains the fine-grained FP8 quantization_config. It returns
// the directory and how many tensors are FP8.
func fp8Checkpoint(t *testing.T) (string, int) {
	t.Helper()
	ts, cfg := goldenTensors(t, filepath.Join("testdata", "parity", "module"))
	c, err := ParseTextConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	fp8 := 0
	for name, x := range ts {
		if !strings.HasPrefix(name, TextPrefix+"layers.") {
			continue
		}
		var li int
		var rest string
		if _, err := fmt.Sscanf(strings.TrimPrefix(name, TextPrefix+"layers."), "%d.", &li); err != nil {
			t.Fatal(err)
		}
		rest = name[strings.Index(name, fmt.Sprintf("layers.%d.", li))+len(fmt.Sprintf("layers.%d.", li)):]
		kda := li < c.NumHiddenLayers && c.LayerTypes[li] == LinearAttention
		switch {
		case kda && strings.HasPrefix(rest, "self_attn.") && strings.HasSuffix(rest, "_proj.weight"):
			v, _ := decodeF32(x)
			b, err := weights.NewTensor(name, weights.BF16, x.Shape, v)
			if err != nil {
				t.Fatal(err)
			}
			ts[name] = b
		case !kda && strings.HasPrefix(rest, "self_attn.") && strings.HasSuffix(rest, "_proj.weight"),
			!kda && (strings.HasSuffix(rest, "_proj_with_mqa.weight") || strings.HasSuffix(rest, "wq_b.weight") || strings.HasSuffix(rest, "wk.weight")),
			strings.HasPrefix(rest, "mlp.") && strings.HasSuffix(rest, "_proj.weight"),
			rest == "mlp.experts.gate_up_proj", rest == "mlp.experts.down_proj":
			q, s := quantizeBlocks(t, x)
			ts[name], ts[s.Name] = q, s
			fp8++
		}
	}
	qcfg := strings.Replace(string(cfg), `"architectures"`, `"quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}, "architectures"`, 1)
	return writeCheckpoint(t, ts, []byte(qcfg)), fp8
}

// TestFP8CheckpointShape checks the fixture: its FP8 tensors and bf16 KDA projections load
// through the CPU path (dequantised), and the names quantised are the ones meant.
func TestFP8CheckpointShape(t *testing.T) {
	dir, n := fp8Checkpoint(t)
	ck, err := weights.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	for _, name := range []string{"layers.1.self_attn.q_a_proj.weight", "layers.1.self_attn.kv_b_proj.weight", "layers.1.self_attn.indexer.wq_b.weight",
		"layers.1.self_attn.indexer.weights_proj.weight", "layers.0.mlp.down_proj.weight", "layers.1.mlp.experts.gate_up_proj",
		"layers.1.mlp.shared_experts.gate_proj.weight", "layers.6.self_attn.o_proj.weight"} {
		if info, ok := ck.Info(TextPrefix + name); !ok || info.DType != weights.F8E4M3 {
			t.Errorf("%s: %v, want F8_E4M3", name, info.DType)
		}
	}
	for _, name := range []string{"layers.0.self_attn.q_proj.weight", "layers.0.self_attn.o_proj.weight"} {
		if info, _ := ck.Info(TextPrefix + name); info.DType != weights.BF16 {
			t.Errorf("%s: %v, want BF16", name, info.DType)
		}
	}
	if n < 40 {
		t.Errorf("%d FP8 tensors", n)
	}
	if _, err := LoadText(dir, 0, 0); err != nil {
		t.Fatal(err)
	}
}

// gpuFP8LinearTol bounds one FP8 linear's output on the device against its specification,
// the activation quantised as cuda.QuantizeFP8Host does times the dequantised weight in
// float64: the two differ by float32 accumulation alone, within 1e-5·Σ|x̂·w| + 1e-6.
const gpuFP8LinearTol = 1e-5

// TestEmulatedGPUFP8Linears opens the FP8 fixture with GPUOptions.Checkpoint on the
// emulated device (the fallback kernel path) and checks, for every FP8 linear uploaded
// (MLA q_a/q_b/kv_a/o, indexer wq_b/wk, dense and shared down, each routed expert's
// gate_up and down), its output on 5 rows of N(0, 1) inputs against (a) the specification
// within gpuFP8LinearTol and (b) the CPU path's product on the same dequantised weights
// (float32 activations) within the bound the e4m3 activation rounding allows:
// |Δ| ≤ 2^-4·Σ|x·w| + 2^-10·Σ s·|w| (+ the float32 accumulation), s the row's scale per
// 128 inputs; and the weight on the device dequantises to the CPU model's field. The count
// of linears and the startup line's FP8 part are checked too.
func TestEmulatedGPUFP8Linears(t *testing.T) {
	if emutest.Reexec(t) {
		return
	}
	fp8Linears(t, openGPUTest(t), gpurunner.FP8Kernel)
}

// TestGPUFP8Linears is TestEmulatedGPUFP8Linears on GPU 0 of a machine with a GPU
// (RESIN_GPU=1; scripts/gpu-check.sh --glm runs it) with the path the device picks
// (gpurunner.FP8Auto), within the same bounds.
func TestGPUFP8Linears(t *testing.T) {
	if os.Getenv("RESIN_GPU") == "" {
		t.Skip("set RESIN_GPU=1 on a machine with a GPU to run the FP8 linears against their specification")
	}
	fp8Linears(t, openGPUTest(t), gpurunner.FP8Auto)
}

// fp8Linears is TestEmulatedGPUFP8Linears on kit's device with the FP8 path.
func fp8Linears(t *testing.T, kit *gpuTestKit, path gpurunner.FP8Path) {
	dir, _ := fp8Checkpoint(t)
	cpu, err := LoadText(dir, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	m := cpu.Model
	gr, err := NewGPURunner(m, kit.dev, kit.cache, 1, 16, 4, 0, GPUOptions{Checkpoint: dir, FP8: path, perExpertFP8: true})
	if err != nil {
		t.Fatal(err)
	}
	defer gr.Close()
	g := gr.g
	c := m.Config
	E := c.NRoutedExperts
	// MLA: q_a, q_b, kv_a, o, and wq_b, wk with an indexer of its own; a dense MLP's down
	// (its gate and up, 48 rows, end mid-block: dequantised), a MoE's shared down and each
	// expert's gate_up and down.
	wantCount := 0
	for _, l := range m.W.layers {
		if l.mla != nil {
			wantCount += 4
			if l.mla.idx != nil {
				wantCount += 2
			}
		}
		if l.dense != nil {
			wantCount++
		}
		if l.moe != nil {
			wantCount += 1 + 2*E
		}
	}
	if g.fp8Count != wantCount {
		t.Errorf("%d FP8 linears uploaded, want %d", g.fp8Count, wantCount)
	}
	desc := gr.Describe()
	t.Log(desc)
	if p, _ := g.lin.FP8Path(); !strings.Contains(desc, fmt.Sprintf("fp8-block128: %d linears packed", wantCount)) || !strings.Contains(desc, p.String()) ||
		!strings.Contains(desc, "KDA projections f32") {
		t.Errorf("startup line %q", desc)
	}
	r := rand.New(rand.NewPCG(5, 6))
	const n = 5
	worstSpec, worstCPU := 0.0, 0.0
	checked := 0
	err = gr.dev.Do(func(cx *cudart.Ctx) error {
		xb, err := cx.Alloc(int64(4 * n * 1024))
		if err != nil {
			return err
		}
		defer cx.Free(xb)
		yb, err := cx.Alloc(int64(4 * n * 1024))
		if err != nil {
			return err
		}
		defer cx.Free(yb)
		for _, l := range g.linears {
			if l.DType != gpurunner.LinearFP8Block {
				continue
			}
			in, out := l.In, l.Out
			wq, ws := make([]byte, out*in), make([]float32, ((out+127)/128)*((in+127)/128))
			ep, sp := l.Weight()
			if err := cudart.Download(cx, wq, ep); err != nil {
				return err
			}
			if err := cudart.Download(cx, ws, sp); err != nil {
				return err
			}
			w := make([]float32, out*in)
			if err := weights.DequantFP8(w, wq, ws, out, in, 128, 128); err != nil {
				return err
			}
			x := make([]float32, n*in)
			for i := range x {
				x[i] = float32(r.NormFloat64())
			}
			if err := cudart.Upload(cx, xb.Ptr, x); err != nil {
				return err
			}
			if err := g.lin.Forward(cx, nil, l, yb.Ptr, xb.Ptr, n); err != nil {
				return err
			}
			if err := cx.Synchronize(); err != nil {
				return err
			}
			y := make([]float32, n*out)
			if err := cudart.Download(cx, y, yb.Ptr); err != nil {
				return err
			}
			groups := (in + 127) / 128
			xq, xs := make([]byte, n*in), make([]float32, groups*n)
			if err := cuda.QuantizeFP8Host(xq, xs, x, n, in, 0, false); err != nil {
				return err
			}
			for i := range n {
				for j := range out {
					var spec, exact, absSpec, absX, absS float64
					for k := range in {
						wk := float64(w[j*in+k])
						s := float64(xs[(k/128)*n+i])
						xh := float64(weights.F8E4M3ToFloat32(xq[i*in+k])) * s
						spec += xh * wk
						absSpec += math.Abs(xh * wk)
						exact += float64(x[i*in+k]) * wk
						absX += math.Abs(float64(x[i*in+k]) * wk)
						absS += s * math.Abs(wk)
					}
					got := float64(y[i*out+j])
					if d := math.Abs(got - spec); d > gpuFP8LinearTol*absSpec+1e-6 {
						return fmt.Errorf("fp8 linear [%d, %d]: row %d output %d: %g, the specification %g", out, in, i, j, got, spec)
					} else if absSpec > 0 {
						worstSpec = max(worstSpec, d/absSpec)
					}
					bound := math.Pow(2, -4)*absX + math.Pow(2, -10)*absS + 1e-5*absX + 1e-6
					if d := math.Abs(got - exact); d > bound {
						return fmt.Errorf("fp8 linear [%d, %d]: row %d output %d: %g, the CPU path's %g (bound %g)", out, in, i, j, got, exact, bound)
					} else if absX > 0 {
						worstCPU = max(worstCPU, d/absX)
					}
				}
			}
			checked++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("parity glm-5-flash fp8 linears (%v): %d FP8 linears: largest |Δ|/Σ|x̂w| against the specification %.3g, |Δ|/Σ|xw| against the CPU path %.3g (bound 2^-4 = %.3g plus the subnormal term)",
		path, checked, worstSpec, worstCPU, math.Pow(2, -4))
	if checked != wantCount {
		t.Errorf("checked %d FP8 linears, want %d", checked, wantCount)
	}
	// The weights on the device are the CPU model's dequantised fields.
	err = gr.dev.Do(func(cx *cudart.Ctx) error {
		for li, l := range m.W.layers {
			if l.mla == nil {
				continue
			}
			lw := g.dsa.fp8[g.layers[li].dsa.qb]
			if lw == nil {
				return fmt.Errorf("layer %d: q_b_proj is not an FP8 linear", li)
			}
			wq, ws := make([]byte, lw.Out*lw.In), make([]float32, ((lw.Out+127)/128)*((lw.In+127)/128))
			ep, sp := lw.Weight()
			if err := cudart.Download(cx, wq, ep); err != nil {
				return err
			}
			if err := cudart.Download(cx, ws, sp); err != nil {
				return err
			}
			w := make([]float32, len(wq))
			if err := weights.DequantFP8(w, wq, ws, lw.Out, lw.In, 128, 128); err != nil {
				return err
			}
			if d, at := runnertest.MaxAbsDiff(w, l.mla.qb); d != 0 {
				return fmt.Errorf("layer %d: q_b_proj on the device differs from the CPU model's by %g at %d", li, d, at)
			}
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}
}

// gpuFP8LogprobTol bounds |gpu − cpu| for a log probability between OpenGPU on the FP8
// fixture (FP8 linears with e4m3 activations, bf16 KDA projections and activations) and
// the CPU runner on the same dequantised weights (float32 activations), the CPU's
// teacher-forced on the GPU's tokens (gpu_forced_test.go). Not derived and loose: the
// module golden's tiny random model amplifies any rounding through its DSA top-k and MoE
// routing choices (one flipped choice moves a row's logits by O(1)): the same prompt rows
// differ by 6e-6 with every weight fp32 on the device, by 0.66 with only the KDA
// projections in bf16, by 1.07 with only the FP8 linears, and by 2.44 at most with both
// (measured, 2 loaded cores, emulated). The per-linear bound (TestEmulatedGPUFP8Linears)
// is the tight check; this one catches a wrong weight or path end to end (a layer's
// output wrong moves every row), not rounding.
const gpuFP8LogprobTol = 3.5

// gpuFP8MedianTol bounds the median of those differences over a run's rows (measured 0.16
// chunked, 0.20 one-shot, 71 rows each:
// see the log): most rows keep their routing and top-k choices, so the median is the
// rounding's own effect.
const gpuFP8MedianTol = 0.3

// TestEmulatedOpenGPUFP8 opens the FP8 fixture through OpenGPU on the emulated device
// (which sets the checkpoint and the bf16 KDA projections it ships) and Open's CPU runner
// on the same directory (dequantised), and runs endToEnd's requests (prefill rows, one
// request, a batch, prefix hits through and between KDA checkpoints) one-shot and with
// chunked prefill (5 tokens a step; CI runs the chunked half without the long prompt
// and its prefix hits, RESIN_EMU_CONFORMANCE=1 all): every GPU logprob within gpuFP8LogprobTol of the
// CPU's; the startup line names the FP8 path and the bf16 KDA projections.
func TestEmulatedOpenGPUFP8(t *testing.T) {
	if emutest.Reexec(t) {
		return
	}
	dir, _ := fp8Checkpoint(t)
	var log strings.Builder
	gr, _, err := OpenGPU(dir, 4<<20, gpurunner.Options{Limits: gpurunner.Limits{MaxTokens: 128, MaxSeqs: 4, MaxRows: 128},
		KernelCache: os.Getenv("RESIN_KERNEL_CACHE"), Log: &log})
	if err != nil {
		t.Fatal(err)
	}
	defer gr.(*GPURunner).Close()
	t.Log(strings.TrimSpace(log.String()))
	if s := log.String(); !strings.Contains(s, "KDA projections bf16") || !strings.Contains(s, "fp8-block128: ") || !strings.Contains(s, "linears packed") {
		t.Errorf("startup line %q", s)
	}
	worst := 0.0
	var s runnertest.Suite
	cfgs := []engine.Config{{MaxBatchTokens: 5, MaxSeqs: 4}, {MaxBatchTokens: 128, MaxSeqs: 4}}
	full := os.Getenv("RESIN_EMU_CONFORMANCE") != ""
	if !full {
		cfgs = cfgs[:1] // chunked prefill; one-shot and the prefix hits with RESIN_EMU_CONFORMANCE=1 (about 50 s)
	}
	for ci, cfg := range cfgs {
		gpool, err := gr.(*GPURunner).NewPool(4 << 20)
		if err != nil {
			t.Fatal(err)
		}
		cr, cpool, err := Open(dir, 4<<20)
		if err != nil {
			t.Fatal(err)
		}
		ge, ce := s.StartWith(t, gr, gpool, cfg), s.StartWith(t, cr, cpool, cfg)
		w, med := endToEnd(t, fmt.Sprintf("config %d", ci), ge, ce, gr.Info().VocabSize, 10*ci, gpuFP8LogprobTol, gpuFP8MedianTol, full)
		t.Logf("config %d: largest |Δ logprob| %.3g, median %.3g", ci, w, med)
		worst = max(worst, w)
		ge.Stop(t)
		ce.Stop(t)
	}
	t.Logf("largest |Δ logprob| FP8 GPU against the CPU path on the dequantised weights: %.3g (tolerance %g)", worst, gpuFP8LogprobTol)
}
