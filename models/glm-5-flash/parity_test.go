package glm5flash

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/resin-llm/resin/core/runnertest"
	"github.com/resin-llm/resin/core/weights"
)

// glmParityCommand makes testdata/parity, run from the repository root.
const glmParityCommand = "scripts/glm5-goldens.sh"

// glmParityTol is the largest |Δlogit| accepted against transformers (fp32).
const glmParityTol = 1e-4

func glmParityCases(t *testing.T) []string {
	dirs, _ := filepath.Glob(filepath.Join("testdata", "parity", "*", "logits.safetensors"))
	if len(dirs) == 0 {
		t.Skipf("no goldens in testdata/parity: make them with `%s`", glmParityCommand)
	}
	var out []string
	for _, d := range dirs {
		out = append(out, filepath.Dir(d))
	}
	return out
}

func readGLMGolden(t testing.TB, dir string, vocab int) ([]int32, []float32) {
	t.Helper()
	f, err := weights.OpenFile(filepath.Join(dir, "logits.safetensors"))
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
		t.Fatal(err)
	}
	logits, shape, err := f.Float32("logits")
	if err != nil {
		t.Fatal(err)
	}
	if len(shape) != 2 || shape[0] != len(toks) || shape[1] != vocab {
		t.Fatalf("logits of shape %v, want [%d %d]", shape, len(toks), vocab)
	}
	return toks, logits
}

// runSplits feeds toks through one state in pieces of the given lengths (cycled).
func runSplits(t *testing.T, m *TextModel, toks []int32, sizes ...int) []float32 {
	t.Helper()
	st := m.NewTextState()
	var out []float32
	for i, j := 0, 0; i < len(toks); j++ {
		n := min(sizes[j%len(sizes)], len(toks)-i)
		l, err := m.Forward(st, toks[i:i+n])
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, l...)
		i += n
	}
	return out
}

// minTopKMargin is the smallest score gap allowed at a top-k cut of a golden's run: below
// it the order transformers' torch.topk picks is implementation-defined (an indexer whose
// ReLUs are all zero scores every pool 0), so a golden could hide or fake a difference.
const minTopKMargin = 1e-5

// checkTopKMargins runs fn with topKMargin recording the smallest gap at each kind of top-k
// cut, and fails the test when one is under minTopKMargin or a kind in want never cut
// (the run then did not exercise that selection).
func checkTopKMargins(t *testing.T, fn func(), want ...string) {
	t.Helper()
	margins := map[string]float32{}
	topKMargin = func(kind string, gap float32) {
		if g, ok := margins[kind]; !ok || gap < g {
			margins[kind] = gap
		}
	}
	defer func() { topKMargin = nil }()
	fn()
	for _, kind := range want {
		if _, ok := margins[kind]; !ok {
			t.Errorf("no %s top-k cut was made: the case does not exercise the selection", kind)
		}
	}
	for kind, g := range margins {
		t.Logf("smallest %s top-k margin %.3g", kind, g)
		if !(g >= minTopKMargin) {
			t.Errorf("%s top-k margin %g < %g: a tie at the cut makes the golden ill-defined (re-seed the case)", kind, g, minTopKMargin)
		}
	}
}

// TestTransformersParity checks every position's logits against transformers 5.23.0 for
// each golden case (both tensor name forms), run one-shot, in chunks that split pools and
// KDA chunks at odd places, and token by token (the step forms).
func TestTransformersParity(t *testing.T) {
	for _, dir := range glmParityCases(t) {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			m, err := LoadTextModel(dir)
			if err != nil {
				t.Fatal(err)
			}
			toks, want := readGLMGolden(t, dir, m.Config.VocabSize)
			checkTopKMargins(t, func() { runSplits(t, m, toks, len(toks)) }, "indexer", "router")
			for _, split := range []struct {
				name  string
				sizes []int
			}{{"one-shot", []int{len(toks)}}, {"chunked-7-33-1", []int{7, 33, 1}}, {"chunked-16", []int{16}}, {"token-by-token", []int{1}}} {
				got := runSplits(t, m, toks, split.sizes...)
				d, at := runnertest.MaxAbsDiff(got, want)
				t.Logf("%s: max |Δ| %.3g at row %d", split.name, d, at/m.Config.VocabSize)
				if !(d <= glmParityTol) {
					t.Errorf("%s: max |Δ| %g at row %d exceeds %g", split.name, d, at/m.Config.VocabSize, glmParityTol)
				}
			}
		})
	}
}

// TestMixedBatchStates runs two copies of a golden sequence in the same batches, one
// prefilling 13 tokens a step while the other decodes one, and checks both against
// transformers.
func TestMixedBatchStates(t *testing.T) {
	dir := filepath.Join("testdata", "parity", "module")
	if _, err := os.Stat(dir); err != nil {
		t.Skipf("no golden %s: make it with `%s`", dir, glmParityCommand)
	}
	m, err := LoadTextModel(dir)
	if err != nil {
		t.Fatal(err)
	}
	toks, want := readGLMGolden(t, dir, m.Config.VocabSize)
	V := m.Config.VocabSize
	a, b := m.NewTextState(), m.NewTextState()
	var gotA, gotB []float32
	ia, ib := 0, 0
	for ia < len(toks) || ib < len(toks) {
		// One batch: sequence a prefills 13 tokens, sequence b decodes one.
		na, nb := min(13, len(toks)-ia), min(1, len(toks)-ib)
		out, err := m.ForwardBatch([]TextChunk{{State: a, Tokens: toks[ia : ia+na]}, {State: b, Tokens: toks[ib : ib+nb]}})
		if err != nil {
			t.Fatal(err)
		}
		gotA, gotB = append(gotA, out[:na*V]...), append(gotB, out[na*V:]...)
		ia, ib = ia+na, ib+nb
	}
	for name, got := range map[string][]float32{"prefilling": gotA, "decoding": gotB} {
		if d, at := runnertest.MaxAbsDiff(got, want); !(d <= glmParityTol) {
			t.Errorf("%s sequence: max |Δ| %g at row %d", name, d, at/V)
		}
	}
}
