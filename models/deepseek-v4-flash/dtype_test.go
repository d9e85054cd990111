package deepseekv4flash

import (
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kernels/ref"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/core/runnertest"
	"github.com/resin-llm/resin/core/weights"
)

// dtypeTol bounds how far logits with the projections in a dtype may fall from fp32's,
// as fractions of the reference's largest |logit|: the median over rows of a row's largest
// |Δ|, and the largest |Δ| of any row; and the fraction of rows whose argmax must agree.
// These tiny random-weight models pick among near-tied candidates (the indexer's top-k
// and learned routing's, with margins near 1e-4), so a rounding flips a pick in a few rows
// and those rows' logits move far: the median shows the rounding, the maximum the flips.
// Measured on the three goldens (TestTransformersParityDTypes's log): bf16 median ≤ 0.41%,
// max ≤ 14%, argmax ≥ 0.96; int8 (Q8_0×Q8_0: activations quantised too) median ≤ 2.2%,
// max ≤ 33%, argmax ≥ 0.925. The bounds leave about 2× room.
type dtypeBound struct{ median, max, agree float64 }

var dtypeTol = map[ref.DType]dtypeBound{
	ref.DTypeFP32: {1e-6, 1e-6, 1},
	ref.DTypeBF16: {0.01, 0.25, 0.9},
	ref.DTypeInt8: {0.05, 0.5, 0.85},
	ref.DTypeFP8:  {1e-4, 1e-4, 1}, // a checkpoint's FP8/MXFP4/bf16 as stored (TestLoadFP8Packed)
}

// checkDTypeLogits applies dtypeTol[dt] to got against want.
func checkDTypeLogits(t *testing.T, what string, dt ref.DType, got, want []float32, vocab int) {
	t.Helper()
	var scale float64
	for _, v := range want {
		scale = max(scale, math.Abs(float64(v)))
	}
	diff, at := runnertest.MaxAbsDiff(got, want)
	med, agree := rowStats(got, want, vocab)
	t.Logf("%s %-40s max |Δ| %.3g (%.2g of the largest logit %.3g) at row %d; median row %.3g (%.2g); argmax agrees %.3f",
		dt, what, diff, diff/scale, scale, at/vocab, med, med/scale, agree)
	b := dtypeTol[dt]
	if !(med <= b.median*scale) || !(diff <= b.max*scale) || !(agree >= b.agree) {
		t.Errorf("%s %s: median row |Δ| %.3g (bound %g × %.3g), max %.3g (bound %g × %.3g), argmax agrees %.3f (bound %g)",
			dt, what, med, b.median, scale, diff, b.max, scale, agree, b.agree)
	}
}

// TestTransformersParityDTypes: with its projections (attention, compressor, indexer,
// shared and routed experts, lm_head) in bf16 and int8 and the fp32 copies dropped, each
// golden checkpoint's logits stay within dtypeTol of transformers' fp32 ones, as one
// prefill and in chunks; and the projections take fewer bytes than in fp32.
func TestTransformersParityDTypes(t *testing.T) {
	goldens, _ := filepath.Glob(filepath.Join("testdata", "parity", "*", "logits.safetensors"))
	if len(goldens) == 0 {
		t.Skipf("no goldens in testdata/parity: make them with `%s`", parityCommand)
	}
	for _, golden := range goldens {
		dir := filepath.Dir(golden)
		for _, dt := range []ref.DType{ref.DTypeBF16, ref.DTypeInt8} {
			t.Run(filepath.Base(dir)+"/"+string(dt), func(t *testing.T) {
				m := loadParityModelDType(t, dir, dt)
				toks, want, _ := readParityGolden(t, golden, m.Config.VocabSize)
				n := len(toks)
				for _, chunks := range [][]int{{n}, {3, 4, 5, 6, 7, 33, 1, 1, 2, 61, 77}} {
					got, _ := runChunks(t, m, toks, chunks)
					checkDTypeLogits(t, fmt.Sprintf("chunks %s", chunkLabel(chunks)), dt, got, want, m.Config.VocabSize)
				}
			})
		}
	}
}

// loadParityModelDType loads dir's checkpoint with its projections in dt and the fp32
// copies dropped, as Load does; it checks they take fewer bytes than fp32's.
func loadParityModelDType(t *testing.T, dir string, dt ref.DType) *Model {
	t.Helper()
	c, err := LoadConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	ck, err := weights.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	w, err := LoadWeights(c, ck)
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewModelDType(c, w, 4096, dt)
	if err != nil {
		t.Fatal(err)
	}
	checkDTypeBytes(t, m)
	return m
}

// checkDTypeBytes: m's projections in its dtype take at most 5/8 of their fp32 bytes (bf16
// 1/2, int8 34/128), and dropFP32 empties the layers' fp32 projections.
func checkDTypeBytes(t *testing.T, m *Model) {
	t.Helper()
	var fp32 int64
	for i := range m.W.Layers {
		l := &m.W.Layers[i]
		for _, s := range [][]float32{l.QA, l.QB, l.KV, l.OA, l.OB, l.SharedGate, l.SharedUp, l.SharedDown, l.GateUp, l.Down} {
			fp32 += 4 * int64(len(s))
		}
		if cp := l.Compressor; cp != nil {
			fp32 += 4 * int64(len(cp.KV)+len(cp.Gate))
		}
		if ix := l.Indexer; ix != nil {
			fp32 += 4 * int64(len(ix.KV)+len(ix.Gate)+len(ix.QB)+len(ix.WeightsProj))
		}
	}
	fp32 += 4 * int64(len(m.W.Head))
	if got := m.WeightBytes(); got > fp32*5/8 {
		t.Errorf("%s: the projections take %d bytes, fp32 %d", m.DType(), got, fp32)
	}
	m.dropFP32()
	if l := &m.W.Layers[0]; l.QA != nil || l.GateUp != nil || l.SharedDown != nil {
		t.Errorf("%s: dropFP32 kept layer 0's fp32 projections", m.DType())
	}
}

// TestForwardDTypesRandom: on the tiny random model, the projections held as ref.Weight
// in fp32 give fp32's logits exactly (the wiring); bf16, int8 and fp8 (quantised at load)
// run a prefill and decode steps in fewer bytes, their argmax mostly fp32's; and a dtype NewModelDType does not know is an
// error naming it.
func TestForwardDTypesRandom(t *testing.T) {
	c := tinyConfig(t)
	toks := runnertest.Prompt(40, c.VocabSize, 3)
	want, _ := runChunks(t, tinyModel(t), toks, []int{30, 1, 1, 8})
	for _, dt := range []ref.DType{ref.DTypeFP32, ref.DTypeBF16, ref.DTypeInt8, ref.DTypeFP8} {
		m, err := NewModel(c, RandomWeights(c, 7, true), 512)
		if err != nil {
			t.Fatal(err)
		}
		if err := m.hold(dt, nil); err != nil {
			t.Fatal(err)
		}
		if dt != ref.DTypeFP32 {
			checkDTypeBytes(t, m)
		}
		got, _ := runChunks(t, m, toks, []int{30, 1, 1, 8})
		if dt == ref.DTypeFP32 {
			checkDTypeLogits(t, "random weights against fp32", dt, got, want, c.VocabSize)
			continue
		}
		// The tiny random config's picks are nearer ties than the goldens' (a bf16 rounding
		// moves the median row by 1%, int8's by 6%): the bound is the goldens' test's.
		diff, _ := runnertest.MaxAbsDiff(got, want)
		med, agree := rowStats(got, want, c.VocabSize)
		t.Logf("%s random weights against fp32: max |Δ| %.3g, median row %.3g, argmax agrees %.3f", dt, diff, med, agree)
		if math.IsNaN(diff) || agree < 0.5 {
			t.Errorf("%s: logits far from fp32's: max |Δ| %.3g, argmax agrees %.3f", dt, diff, agree)
		}
	}
	if _, err := NewModelDType(c, RandomWeights(c, 7, false), 512, "fp4"); err == nil {
		t.Error("dtype fp4: no error")
	}
}

// TestRunnerConformanceDTypes runs the suite with the projections in bf16, int8 and fp8
// (quantised at load):
// batching, chunking and paging must not change what either computes.
func TestRunnerConformanceDTypes(t *testing.T) {
	for _, dt := range []ref.DType{ref.DTypeBF16, ref.DTypeInt8, ref.DTypeFP8} {
		t.Run(string(dt), func(t *testing.T) {
			runnertest.Run(t, func(t testing.TB) (engine.Runner, *kvslab.Pool) {
				c := tinyConfig(t)
				m, err := NewModelDType(c, RandomWeights(c, 7, false), 512, dt)
				if err != nil {
					t.Fatal(err)
				}
				m.dropFP32()
				r := NewRunner(m, 8)
				pool, err := r.NewPool(8 << 20)
				if err != nil {
					t.Fatal(err)
				}
				return r, pool
			}, runnertest.Options{})
		})
	}
}

// rowStats is the median over rows of the largest |got − want| in the row, and the
// fraction of rows whose argmax agrees.
func rowStats(got, want []float32, vocab int) (median float64, agree float64) {
	rows := len(want) / vocab
	diffs := make([]float64, rows)
	same := 0
	for r := range rows {
		g, w := got[r*vocab:(r+1)*vocab], want[r*vocab:(r+1)*vocab]
		d, _ := runnertest.MaxAbsDiff(g, w)
		diffs[r] = d
		if argmax(g) == argmax(w) {
			same++
		}
	}
	slices.Sort(diffs)
	return diffs[rows/2], float64(same) / float64(rows)
}

// TestDTypeRefusedSplit: the DP-attention ranks and the MTP runner run fp32; asking them
// for another dtype is an error naming it, not a silent fp32 run.
func TestDTypeRefusedSplit(t *testing.T) {
	if _, _, err := OpenDPRanks(".", Options{DType: ref.DTypeInt8}, DispatchGather, nil, 0); err == nil || !strings.Contains(err.Error(), "int8") {
		t.Errorf("OpenDPRanks with int8: error %v, want one naming int8", err)
	}
	if _, err := Load(".", Options{DType: ref.DTypeBF16, Drafts: 1}); err == nil || !strings.Contains(err.Error(), "bf16") {
		t.Errorf("Load with bf16 and drafts: error %v, want one naming bf16", err)
	}
}
