package deepseekv4flash

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/resin-llm/resin/core/kernels/ref"
	"github.com/resin-llm/resin/core/runnertest"
	"github.com/resin-llm/resin/core/weights"
)

// TestLoadFP8Packed: on a checkpoint published as DeepSeek ships it (FP8 linears in
// 128×128 blocks, MXFP4 routed experts, the rest bf16), --dtype fp8 holds every
// projection as stored: FP8 and MXFP4 as their bytes and scales, bf16 (lm_head, the
// compressors', the indexer's weights_proj) in bf16; so each multiplies as the
// dequantised fp32 weight does, within float32 reassociation (1e-5 of Σ|x·w|); the packed
// tensors take under a third of their fp32 bytes; and the model's logits stay within
// dtypeTol[fp8] of the fp32 model's on the same checkpoint.
func TestLoadFP8Packed(t *testing.T) {
	dir, c, _ := publishedCheckpoint(t, publishedConfigJSON, nil)
	load := func() *Weights {
		ck, err := weights.Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		defer ck.Close()
		w, err := LoadWeights(c, ck)
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	w := load()
	m, err := newModelPacked(c, w, 512, ref.DTypeFP8, dir)
	if err != nil {
		t.Fatal(err)
	}
	pw := m.PackedWeights()
	t.Logf("packed: %d FP8 and %d MXFP4 weights, %d bytes against %d in fp32 (%.2f×)", pw.FP8, pw.FP4, pw.Bytes, pw.FP32Bytes, float64(pw.Bytes)/float64(pw.FP32Bytes))
	in, h := m.par.inter, c.HiddenSize
	experts := 0
	for li := range w.Layers {
		experts += 2 * len(w.Layers[li].GateUp) / (2 * in * h)
	}
	if pw.FP4 != experts || pw.FP8 == 0 || pw.Bytes*3 > pw.FP32Bytes {
		t.Fatalf("packed %+v: want all %d routed expert weights MXFP4, some FP8, under a third of fp32's bytes", pw, experts)
	}

	rng := rand.New(rand.NewPCG(11, 12))
	fp8, fp4 := 0, 0
	check := func(name string, q *ref.Weight, f []float32) {
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
		worst := 0.0 // the largest |Δ| over Σ|x·w|
		for r := range rows {
			for j := range q.N {
				var mag float64
				for l := range q.K {
					mag += math.Abs(float64(x[r*q.K+l] * f[j*q.K+l]))
				}
				worst = max(worst, math.Abs(float64(got[r*q.N+j]-want[r*q.N+j]))/max(mag, 1e-30))
			}
		}
		if worst > 1e-5 {
			t.Errorf("%s: held in %s, off by %.3g of Σ|x·w| from its fp32 dequantisation", name, q.DType, worst)
		}
		switch q.DType {
		case ref.DTypeFP4:
			fp4++
		case ref.DTypeFP8:
			fp8++
		}
	}
	gin := m.par.heads * c.HeadDim / m.par.groups
	for li := range w.Layers {
		l := &w.Layers[li]
		p := l.cpu
		for i, f := range [][]float32{l.QA, l.QB, l.KV, l.OB} {
			check("attention", p.w[[]int{pQA, pQB, pKV, pOB}[i]], f)
		}
		for i, f := range [][]float32{l.SharedGate, l.SharedUp, l.SharedDown} {
			check("shared expert", p.w[pSharedGate+i], f)
		}
		for g, q := range p.oa {
			check("wo_a group", q, l.OA[g*c.OLoraRank*gin:(g+1)*c.OLoraRank*gin])
		}
		for e := range p.gateUp {
			check("gate_up", p.gateUp[e], l.GateUp[e*2*in*h:(e+1)*2*in*h])
			check("down", p.down[e], l.Down[e*h*in:(e+1)*h*in])
		}
		if cp := l.Compressor; cp != nil {
			check("compressor kv", p.w[pCompKV], cp.KV)
		}
		if ix := l.Indexer; ix != nil {
			check("indexer q_b", p.w[pIdxQB], ix.QB)
		}
	}
	check("lm_head", m.headW, w.Head)
	if fp4 != pw.FP4 || fp8 != pw.FP8 {
		t.Errorf("checked %d FP8 and %d MXFP4 weights; PackedWeights counts %d and %d", fp8, fp4, pw.FP8, pw.FP4)
	}

	ref32, err := NewModel(c, load(), 512) // its own Weights: hold set w's layers' projections
	if err != nil {
		t.Fatal(err)
	}
	toks := runnertest.Prompt(24, c.VocabSize, 5)
	want, _ := runChunks(t, ref32, toks, []int{20, 1, 1, 2})
	got, _ := runChunks(t, m, toks, []int{20, 1, 1, 2})
	checkDTypeLogits(t, "published fp8/mxfp4 against fp32", ref.DTypeFP8, got, want, c.VocabSize)

	// Load (--dtype fp8) holds the same, its fp32 copies dropped.
	r, err := Load(dir, Options{DType: ref.DTypeFP8})
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Model.PackedWeights(); got != pw || r.Model.W.Layers[0].GateUp != nil {
		t.Fatalf("Load as fp8: packed %+v (want %+v), fp32 experts kept: %v", got, pw, r.Model.W.Layers[0].GateUp != nil)
	}
	loaded, _ := runChunks(t, r.Model, toks, []int{20, 1, 1, 2})
	checkDTypeLogits(t, "Load(fp8) against fp32", ref.DTypeFP8, loaded, want, c.VocabSize)
}
