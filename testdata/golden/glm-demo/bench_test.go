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

// BenchmarkTextVerify feeds the last 4 golden tokens after the rest (a verify step of one
// token and 3 drafts), its KDA layers token by token keeping each state as the drafting
// runner does: compare with 4 × BenchmarkTextDecode.
func BenchmarkTextVerify(b *testing.B) {
	dir := filepath.Join("testdata", "parity", "module")
	m, err := LoadTextModel(dir)
	if err != nil {
		b.Skip(err)
	}
	toks, _ := readGLMGolden(b, dir, m.Config.VocabSize)
	pre := m.NewTextState()
	if _, err := m.Forward(pre, toks[:len(toks)-4]); err != nil {
		b.Fatal(err)
	}
	feed := toks[len(toks)-4:]
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		st := pre.clone()
		for i := range st.Layers {
			if ls := &st.Layers[i]; ls.Conv != nil {
				kept := make([]float32, 3*(len(ls.Conv)+len(ls.Recurrent)))
				ls.AfterToken = func(t int) {
					if t < 3 {
						copy(kept[t*(len(ls.Conv)+len(ls.Recurrent)):], ls.Conv)
						copy(kept[t*(len(ls.Conv)+len(ls.Recurrent))+len(ls.Conv):], ls.Recurrent)
					}
				}
			}
		}
		b.StartTimer()
		if _, err := m.ForwardRows(st, feed, []int{0, 1, 2, 3}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkMTPDraft runs the MTP layer over one row after the golden's first 198 (the
// cost of one draft).
func BenchmarkMTPDraft(b *testing.B) {
	dir := filepath.Join("testdata", "parity", "module")
	m, err := LoadTextModel(dir)
	if err != nil {
		b.Skip(err)
	}
	toks, _ := readGLMGolden(b, dir, m.Config.VocabSize)
	_, hidden, err := m.ForwardHidden([]TextChunk{{State: m.NewTextState(), Tokens: toks}})
	if err != nil {
		b.Fatal(err)
	}
	D, n := m.Config.HiddenSize, len(toks)-2
	pre := m.NewMTPState()
	if _, _, err := m.MTPForward([]MTPChunk{{State: pre, Hidden: hidden[:n*D], Next: toks[1 : n+1], Rows: []int{}}}); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		one := &TextState{Layers: []TextLayerState{*pre}}
		st := &one.clone().Layers[0]
		b.StartTimer()
		if _, _, err := m.MTPForward([]MTPChunk{{State: st, Pos0: n, Hidden: hidden[n*D : (n+1)*D], Next: toks[n+1 : n+2]}}); err != nil {
			b.Fatal(err)
		}
	}
}
