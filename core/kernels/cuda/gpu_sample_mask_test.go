//go:build gpu

package cuda

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/engine"
)

// TestGPUSampleTokenMasks is TestEmuSampleTokenMasks on the device, up to Qwen's
// vocabulary: masked rows (one token allowed, only EOS, a sparse mask, all allowed) give
// engine.Sampler's masked choice, greedy and seeded, and an unmasked row in the batch is
// what a launch without masks gives it.
func TestGPUSampleTokenMasks(t *testing.T) {
	d, k := openKernels(t)
	for _, vocab := range []int{1000, 3001, 151936} {
		words := MaskWords(vocab)
		r := rand.New(rand.NewPCG(uint64(vocab), 3))
		only := func(toks ...int) []uint32 {
			m := make([]uint32, words)
			for _, tok := range toks {
				m[tok/32] |= 1 << (tok % 32)
			}
			return m
		}
		sparse := make([]uint32, words)
		for i := range sparse {
			sparse[i] = r.Uint32() & r.Uint32() & r.Uint32()
		}
		all := make([]uint32, words)
		for i := range all {
			all[i] = ^uint32(0)
		}
		var params []SampleParams
		var masks [][]uint32
		for seed := range uint64(3) {
			pos := int32(50 + seed)
			for _, p := range []SampleParams{{Temperature: 0, Seed: seed, Pos: pos, Logprobs: 3},
				{Temperature: 0.8, Seed: seed, Pos: pos}, {Temperature: 1, TopK: 50, TopP: 0.9, Seed: seed, Pos: pos, Logprobs: 2},
				{Temperature: 1.2, MinP: 0.05, Seed: seed, Pos: pos}} {
				for _, m := range [][]uint32{nil, only(int(11 + 97*seed)), only(vocab - 1), sparse, all} {
					params = append(params, p)
					masks = append(masks, m)
				}
			}
		}
		rows := len(params)
		logits := rnd(uint64(vocab), rows*vocab, 8)
		for row := range rows {
			logits[row*vocab+(row*7919)%vocab] += 4
		}
		var words32 []uint32
		starts := make([]int32, rows)
		for row, m := range masks {
			starts[row] = -1
			if m != nil {
				starts[row] = int32(len(words32))
				words32 = append(words32, m...)
			}
		}
		buf := make([]byte, rows*SampleParamsBytes)
		if _, err := PutSampleParams(buf, params); err != nil {
			t.Fatal(err)
		}
		on(t, d, func(g *dev) {
			pd := g.alloc(len(buf))
			if err := cudart.Upload(g.c, pd, buf); err != nil {
				t.Fatal(err)
			}
			sp := Sample{Tokens: g.alloc(4 * rows), Logprobs: g.alloc(4 * rows), TopIDs: g.alloc(4 * rows * MaxSampleTop),
				TopLogprobs: g.alloc(4 * rows * MaxSampleTop), Logits: g.f32(logits), Params: pd, Rows: rows, Vocab: vocab,
				MaxTop: MaxSampleTop}
			if err := k.Sample(g.c, nil, sp); err != nil {
				t.Fatal(err)
			}
			plain := g.getI32(sp.Tokens, rows)
			sp.TokenMask, sp.MaskStart, sp.MaskWords = g.u32(words32), g.i32(starts), words
			if err := k.Sample(g.c, nil, sp); err != nil {
				t.Fatal(err)
			}
			got, gotLP := g.getI32(sp.Tokens, rows), g.getF32(sp.Logprobs, rows)
			var s engine.Sampler
			for row, p := range params {
				er := engine.SamplingRow{Temperature: p.Temperature, TopP: p.TopP, TopK: int(p.TopK), MinP: p.MinP, Seed: p.Seed, Logprobs: int(p.Logprobs), Mask: masks[row]}
				want, wantLP, _ := s.Sample(logits[row*vocab:(row+1)*vocab], er, int(p.Pos), nil)
				if got[row] != want || math.Abs(float64(gotLP[row]-wantLP)) > 1e-3 {
					t.Errorf("vocab %d row %d %+v: token %d (%g), engine.Sampler %d (%g)", vocab, row, p, got[row], gotLP[row], want, wantLP)
				}
				if masks[row] == nil && got[row] != plain[row] {
					t.Errorf("vocab %d unmasked row %d: token %d, without masks %d", vocab, row, got[row], plain[row])
				}
			}
		})
	}
}
