package llama

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kernels/ref"
	"github.com/resin-llm/resin/core/runnertest"
	"github.com/resin-llm/resin/core/weights"
)

// parityTol is the largest |logit − transformers' logit| the parity test accepts.
const parityTol = 1e-4

// parityDTypeTol is, for projections in bf16 and int8 (ref.DType), the largest |logit −
// transformers' fp32 logit| the parity test accepts, as a fraction of the largest
// |logit|: what rounding each weight to 8 bits of mantissa (bf16), or each weight and
// activation to its block's 8-bit grid (int8), makes of the goldens' random models.
var parityDTypeTol = map[ref.DType]float64{ref.DTypeBF16: 0.01, ref.DTypeInt8: 0.05}

// parityCommand makes goldens for TestTransformersParity from this model's config.json,
// run from the repository root (see the script's --help for real checkpoints).
const parityCommand = "scripts/transformers-goldens.sh models/llama"

// TestTransformersParity loads each checkpoint of testdata/parity/<case> through the real
// loader (LoadConfig, weights.Open, LoadWeights) and checks the paged forward's logits at
// every position against the ones transformers computed for the same tokens
// (logits.safetensors), within parityTol: once as one prefill, once in chunks that cross
// pages and end in one-token decode steps. A case holding a `checkpoint` file instead of
// config.json reads the checkpoint directory it names, and is skipped where that is absent.
func TestTransformersParity(t *testing.T) {
	goldens, _ := filepath.Glob(filepath.Join("testdata", "parity", "*", "logits.safetensors"))
	if len(goldens) == 0 {
		t.Skipf("no transformers goldens in testdata/parity: make them with `%s`", parityCommand)
	}
	for _, golden := range goldens {
		dir := filepath.Dir(golden)
		t.Run(filepath.Base(dir), func(t *testing.T) {
			ckDir := dir
			if b, err := os.ReadFile(filepath.Join(dir, "checkpoint")); err == nil {
				ckDir = strings.TrimSpace(string(b))
				if _, err := os.Stat(ckDir); err != nil {
					t.Skipf("the checkpoint %s is not on this machine: %v", ckDir, err)
				}
			}
			m := loadParityModel(t, ckDir, ref.DTypeFP32)
			toks, want := readParityGolden(t, golden, m.Config.VocabSize)
			n := len(toks)
			for _, chunks := range [][]int{{n}, decodeChunks(n)} {
				got := parityLogits(t, m, toks, chunks)
				diff, at := runnertest.MaxAbsDiff(got, want)
				t.Logf("max |logit − transformers| = %.3g at position %d, vocab %d (prefill chunks %v)",
					diff, at/m.Config.VocabSize, at%m.Config.VocabSize, chunks)
				if !(diff <= parityTol) {
					t.Errorf("logits differ from transformers' by %.3g > %g at position %d, vocab %d (prefill chunks %v)",
						diff, parityTol, at/m.Config.VocabSize, at%m.Config.VocabSize, chunks)
				}
			}
			var scale float64
			for _, v := range want {
				scale = max(scale, math.Abs(float64(v)))
			}
			for _, dt := range []ref.DType{ref.DTypeBF16, ref.DTypeInt8} {
				t.Run(string(dt), func(t *testing.T) {
					m := loadParityModel(t, ckDir, dt)
					for _, chunks := range [][]int{{n}, decodeChunks(n)} {
						diff, at := runnertest.MaxAbsDiff(parityLogits(t, m, toks, chunks), want)
						t.Logf("max |logit − transformers| = %.3g (%.2g of the largest |logit| %.3g) at position %d (prefill chunks %v)",
							diff, diff/scale, scale, at/m.Config.VocabSize, chunks)
						if tol := parityDTypeTol[dt] * scale; !(diff <= tol) {
							t.Errorf("logits differ from transformers' by %.3g > %.3g at position %d, vocab %d (prefill chunks %v)",
								diff, tol, at/m.Config.VocabSize, at%m.Config.VocabSize, chunks)
						}
					}
				})
			}
		})
	}
}

// loadParityModel loads dir's checkpoint as Load does, for the whole golden sequence, with
// the projections in dt.
func loadParityModel(t *testing.T, dir string, dt ref.DType) *Model {
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
	m, err := NewModelDType(c, w, 1024, dt)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// decodeChunks splits n tokens into a prefill of a third, two uneven chunks, then decode
// steps of one token.
func decodeChunks(n int) []int {
	var chunks []int
	for _, c := range []int{n / 3, 5, 3} {
		if c > 0 && c < n {
			chunks = append(chunks, c)
			n -= c
		}
	}
	for ; n > 0; n-- {
		chunks = append(chunks, 1)
	}
	return chunks
}

// parityLogits runs toks through the paged forward in the given chunks, with 4-token
// pages, and returns the logits of every position ([len(toks), vocab]).
func parityLogits(t *testing.T, m *Model, toks []int32, chunks []int) []float32 {
	t.Helper()
	c := m.Config
	pool, err := engine.NewHostPool(CacheGroups(c, 4), 8<<20)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := NewKVCache(c, pool)
	if err != nil {
		t.Fatal(err)
	}
	seq := runnertest.OpenSeq(t, pool, toks)
	var out []float32
	for _, n := range chunks {
		p := runnertest.Plan(t, pool, []*runnertest.Seq{seq}, []int{n}, true)
		logits := make([]float32, len(p.LogitsIndices)*c.VocabSize)
		if err := m.Forward(p, kv, logits); err != nil {
			t.Fatal(err)
		}
		out = append(out, logits...)
	}
	return out
}

// readParityGolden reads logits.safetensors: token_ids (I32 or I64, [T]) and logits (F32,
// [T, vocab]).
func readParityGolden(t *testing.T, path string, vocab int) ([]int32, []float32) {
	t.Helper()
	f, err := weights.OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	info, raw, err := f.ReadRaw("token_ids")
	if err != nil {
		t.Fatal(err)
	}
	toks, err := weights.DecodeIDs(info.DType, raw)
	if err != nil {
		t.Fatalf("%s: token_ids: %v", path, err)
	}
	logits, shape, err := f.Float32("logits")
	if err != nil {
		t.Fatal(err)
	}
	if len(shape) != 2 || shape[0] != len(toks) || shape[1] != vocab {
		t.Fatalf("%s: logits of shape %v, want [%d %d]", path, shape, len(toks), vocab)
	}
	return toks, logits
}
