package glm5flash

import (
	"fmt"
	"math"
	"path/filepath"
	"testing"

	"github.com/resin-llm/resin/core/runnertest"
	"github.com/resin-llm/resin/core/weights"
)

// parityTol is the largest |logit − transformers' logit| the parity test accepts (fp32).
const parityTol = 1e-4

// parityCommand makes the goldens of TestTransformersParity, run from the repository root.
const parityCommand = "scripts/deepseek-v4-goldens.sh"

// TestTransformersParity loads each checkpoint of testdata/parity/<case> (the three tensor
// name forms across cases) through the real loader and checks the logits of every position
// against transformers 5.23.0's, within parityTol: as one prefill, in chunks that close
// compression windows inside and between chunks, token by token, and as a batch of two
// sequences at different lengths. It also checks the MTP head's logits against the
// script's reference.
func TestTransformersParity(t *testing.T) {
	goldens, _ := filepath.Glob(filepath.Join("testdata", "parity", "*", "logits.safetensors"))
	if len(goldens) == 0 {
		t.Skipf("no goldens in testdata/parity: make them with `%s`", parityCommand)
	}
	for _, golden := range goldens {
		dir := filepath.Dir(golden)
		t.Run(filepath.Base(dir), func(t *testing.T) {
			m := loadParityModel(t, dir)
			toks, want, wantMTP := readParityGolden(t, golden, m.Config.VocabSize)
			n := len(toks)
			check := func(what string, got, want []float32) {
				t.Helper()
				diff, at := runnertest.MaxAbsDiff(got, want)
				t.Logf("%-44s max |Δ| = %.3g (position %d)", what, diff, at/m.Config.VocabSize)
				if !(diff <= parityTol) {
					t.Errorf("%s: logits differ from the reference by %.3g > %g at position %d, vocab %d",
						what, diff, parityTol, at/m.Config.VocabSize, at%m.Config.VocabSize)
				}
			}
			m.MinTopKMargin = math.Inf(1)
			for _, chunks := range [][]int{{n}, {3, 4, 5, 6, 7, 33, 1, 1, 2, 61, 77}, {n / 2, n - n/2}, ones(n)} {
				got, _ := runChunks(t, m, toks, chunks)
				check(fmt.Sprintf("chunks %s", chunkLabel(chunks)), got, want)
			}
			// A batch of two sequences at different lengths: the golden sequence in chunks
			// next to a second one (its first 37 tokens, replayed) that starts later.
			a, b := m.NewSeqState(), m.NewSeqState()
			var gotA []float32
			plan := [][2]int{{13, 0}, {20, 9}, {1, 11}, {50, 17}, {116, 0}}
			at, atB := 0, 0
			for _, p := range plan {
				chunks := []Chunk{{State: a, Tokens: toks[at : at+p[0]]}}
				if p[1] > 0 {
					chunks = append(chunks, Chunk{State: b, Tokens: toks[atB : atB+p[1]]})
				}
				logits, _, err := m.Forward(chunks)
				if err != nil {
					t.Fatal(err)
				}
				gotA = append(gotA, logits[:p[0]*m.Config.VocabSize]...)
				if p[1] > 0 {
					v := m.Config.VocabSize
					check(fmt.Sprintf("batch: second sequence %d..%d", atB, atB+p[1]), logits[p[0]*v:], want[atB*v:(atB+p[1])*v])
				}
				at, atB = at+p[0], atB+p[1]
			}
			check("batch of two: first sequence", gotA, want[:at*m.Config.VocabSize])
			t.Logf("smallest indexer top-k margin: %.3g", m.MinTopKMargin)
			if m.MinTopKMargin < 1e-5 {
				t.Errorf("indexer top-k margin %.3g < 1e-5: a tie at the cut makes the reference ill-defined", m.MinTopKMargin)
			}
			if wantMTP != nil {
				if m.W.MTP == nil {
					t.Fatal("the golden has MTP logits but the checkpoint loaded no MTP head")
				}
				for _, chunks := range [][]int{{n}, {7, 29, 1, 100, 63}} {
					check(fmt.Sprintf("MTP head, chunks %s", chunkLabel(chunks)), runMTP(t, m, toks, chunks), wantMTP)
				}
			}
		})
	}
}

func ones(n int) []int {
	c := make([]int, n)
	for i := range c {
		c[i] = 1
	}
	return c
}

func chunkLabel(c []int) string {
	if len(c) > 12 {
		return fmt.Sprintf("%d chunks of 1", len(c))
	}
	return fmt.Sprint(c)
}

// runChunks feeds toks to a fresh sequence in the given chunks and returns the logits and
// final streams of every position.
func runChunks(t *testing.T, m *Model, toks []int32, chunks []int) (logits, streams []float32) {
	t.Helper()
	st := m.NewSeqState()
	at := 0
	for _, n := range chunks {
		l, s, err := m.Forward([]Chunk{{State: st, Tokens: toks[at : at+n]}})
		if err != nil {
			t.Fatal(err)
		}
		logits, streams = append(logits, l...), append(streams, s...)
		at += n
	}
	if at != len(toks) {
		t.Fatalf("chunks cover %d of %d tokens", at, len(toks))
	}
	return logits, streams
}

// runMTP runs the main model over toks, then the MTP head over positions 0..T−2 (row t:
// streams at t and token t+1) in the given chunks (whose sum is T).
func runMTP(t *testing.T, m *Model, toks []int32, chunks []int) []float32 {
	t.Helper()
	_, streams := runChunks(t, m, toks, []int{len(toks)})
	st := m.NewSeqState()
	row := m.Config.HCMult * m.Config.HiddenSize
	var out []float32
	at := 0
	for _, n := range chunks {
		n = min(n, len(toks)-1-at)
		if n <= 0 {
			break
		}
		l, err := m.MTPForward(st, streams[at*row:(at+n)*row], toks[at+1:at+1+n])
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, l...)
		at += n
	}
	return out
}

// loadParityModel loads dir's checkpoint as Load does.
func loadParityModel(t *testing.T, dir string) *Model {
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
	m, err := NewModel(c, w, 4096)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// readParityGolden reads logits.safetensors: token_ids (I32 or I64, [T]), logits (F32,
// [T, vocab]) and, when present, mtp_logits (F32, [T−1, vocab]).
func readParityGolden(t *testing.T, path string, vocab int) ([]int32, []float32, []float32) {
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
	var mtp []float32
	if _, ok := f.Info("mtp_logits"); ok {
		if mtp, shape, err = f.Float32("mtp_logits"); err != nil {
			t.Fatal(err)
		}
		if len(shape) != 2 || shape[0] != len(toks)-1 || shape[1] != vocab {
			t.Fatalf("%s: mtp_logits of shape %v, want [%d %d]", path, shape, len(toks)-1, vocab)
		}
	}
	return toks, logits, mtp
}
