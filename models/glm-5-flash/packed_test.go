package glm5flash

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/kernels/ref"
	"github.com/resin-llm/resin/core/runnertest"
	"github.com/resin-llm/resin/core/weights"
)

// TestLoadFP8Packed: on the module golden stored as GLM-5.3-Flash's FP8 checkpoint ships
// it (fp8Checkpoint: MLA, indexer, MLP, shared and routed expert linears in FP8 with
// 128×128 blocks, KDA projections bf16, the rest as it was), --dtype fp8 holds every
// projection as stored: the FP8 ones as their bytes and scales, one per FP8 tensor (each
// routed expert of a bank its own), and the others in bf16 or fp32 as stored; so every
// projection multiplies as the dequantised fp32 weight does, within float32
// reassociation (1e-5 of Σ|x·w|); the packed tensors take under a third of their fp32
// bytes; and the logits stay within 1e-5 of the largest of the fp32 model's on the same
// checkpoint (the fp32 parity test's bound).
func TestLoadFP8Packed(t *testing.T) {
	dir, _ := fp8Checkpoint(t)
	want32, err := LoadText(dir, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	m, err := LoadTextModel(dir)
	if err != nil {
		t.Fatal(err)
	}
	pk, _, err := openGPUFP8(dir, m.Config.Quant)
	if err != nil || pk == nil {
		t.Fatalf("open the FP8 checkpoint's reader: %v", err)
	}
	defer pk.close()
	if err := m.hold(ref.DTypeFP8, pk); err != nil {
		t.Fatal(err)
	}
	pw := m.PackedWeights()
	t.Logf("packed: %d FP8 weights, %d bytes against %d in fp32 (%.2f×)", pw.FP8, pw.Bytes, pw.FP32Bytes, float64(pw.Bytes)/float64(pw.FP32Bytes))
	if pw.FP8 < 40 || pw.Bytes*3 > pw.FP32Bytes {
		t.Fatalf("packed %+v: want the fixture's 40+ FP8 linears, under a third of fp32's bytes", pw)
	}

	rng := rand.New(rand.NewPCG(13, 14))
	fp8 := 0
	check := func(q *ref.Weight, f []float32) {
		t.Helper()
		const rows = 2
		x := make([]float32, rows*q.K)
		for i := range x {
			x[i] = float32(rng.NormFloat64())
		}
		got, want := make([]float32, rows*q.N), make([]float32, rows*q.N)
		if err := q.MatMulT(got, x, rows); err != nil {
			t.Fatal(err)
		}
		if err := ref.MatMulT(want, x, f, rows, q.K, q.N); err != nil {
			t.Fatal(err)
		}
		for r := range rows {
			for j := range q.N {
				var mag float64
				for l := range q.K {
					mag += math.Abs(float64(x[r*q.K+l] * f[j*q.K+l]))
				}
				if d := math.Abs(float64(got[r*q.N+j] - want[r*q.N+j])); d > 1e-5*mag {
					t.Fatalf("%s weight [%d, %d]: out[%d, %d] off by %.3g of Σ|x·w| from its fp32 dequantisation", q.DType, q.N, q.K, r, j, d/mag)
				}
			}
		}
		if q.DType == ref.DTypeFP8 {
			fp8++
		}
	}
	for f, q := range m.held.proj {
		check(q, *f)
	}
	for f, qs := range m.held.experts {
		for x, q := range qs {
			check(q, (*f)[x*q.N*q.K:(x+1)*q.N*q.K])
		}
	}
	if fp8 != pw.FP8 {
		t.Errorf("%d FP8 weights held, PackedWeights counts %d", fp8, pw.FP8)
	}

	toks := runnertest.Prompt(24, m.Config.VocabSize, 5)
	want := runSplits(t, want32.Model, toks, 20, 1, 1, 2)
	r, err := LoadTextDType(dir, 0, 0, ref.DTypeFP8)
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Model.PackedWeights(); got != pw {
		t.Fatalf("LoadTextDType as fp8: packed %+v, want %+v", got, pw)
	}
	checkDTypeLogits(t, "packed fp8", ref.DTypeFP8, runSplits(t, r.Model, toks, 20, 1, 1, 2), want, m.Config.VocabSize, dtypeTol[ref.DTypeFP32])
}

// perExpertFP8Checkpoints writes one random model (tinyTextConfigJSON with 128-wide routed
// experts, so each expert's gate fills whole 128-row scale blocks) twice as a fine-grained
// FP8 checkpoint: with per-expert tensors (experts.E.{gate,up,down}_proj.weight, each
// quantised on its own) and with the fused banks (experts.gate_up_proj [E, 2F, D],
// experts.down_proj [E, D, F]) quantised from the same values; every MLP projection is
// FP8, the rest fp32. Since F = 128, a fused gate_up block holds either gate or up rows
// only, so both store the same bytes and scales.
func perExpertFP8Checkpoints(t *testing.T) (perExpert, fused string) {
	t.Helper()
	cfgJSON := strings.Replace(tinyTextConfigJSON, `"moe_intermediate_size": 16`, `"moe_intermediate_size": 128`, 1)
	c, err := ParseTextConfig([]byte(cfgJSON))
	if err != nil {
		t.Fatal(err)
	}
	m, err := RandomTextModel(c, 9)
	if err != nil {
		t.Fatal(err)
	}
	E, D, F := c.NRoutedExperts, c.HiddenSize, c.MoEIntermediateSize
	if F%128 != 0 {
		t.Fatalf("moe_intermediate_size %d: the fixture needs whole 128-row blocks", F)
	}
	names := map[string][]float32{}
	for i, ly := range m.W.layers {
		if ly.moe == nil {
			continue
		}
		for e := range E {
			p := fmt.Sprintf("%slayers.%d.mlp.experts.%d.", TextPrefix, i, e)
			gu := ly.moe.gateUp[e*2*F*D : (e+1)*2*F*D]
			names[p+"gate_proj.weight"] = gu[:F*D]
			names[p+"up_proj.weight"] = gu[F*D:]
			names[p+"down_proj.weight"] = ly.moe.down[e*D*F : (e+1)*D*F]
		}
	}
	rec := &recordingSource{tensorSource: mapSource{m: names, fallback: randomSource{rand.New(rand.NewPCG(11, 12))}, layers: c.NumHiddenLayers},
		got: map[string]weights.Tensor{}}
	if _, _, err := loadTextWeights(rec, c); err != nil || rec.err != nil {
		t.Fatal(err, rec.err)
	}
	per, fu := map[string]weights.Tensor{}, map[string]weights.Tensor{}
	quant := func(into map[string]weights.Tensor, x weights.Tensor) {
		q, s := quantizeBlocks(t, x)
		into[q.Name], into[s.Name] = q, s
	}
	for name, x := range rec.got {
		switch {
		case strings.Contains(name, ".mlp.") && strings.HasSuffix(name, "_proj.weight"):
			quant(per, x)
			if !strings.Contains(name, ".experts.") {
				quant(fu, x)
			}
		default:
			per[name], fu[name] = x, x
		}
	}
	for i, ly := range m.W.layers {
		if ly.moe == nil {
			continue
		}
		p := fmt.Sprintf("%slayers.%d.mlp.experts.", TextPrefix, i)
		gu, err := weights.NewTensor(p+"gate_up_proj", weights.F32, []int{E, 2 * F, D}, ly.moe.gateUp)
		if err != nil {
			t.Fatal(err)
		}
		dn, err := weights.NewTensor(p+"down_proj", weights.F32, []int{E, D, F}, ly.moe.down)
		if err != nil {
			t.Fatal(err)
		}
		quant(fu, gu)
		quant(fu, dn)
	}
	qcfg := []byte(strings.Replace(cfgJSON, `"architectures"`, `"quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}, "architectures"`, 1))
	return writeCheckpoint(t, per, qcfg), writeCheckpoint(t, fu, qcfg)
}

// TestLoadFP8PackedPerExpert: --dtype fp8 on a checkpoint whose routed experts are stored
// per expert in FP8 (perExpertFP8Checkpoints) holds every expert's gate and up stacked
// into one FP8 weight (packedExperts' per-expert path) and its down as stored: every
// routed expert is held FP8, the packed weights count and weigh what the fused banks of
// the same bytes give, the logits equal the fused checkpoint's bit for bit (gate and up
// stacked in the fused order, each expert its own) and stay within the fp32 parity bound
// of the dequantised fp32 model on the same checkpoint.
func TestLoadFP8PackedPerExpert(t *testing.T) {
	perDir, fusedDir := perExpertFP8Checkpoints(t)
	want32, err := LoadText(perDir, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	per, err := LoadTextDType(perDir, 0, 0, ref.DTypeFP8)
	if err != nil {
		t.Fatal(err)
	}
	fused, err := LoadTextDType(fusedDir, 0, 0, ref.DTypeFP8)
	if err != nil {
		t.Fatal(err)
	}
	c := per.Model.Config
	if per.Model.W.layers[1].moe.perExpert == "" {
		t.Fatal("the per-expert checkpoint did not load as per-expert tensors")
	}
	experts := 0
	for _, ly := range per.Model.W.layers {
		if e := ly.moe; e != nil {
			for _, f := range []*[]float32{&e.gateUp, &e.down} {
				qs := per.Model.held.experts[f]
				if len(qs) != c.NRoutedExperts {
					t.Fatalf("%d experts held, want %d", len(qs), c.NRoutedExperts)
				}
				for x, q := range qs {
					if q.DType != ref.DTypeFP8 {
						t.Fatalf("expert %d held in %s, want fp8 as stored", x, q.DType)
					}
					experts++
				}
			}
		}
	}
	pp, pf := per.Model.PackedWeights(), fused.Model.PackedWeights()
	t.Logf("per-expert: %d FP8 weights (%d routed), %d bytes against %d in fp32; fused: %+v", pp.FP8, experts, pp.Bytes, pp.FP32Bytes, pf)
	if pp != pf || pp.FP8 < experts {
		t.Fatalf("per-expert packed %+v, fused %+v (%d routed experts' weights)", pp, pf, experts)
	}
	toks := runnertest.Prompt(24, c.VocabSize, 5)
	got := runSplits(t, per.Model, toks, 20, 1, 1, 2)
	if d, at := runnertest.MaxAbsDiff(got, runSplits(t, fused.Model, toks, 20, 1, 1, 2)); d != 0 {
		t.Fatalf("per-expert FP8 logits differ from the fused banks' by %g at %d", d, at)
	}
	checkDTypeLogits(t, "per-expert fp8", ref.DTypeFP8, got, runSplits(t, want32.Model, toks, 20, 1, 1, 2), c.VocabSize, dtypeTol[ref.DTypeFP32])
}
