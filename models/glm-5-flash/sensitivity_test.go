package glm5flash

import (
	"path/filepath"
	"slices"
	"testing"

	"github.com/resin-llm/resin/core/runnertest"
)

// TestParityCatchesIgnoredWeights resets each tensor of a golden checkpoint, one at a
// time, to what a port that never loaded it would hold (norm weights and scales 1;
// biases, sinks, position biases, projections and tid2eid 0) and checks that the logits
// (the MTP head's for mtp.* tensors) then miss transformers' by far more than parityTol:
// the goldens leave no weight unchecked.
func TestParityCatchesIgnoredWeights(t *testing.T) {
	if testing.Short() {
		t.Skip("one forward per tensor")
	}
	goldens, _ := filepath.Glob(filepath.Join("testdata", "parity", "*", "logits.safetensors"))
	if len(goldens) == 0 {
		t.Skipf("no goldens in testdata/parity: make them with `%s`", parityCommand)
	}
	for _, golden := range goldens {
		dir := filepath.Dir(golden)
		t.Run(filepath.Base(dir), func(t *testing.T) {
			m := loadParityModel(t, dir)
			toks, want, wantMTP := readParityGolden(t, golden, m.Config.VocabSize)
			_, streams := runChunks(t, m, toks, []int{len(toks)})
			weakest, weakestName := 1e9, ""
			ps := params(m.Config, m.W, m.W.MTP != nil)
			for _, p := range ps {
				mtp := len(p.names[0]) > 4 && p.names[0][:4] == "mtp."
				var restore func()
				if p.ints != nil {
					old := *p.ints
					*p.ints = make([]int32, len(old))
					restore = func() { *p.ints = old }
				} else {
					old := *p.dst
					v := make([]float32, len(old))
					if p.kind == initNorm || p.kind == initScale {
						for i := range v {
							v[i] = 1
						}
					}
					*p.dst = v
					if m.Config.TieWordEmbeddings && slices.Equal(p.shape, []int{m.Config.VocabSize, m.Config.HiddenSize}) && p.names[0] == "model.embed_tokens.weight" {
						m.W.Head = v
						restore = func() { *p.dst = old; m.W.Head = old }
					} else {
						restore = func() { *p.dst = old }
					}
				}
				var diff float64
				if mtp {
					st := m.NewSeqState()
					row := m.Config.HCMult * m.Config.HiddenSize
					got, err := m.MTPForward(st, streams[:(len(toks)-1)*row], toks[1:])
					if err != nil {
						t.Fatal(err)
					}
					diff, _ = runnertest.MaxAbsDiff(got, wantMTP)
				} else {
					got, _ := runChunks(t, m, toks, []int{len(toks)})
					diff, _ = runnertest.MaxAbsDiff(got, want)
				}
				restore()
				if diff < weakest {
					weakest, weakestName = diff, p.names[0]
				}
				if !(diff > 10*parityTol) {
					t.Errorf("%s reset to its init moves the logits by only %.3g: the parity test would not notice it ignored", p.names[0], diff)
				}
			}
			t.Logf("%d tensors; the least sensitive, %s, moves the logits by %.3g", len(ps), weakestName, weakest)
		})
	}
}
