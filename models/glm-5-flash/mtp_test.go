package glm5flash

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/runnertest"
	"github.com/resin-llm/resin/core/weights"
)

// readMTPGolden reads a parity case's MTP logits ([T-1, vocab]: row p from the final hidden
// state at p and the token at p+1), written by scripts/glm5-goldens.sh.
func readMTPGolden(t testing.TB, dir string, rows, vocab int) []float32 {
	t.Helper()
	f, err := weights.OpenFile(filepath.Join(dir, "logits.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	v, shape, err := f.Float32("mtp_logits")
	if err != nil {
		t.Fatalf("%s: %v (regenerate the goldens with `%s`)", dir, err, glmParityCommand)
	}
	if len(shape) != 2 || shape[0] != rows || shape[1] != vocab {
		t.Fatalf("mtp_logits of shape %v, want [%d %d]", shape, rows, vocab)
	}
	return v
}

// mtpSplits runs the MTP layer over rows 0..len(next)-1 of one sequence in pieces of the
// given lengths (cycled), each row reading hidden[p] and next[p].
func mtpSplits(t *testing.T, m *TextModel, hidden []float32, next []int32, sizes ...int) []float32 {
	t.Helper()
	D := m.Config.HiddenSize
	st := m.NewMTPState()
	var out []float32
	for p, j := 0, 0; p < len(next); j++ {
		n := min(sizes[j%len(sizes)], len(next)-p)
		lg, _, err := m.MTPForward([]MTPChunk{{State: st, Pos0: p, Hidden: hidden[p*D : (p+n)*D], Next: next[p : p+n]}})
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, lg...)
		p += n
	}
	return out
}

// TestMTPParity checks the MTP layer against the goldens' MTP logits (the layer run in
// float64 by scripts/glm5-goldens.sh with transformers' attention and MoE modules, on
// transformers' last_hidden_state): one-shot, in uneven chunks and row by row, within
// glmParityTol; the module case shares lm_head, the checkpoint case has its own
// shared_head.head and its MTP layer under model.layers.{n}.
func TestMTPParity(t *testing.T) {
	for _, dir := range glmParityCases(t) {
		m, err := LoadTextModel(dir)
		if err != nil {
			t.Fatal(err)
		}
		if !m.HasMTP() {
			t.Fatalf("%s: no MTP layer loaded", dir)
		}
		V, D := m.Config.VocabSize, m.Config.HiddenSize
		toks, _ := readGLMGolden(t, dir, V)
		want := readMTPGolden(t, dir, len(toks)-1, V)
		_, hidden, err := m.ForwardHidden([]TextChunk{{State: m.NewTextState(), Tokens: toks}})
		if err != nil {
			t.Fatal(err)
		}
		hidden = hidden[:(len(toks)-1)*D]
		// The MTP layer's own indexer and router cut on the golden's data too.
		checkTopKMargins(t, func() { mtpSplits(t, m, hidden, toks[1:], len(toks)-1) }, "indexer", "router")
		for _, sizes := range [][]int{{len(toks)}, {13, 27, 3, 1, 1}, {1}} {
			got := mtpSplits(t, m, hidden, toks[1:], sizes...)
			d, at := runnertest.MaxAbsDiff(got, want)
			if !(d <= glmParityTol) {
				t.Errorf("%s, pieces %v: max |Δ| %g at row %d", filepath.Base(dir), sizes, d, at/V)
			}
			t.Logf("%s, pieces %v: MTP logits max |Δ| %.3g", filepath.Base(dir), sizes, d)
		}
	}
}

// TestMTPWeightsMoveMTPLogits shifts one MTP tensor of each kind and checks the MTP logits
// move by more than the parity tolerance (a port ignoring it would fail TestMTPParity), and
// that the main logits do not move (the MTP layer is not part of the main model).
func TestMTPWeightsMoveMTPLogits(t *testing.T) {
	for _, c := range []string{"module", "checkpoint"} {
		src := filepath.Join("testdata", "parity", c)
		ts, cfg := goldenTensors(t, src)
		base, err := LoadTextModel(src)
		if err != nil {
			t.Fatal(err)
		}
		n := base.Config.NumHiddenLayers
		toks, _ := readGLMGolden(t, src, base.Config.VocabSize)
		toks = toks[:40]
		run := func(m *TextModel) ([]float32, []float32) {
			logits, hidden, err := m.ForwardHidden([]TextChunk{{State: m.NewTextState(), Tokens: toks}})
			if err != nil {
				t.Fatal(err)
			}
			D := m.Config.HiddenSize
			return logits, mtpSplits(t, m, hidden[:(len(toks)-1)*D], toks[1:], len(toks))
		}
		wantMain, wantMTP := run(base)
		seen := map[string]bool{}
		for name, x := range ts {
			if !mtpTensor(name, n) || ignoredTensor(name, n) {
				continue
			}
			kind := name[strings.Index(name, ".layers.")+len(".layers."):]
			kind = kind[strings.IndexByte(kind, '.')+1:]
			if i := strings.Index(kind, "experts."); i >= 0 && strings.Contains(kind[i:], ".weight") && !strings.Contains(kind, "shared_experts") {
				kind = "experts"
			}
			if seen[kind] {
				continue
			}
			seen[kind] = true
			v, _ := decodeF32(x)
			v = append(v[1:], v[0])
			y, _ := weights.NewTensor(name, weights.F32, x.Shape, v)
			mod := map[string]weights.Tensor{}
			for k, z := range ts {
				mod[k] = z
			}
			mod[name] = y
			m, err := LoadTextModel(writeCheckpoint(t, mod, cfg))
			if err != nil {
				t.Fatal(err)
			}
			gotMain, gotMTP := run(m)
			if d, _ := runnertest.MaxAbsDiff(gotMain, wantMain); d != 0 {
				t.Errorf("%s: shifting it moves the main logits by %g", name, d)
			}
			if d, _ := runnertest.MaxAbsDiff(gotMTP, wantMTP); d < 10*glmParityTol {
				t.Errorf("%s: shifting it moves the MTP logits by only %g", name, d)
			}
		}
		if len(seen) < 20 {
			t.Errorf("%s: only %d MTP tensor kinds checked: %v", c, len(seen), seen)
		}
	}
}
