package glmdemo

import (
	"path/filepath"
	"testing"
)

// BenchmarkTextPrefill runs the "module" golden (200 tokens) one-shot; with
// -cpuprofile it gives the GEMM share of a prefill.
func BenchmarkTextPrefill(b *testing.B) {
	benchText(b, 0)
}

// BenchmarkTextDecode decodes one token after the golden's 199-token prefix.
func BenchmarkTextDecode(b *testing.B) {
	benchText(b, 1)
}

func benchText(b *testing.B, decode int) {
	dir := filepath.Join("testdata", "parity", "module")
	m, err := LoadTextModel(dir)
	if err != nil {
		b.Skip(err)
	}
	toks, _ := readGLMGolden(b, dir, m.Config.VocabSize)
	pre := m.NewTextState()
	if decode > 0 {
		if _, err := m.Forward(pre, toks[:len(toks)-decode]); err != nil {
			b.Fatal(err)
		}
	}
	feed := toks
	if decode > 0 {
		feed = toks[len(toks)-decode:]
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		st := pre.clone() // the state's copy is setup, not the step
		b.StartTimer()
		if _, err := m.ForwardRows(st, feed, []int{len(feed) - 1}); err != nil {
			b.Fatal(err)
		}
	}
}

// clone deep-copies a state made by NewTextState.
func (s *TextState) clone() *TextState {
	out := &TextState{Len: s.Len, BlockTokens: s.BlockTokens, Layers: make([]TextLayerState, len(s.Layers))}
	cp := func(r Rows) Rows {
		if g, ok := r.(*growRows); ok {
			return &growRows{dim: g.dim, data: append([]float32(nil), g.data...)}
		}
		return r
	}
	for i, l := range s.Layers {
		out.Layers[i] = TextLayerState{Conv: append([]float32(nil), l.Conv...), Recurrent: append([]float32(nil), l.Recurrent...),
			Latent: cp(l.Latent), IdxKey: cp(l.IdxKey), IdxGate: cp(l.IdxGate), Pools: cp(l.Pools)}
	}
	return out
}
