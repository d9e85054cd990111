package glm5flash

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/resin-llm/resin/core/kernels/ref"
	"github.com/resin-llm/resin/core/runnertest"
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
