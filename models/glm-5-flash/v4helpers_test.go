package glm5flash

import "testing"

// Helpers of the scaffolded DeepSeek-V4 tests that remain until the GLM runner replaces them.

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
func ones(n int) []int {
	c := make([]int, n)
	for i := range c {
		c[i] = 1
	}
	return c
}
