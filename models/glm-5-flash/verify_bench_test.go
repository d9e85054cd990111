package glm5flash

import (
	"path/filepath"
	"testing"
	"time"
)

// BenchmarkVerifyVsDecode measures, in the same iterations, a 4-token verification step
// (one token and 3 drafts, its KDA layers token by token keeping each state as the
// drafting runner does) and 4 single-token decodes of the same tokens from the same
// state, on the "module" golden after its first 196 tokens. It reports both per
// iteration (verify-µs, 4decode-µs) and their ratio (verify/4decode): below 1 a verify
// costs less than the decodes it replaces. Alternating the two inside one iteration puts
// them under the same machine load.
func BenchmarkVerifyVsDecode(b *testing.B) {
	dir := filepath.Join("testdata", "parity", "module")
	m, err := LoadTextModel(dir)
	if err != nil {
		b.Skip(err)
	}
	toks, _ := readGLMGolden(b, dir, m.Config.VocabSize)
	const n = 4
	pre := m.NewTextState()
	if _, err := m.Forward(pre, toks[:len(toks)-n]); err != nil {
		b.Fatal(err)
	}
	feed := toks[len(toks)-n:]
	var verify, decode time.Duration
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		st := pre.clone()
		keepDraftStates(st, n-1)
		b.StartTimer()
		start := time.Now()
		if _, err := m.ForwardRows(st, feed, []int{0, 1, 2, 3}); err != nil {
			b.Fatal(err)
		}
		verify += time.Since(start)
		b.StopTimer()
		st = pre.clone()
		b.StartTimer()
		start = time.Now()
		for i := range n {
			if _, err := m.ForwardRows(st, feed[i:i+1], []int{0}); err != nil {
				b.Fatal(err)
			}
		}
		decode += time.Since(start)
	}
	b.ReportMetric(float64(verify.Microseconds())/float64(b.N), "verify-µs")
	b.ReportMetric(float64(decode.Microseconds())/float64(b.N), "4decode-µs")
	b.ReportMetric(float64(verify)/float64(decode), "verify/4decode")
}

// keepDraftStates makes every KDA layer of st run token by token and copy its conv and
// recurrent state after each of the first drafts tokens, as the drafting runner keeps
// them to restore on a rejection.
func keepDraftStates(st *TextState, drafts int) {
	for i := range st.Layers {
		ls := &st.Layers[i]
		if ls.Conv == nil {
			continue
		}
		per := len(ls.Conv) + len(ls.Recurrent)
		kept := make([]float32, drafts*per)
		ls.AfterToken = func(t int) {
			if t < drafts {
				copy(kept[t*per:], ls.Conv)
				copy(kept[t*per+len(ls.Conv):], ls.Recurrent)
			}
		}
	}
}
