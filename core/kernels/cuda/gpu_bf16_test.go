//go:build gpu

package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kernels/ref"
	"github.com/resin-llm/resin/core/weights"
)

// Parity of the bf16 kernels with core/kernels/ref (go test -tags gpu ./core/kernels/cuda;
// scripts/gpu-check.sh runs them). The reference runs in float32/float64 on the
// bf16-rounded inputs, so the only differences are the kernel's float32 accumulation
// order and the rounding of its bf16 outputs (2^-8 relative): outputs must be within
// bf16Tol·(1+|ref|).
const bf16Tol = 1.6e-2

// roundBF16 rounds x to bf16 values in place and returns their bits.
func roundBF16(x []float32) []uint16 {
	h := make([]uint16, len(x))
	for i, v := range x {
		h[i] = weights.Float32ToBF16(v)
		x[i] = weights.BF16ToFloat32(h[i])
	}
	return h
}

func rndBF16(seed uint64, n int, scale float32) ([]float32, []uint16) {
	x := rnd(seed, n, scale)
	return x, roundBF16(x)
}

func (g *dev) bf16(h []uint16) cudart.DevicePtr {
	p := g.alloc(2 * len(h))
	if err := cudart.Upload(g.c, p, h); err != nil {
		g.t.Fatal(err)
	}
	return p
}

func (g *dev) i64(h []int64) cudart.DevicePtr {
	p := g.alloc(8 * len(h))
	if err := cudart.Upload(g.c, p, h); err != nil {
		g.t.Fatal(err)
	}
	return p
}

func (g *dev) getBF16(p cudart.DevicePtr, n int) []float32 {
	if err := g.c.Synchronize(); err != nil {
		g.t.Fatal(err)
	}
	h := make([]uint16, n)
	if err := cudart.Download(g.c, h, p); err != nil {
		g.t.Fatal(err)
	}
	out := make([]float32, n)
	for i, v := range h {
		out[i] = weights.BF16ToFloat32(v)
	}
	return out
}

func TestGPUAddRMSNormBF16(t *testing.T) {
	d, k := openKernels(t)
	for _, dim := range []int{4096, 1000, 7} {
		const rows = 9
		x, xh := rndBF16(21, rows*dim, 3)
		res, resh := rndBF16(22, rows*dim, 3)
		w, wh := rndBF16(23, dim, 1)
		wantRes := make([]float32, rows*dim)
		ref.Add(wantRes, res, x)
		roundBF16(wantRes) // the kernel stores the new residual in bf16, then normalises it
		want := make([]float32, rows*dim)
		ref.RMSNorm(want, wantRes, w, rows, dim, 1e-6)
		on(t, d, func(g *dev) {
			out, rd := g.alloc(2*rows*dim), g.bf16(resh)
			if err := k.AddRMSNorm(g.c, nil, BF16, out, rd, g.bf16(xh), g.bf16(wh), rows, dim, 1e-6); err != nil {
				t.Fatal(err)
			}
			parity(t, "add-rmsnorm-bf16 residual", g.getBF16(rd, rows*dim), wantRes, 0) // one rounding of an exact sum
			parity(t, "add-rmsnorm-bf16", g.getBF16(out, rows*dim), want, bf16Tol)
			if err := k.RMSNormBF16(g.c, nil, out, g.bf16(resh), g.bf16(wh), rows, dim, 1e-6); err != nil {
				t.Fatal(err)
			}
			want2 := make([]float32, rows*dim)
			ref.RMSNorm(want2, res, w, rows, dim, 1e-6)
			parity(t, "rmsnorm-bf16", g.getBF16(out, rows*dim), want2, bf16Tol)
		})
		// The float32 variant, the reference's own precision.
		x32, res32, w32 := rnd(24, rows*dim, 3), rnd(25, rows*dim, 3), rnd(26, dim, 1)
		wantRes32 := make([]float32, rows*dim)
		ref.Add(wantRes32, res32, x32)
		want32 := make([]float32, rows*dim)
		ref.RMSNorm(want32, wantRes32, w32, rows, dim, 1e-6)
		on(t, d, func(g *dev) {
			out, rd := g.alloc(4*rows*dim), g.f32(res32)
			if err := k.AddRMSNorm(g.c, nil, F32, out, rd, g.f32(x32), g.f32(w32), rows, dim, 1e-6); err != nil {
				t.Fatal(err)
			}
			parity(t, "add-rmsnorm-f32 residual", g.getF32(rd, rows*dim), wantRes32, 0)
			parity(t, "add-rmsnorm-f32", g.getF32(out, rows*dim), want32, 1e-5)
		})
	}
}

func TestGPUSiLUMulEmbeddingBF16(t *testing.T) {
	d, k := openKernels(t)
	const rows, dim, vocab = 5, 1536, 1000
	gu, guh := rndBF16(27, rows*2*dim, 6)
	want := make([]float32, rows*dim)
	ref.SiLUMul(want, gu, rows, dim)
	table, tableh := rndBF16(28, vocab*dim, 1)
	ids := []int32{0, 999, 5, 5, 421, -1, 1000}
	wantE := make([]float32, len(ids)*dim)
	ref.Embedding(wantE[:5*dim], table, ids[:5], dim) // ids outside the table give zero rows
	on(t, d, func(g *dev) {
		out := g.alloc(2 * rows * dim)
		if err := k.SiLUMulBF16(g.c, nil, out, g.bf16(guh), rows, dim); err != nil {
			t.Fatal(err)
		}
		parity(t, "silu-mul-bf16", g.getBF16(out, rows*dim), want, bf16Tol)
		emb := g.alloc(2 * len(wantE))
		if err := k.EmbeddingBF16(g.c, nil, emb, g.bf16(tableh), g.i32(ids), len(ids), dim, vocab); err != nil {
			t.Fatal(err)
		}
		parity(t, "embedding-bf16", g.getBF16(emb, len(wantE)), wantE, 0)
	})
}

// bf16Cache is a paged bf16 KV cache over an arena of slabs, as a kvslab full-attention
// group lays it out (NewKVSlabLayoutOf), and its float32 twin for the reference.
type bf16Cache struct {
	arena  []float32 // bf16 values
	layout KVSlabLayout
	pt     int
	kvh    int
	hd     int
	free   []uint32 // page ids not yet handed out, shuffled over the slabs
}

func newBF16Cache(seed uint64, layers, layer, pageTokens, kvHeads, headDim, slabPages, slabs int) *bf16Cache {
	pageBytes := int64(layers * 2 * pageTokens * kvHeads * headDim * 2)
	slabBytes := int64(slabPages) * pageBytes
	l, err := NewKVSlabLayoutOf(BF16, slabBytes, pageBytes, layer, pageTokens, kvHeads, headDim)
	if err != nil {
		panic(err)
	}
	c := &bf16Cache{arena: rnd(seed, int(slabBytes)*slabs/2, 1), layout: l, pt: pageTokens, kvh: kvHeads, hd: headDim}
	roundBF16(c.arena)
	for s := range slabs {
		for p := range slabPages {
			c.free = append(c.free, uint32(s)<<PageSlotBits|uint32(p))
		}
	}
	r := rand.New(rand.NewPCG(seed, 99))
	r.Shuffle(len(c.free), func(i, j int) { c.free[i], c.free[j] = c.free[j], c.free[i] })
	return c
}

// pages hands out the page table of a sequence of n tokens.
func (c *bf16Cache) pages(n int) []uint32 {
	k := (n + c.pt - 1) / c.pt
	p := c.free[:k]
	c.free = c.free[k:]
	return p
}

func (c *bf16Cache) ref() *ref.PagedKV {
	l := c.layout
	return &ref.PagedKV{K: c.arena, V: c.arena, PageTokens: c.pt, KVHeads: c.kvh, HeadDim: c.hd,
		PageOffset:  func(p uint32) int { return int(l.KeyOffset(p)) },
		VPageOffset: func(p uint32) int { return int(l.ValueOffset(p)) }}
}

func TestGPURopeKV(t *testing.T) {
	d, k := openKernels(t)
	const heads, kvHeads, headDim, pageTokens, maxPos = 8, 2, 128, 16, 4096
	width := (heads + 2*kvHeads) * headDim // a fused QKV row
	pos := []int32{0, 1, 17, 4095, 300, 2048, 5}
	tokens := len(pos)
	for _, rot := range []int{128, 64} {
		tab, err := ref.NewRopeTable(rot, maxPos, 10000)
		if err != nil {
			t.Fatal(err)
		}
		for _, gptj := range []bool{false, true} {
			for _, dt := range []DType{BF16, F32} {
				name := fmt.Sprintf("rope-kv %s rot=%d gptj=%v", dt, rot, gptj)
				c := newBF16Cache(31, 2, 1, pageTokens, kvHeads, headDim, 4, 8)
				if dt == F32 { // the same layout arithmetic over a float32 arena
					pageBytes := int64(2 * 2 * pageTokens * kvHeads * headDim * 4)
					c.layout, _ = NewKVSlabLayoutOf(F32, 4*pageBytes, pageBytes, 1, pageTokens, kvHeads, headDim)
					c.arena = rnd(32, int(4*pageBytes)*8/4, 1)
				}
				table := c.pages(tokens * pageTokens) // a page per token: no two share a slot
				slots := make([]int64, tokens)
				for i, p := range pos {
					slots[i] = int64(table[i])*pageTokens + int64(p)%pageTokens
				}
				slots[6] = engine.NoSlot // a padding token: rotated, not stored
				qkv := rnd(33, tokens*width, 1)
				var qkvh []uint16
				if dt == BF16 {
					qkvh = roundBF16(qkv)
				}
				// Reference: rotate q and k of each token, then store k and v.
				q := make([]float32, tokens*heads*headDim)
				kk := make([]float32, tokens*kvHeads*headDim)
				v := make([]float32, tokens*kvHeads*headDim)
				for i := range tokens {
					row := qkv[i*width:]
					copy(q[i*heads*headDim:], row[:heads*headDim])
					copy(kk[i*kvHeads*headDim:], row[heads*headDim:(heads+kvHeads)*headDim])
					copy(v[i*kvHeads*headDim:], row[(heads+kvHeads)*headDim:width])
				}
				rotate := tab.RoPENeoX
				if gptj {
					rotate = tab.RoPEInterleaved
				}
				if err := rotate(q, pos, tokens, heads, headDim); err != nil {
					t.Fatal(err)
				}
				if err := rotate(kk, pos, tokens, kvHeads, headDim); err != nil {
					t.Fatal(err)
				}
				wantArena := append([]float32(nil), c.arena...)
				rk := c.ref()
				rk.K, rk.V = wantArena, wantArena
				if err := rk.StoreKV(kk, v, slots); err != nil {
					t.Fatal(err)
				}
				tol := 1e-5
				if dt == BF16 {
					tol = bf16Tol
				}
				on(t, d, func(g *dev) {
					var qkvd, arena cudart.DevicePtr
					if dt == BF16 {
						qkvd, arena = g.bf16(qkvh), g.bf16(roundBF16(append([]float32(nil), c.arena...)))
					} else {
						qkvd, arena = g.f32(qkv), g.f32(c.arena)
					}
					es := cudart.DevicePtr(dt.Size())
					r := RopeKV{Q: qkvd, K: qkvd + es*heads*headDim, V: qkvd + es*(heads+kvHeads)*headDim, Cache: arena,
						Positions: g.i32(pos), Slots: g.i64(slots),
						Rope: Rope{Cos: g.f32(tab.Cos), Sin: g.f32(tab.Sin), Dim: tab.Dim, MaxPos: tab.MaxPos},
						GPTJ: gptj, Layout: c.layout, DType: dt, Tokens: tokens, Heads: heads, KVHeads: kvHeads, HeadDim: headDim,
						QStride: width, KVStride: width, PageTokens: pageTokens}
					if err := k.RopeKV(g.c, nil, r); err != nil {
						t.Fatal(err)
					}
					get := g.getF32
					if dt == BF16 {
						get = g.getBF16
					}
					got := get(qkvd, len(qkv))
					gotQ := make([]float32, len(q))
					for i := range tokens {
						copy(gotQ[i*heads*headDim:], got[i*width:i*width+heads*headDim])
					}
					parity(t, name+" q", gotQ, q, tol)
					parity(t, name+" cache", get(arena, len(c.arena)), wantArena, tol)
				})
			}
		}
	}
}

// attnSeq is one sequence of an attention batch: computed tokens already cached before
// the step, and n new query tokens (their keys are in the cache too).
type attnSeq struct{ computed, n int }

// attnBatch builds a batch over a bf16 cache: the plan's arrays, bf16 queries, and the
// reference output per query row.
type attnBatch struct {
	qs, lens, pts []int32
	table         []uint32
	q             []float32
	qh            []uint16
	want          []float32
	tokens        int
}

func newAttnBatch(t *testing.T, c *bf16Cache, seqs []attnSeq, heads int, scale float32, window int, seed uint64) *attnBatch {
	b := &attnBatch{qs: []int32{0}, pts: []int32{0}}
	for _, s := range seqs {
		b.qs = append(b.qs, b.qs[len(b.qs)-1]+int32(s.n))
		b.lens = append(b.lens, int32(s.computed+s.n))
		b.table = append(b.table, c.pages(s.computed+s.n)...)
		b.pts = append(b.pts, int32(len(b.table)))
	}
	b.tokens = int(b.qs[len(seqs)])
	row := heads * c.hd
	b.q, b.qh = rndBF16(seed, b.tokens*row, 1)
	b.want = make([]float32, len(b.q))
	rk := c.ref()
	for i, s := range seqs {
		q0 := int(b.qs[i])
		err := ref.PagedAttention(b.want[q0*row:(q0+s.n)*row], b.q[q0*row:(q0+s.n)*row], rk, b.table[b.pts[i]:b.pts[i+1]],
			s.computed+s.n, s.n, ref.Attention{Heads: heads, Scale: scale, Window: window})
		if err != nil {
			t.Fatal(err)
		}
	}
	return b
}

func (b *attnBatch) upload(g *dev, c *bf16Cache, arena cudart.DevicePtr, heads int, scale float32, window int) PagedBatch {
	return PagedBatch{Out: g.alloc(2 * len(b.q)), Q: g.bf16(b.qh), KCache: arena, VCache: arena,
		QueryStart: g.i32(b.qs), SeqLens: g.i32(b.lens), PageTableStart: g.i32(b.pts), PageTable: g.u32(b.table),
		Layout: c.layout, Batch: len(b.lens), Tokens: b.tokens, Heads: heads, KVHeads: c.kvh, HeadDim: c.hd,
		PageTokens: c.pt, Scale: scale, Window: window}
}

// TestGPUPrefillAttention runs one ragged launch mixing a fresh prompt, prompt chunks on
// top of cached pages, and decode rows, with and without a sliding window, and checks
// every query row against ref.PagedAttention.
func TestGPUPrefillAttention(t *testing.T) {
	d, k := openKernels(t)
	// Head dim 36 puts key rows off 16 bytes: the kernels' 4-byte load path.
	seqs := []attnSeq{{0, 37}, {50, 20}, {100, 1}, {40, 0}, {1300, 1}, {0, 1}, {16, 16}, {200, 300}} // {40, 0}: padding
	for _, shape := range []struct{ heads, kvHeads, headDim int }{{8, 2, 128}, {4, 4, 64}, {12, 2, 80}, {4, 1, 256}, {4, 2, 36}} {
		for _, window := range []int{0, 100} {
			c := newBF16Cache(41, 2, 1, 16, shape.kvHeads, shape.headDim, 8, 40)
			scale := float32(1 / math.Sqrt(float64(shape.headDim)))
			b := newAttnBatch(t, c, seqs, shape.heads, scale, window, 42)
			name := fmt.Sprintf("prefill h=%d kv=%d d=%d window=%d", shape.heads, shape.kvHeads, shape.headDim, window)
			on(t, d, func(g *dev) {
				arena := g.bf16(roundBF16(append([]float32(nil), c.arena...)))
				p := b.upload(g, c, arena, shape.heads, scale, window)
				if err := k.PrefillAttention(g.c, nil, p, false); err != nil {
					t.Fatal(err)
				}
				parity(t, name, g.getBF16(p.Out, len(b.want)), b.want, bf16Tol)
				// skipDecode leaves one-query sequences alone: their rows stay zero.
				if err := g.c.Memset(p.Out, 0, int64(2*len(b.want))); err != nil {
					t.Fatal(err)
				}
				if err := k.PrefillAttention(g.c, nil, p, true); err != nil {
					t.Fatal(err)
				}
				got := g.getBF16(p.Out, len(b.want))
				row := shape.heads * shape.headDim
				for i, s := range seqs {
					q0 := int(b.qs[i]) * row
					for j := q0; j < q0+s.n*row; j++ {
						if decode := s.n == 1; decode && got[j] != 0 || !decode && math.Abs(float64(got[j]-b.want[j])) > bf16Tol*(1+math.Abs(float64(b.want[j]))) {
							t.Fatalf("%s skipDecode: sequence %d (%d queries) element %d = %g, want %g", name, i, s.n, j-q0, got[j],
								map[bool]float32{true: 0, false: b.want[j]}[decode])
						}
					}
				}
			})
		}
	}
}

// TestGPUDecodeAttention checks split-K decode, with one partition and with the
// partitions ChooseDecodeSplit picks for this GPU and a forced many, for GQA groups of 1
// to 16 query heads, against ref.PagedAttention; prompt rows in the batch are skipped.
func TestGPUDecodeAttention(t *testing.T) {
	d, k := openKernels(t)
	seqs := []attnSeq{{0, 1}, {32, 1}, {699, 1}, {4999, 1}, {10, 5}, {40, 0}, {255, 1}}
	for _, shape := range []struct{ heads, kvHeads, headDim int }{{8, 8, 128}, {32, 8, 128}, {16, 1, 64}, {28, 4, 128}, {8, 2, 256}, {6, 2, 36}} {
		for _, window := range []int{0, 700} {
			c := newBF16Cache(51, 1, 0, 16, shape.kvHeads, shape.headDim, 16, 40)
			scale := float32(1 / math.Sqrt(float64(shape.headDim)))
			b := newAttnBatch(t, c, seqs, shape.heads, scale, window, 52)
			maxCtx := 5000
			if window > 0 {
				maxCtx = window
			}
			chosen, err := ChooseDecodeSplit(len(seqs), shape.kvHeads, maxCtx, d.Info.SMs)
			if err != nil {
				t.Fatal(err)
			}
			for _, split := range []DecodeSplit{{1, (maxCtx + 31) / 32 * 32}, chosen, {MaxDecodeParts, (maxCtx/MaxDecodeParts + 32) / 32 * 32}} {
				name := fmt.Sprintf("decode h=%d kv=%d d=%d window=%d split=%+v", shape.heads, shape.kvHeads, shape.headDim, window, split)
				on(t, d, func(g *dev) {
					arena := g.bf16(roundBF16(append([]float32(nil), c.arena...)))
					p := b.upload(g, c, arena, shape.heads, scale, window)
					var work cudart.DevicePtr
					if n := DecodeWorkspaceBytes(p.Batch, p.Heads, p.HeadDim, split.Parts); n > 0 {
						work = g.alloc(int(n))
					}
					if err := k.DecodeAttention(g.c, nil, p, split, work); err != nil {
						t.Fatal(err)
					}
					got := g.getBF16(p.Out, len(b.want))
					row := shape.heads * shape.headDim
					var gotD, wantD []float32
					for i, s := range seqs {
						q0 := int(b.qs[i]) * row
						if s.n != 1 {
							for j := q0; j < q0+s.n*row; j++ {
								if got[j] != 0 {
									t.Fatalf("%s: the prompt row of sequence %d was written", name, i)
								}
							}
							continue
						}
						gotD, wantD = append(gotD, got[q0:q0+row]...), append(wantD, b.want[q0:q0+row]...)
					}
					parity(t, name, gotD, wantD, bf16Tol)
				})
			}
		}
	}
}

// TestGPUSample checks device sampling against engine.Sampler on the same logits: the
// same token for greedy rows and for seeded draws (top-k, top-p, min-p and temperature
// alone, which walks the vocabulary unsorted), the same logprob and top-n alternatives,
// and the same tokens on a second run.
func TestGPUSample(t *testing.T) {
	d, k := openKernels(t)
	for _, vocab := range []int{1000, 151936} {
		var params []SampleParams
		for seed := range uint64(8) {
			pos := int32(100 + seed)
			params = append(params,
				SampleParams{Temperature: 0, Seed: seed, Pos: pos, Logprobs: 5},
				SampleParams{Temperature: 0.8, TopK: 1, Seed: seed, Pos: pos},
				SampleParams{Temperature: 0.8, Seed: seed, Pos: pos, Logprobs: 3},
				SampleParams{Temperature: 1, TopK: 50, Seed: seed, Pos: pos},
				SampleParams{Temperature: 0.7, TopP: 0.9, Seed: seed, Pos: pos, Logprobs: 20},
				SampleParams{Temperature: 1.2, MinP: 0.05, Seed: seed, Pos: pos},
				SampleParams{Temperature: 0.9, TopK: 40, TopP: 0.8, MinP: 0.02, Seed: seed, Pos: pos, Logprobs: 1},
				SampleParams{Temperature: 2, TopK: int32(vocab + 5), Seed: seed, Pos: pos})
		}
		rows := len(params)
		logits := rnd(61, rows*vocab, 8)
		for r := range rows { // peaked rows, as a model's are, and a tie for the greedy rule
			logits[r*vocab+(r*7919)%vocab] += 4
			logits[r*vocab+(r*104729)%vocab] = logits[r*vocab+(r*7919)%vocab]
		}
		var s engine.Sampler
		want := make([]int32, rows)
		wantLP := make([]float32, rows)
		wantTop := make([][]engine.TopLogprob, rows)
		for r, p := range params {
			row := engine.SamplingRow{Temperature: p.Temperature, TopP: p.TopP, TopK: int(p.TopK), MinP: p.MinP, Seed: p.Seed, Logprobs: int(p.Logprobs)}
			want[r], wantLP[r], wantTop[r] = s.Sample(logits[r*vocab:(r+1)*vocab], row, int(p.Pos), nil)
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
				TopLogprobs: g.alloc(4 * rows * MaxSampleTop), Logits: g.f32(logits), Params: pd, Rows: rows, Vocab: vocab, MaxTop: MaxSampleTop}
			if err := k.Sample(g.c, nil, sp); err != nil {
				t.Fatal(err)
			}
			got, gotLP := g.getI32(sp.Tokens, rows), g.getF32(sp.Logprobs, rows)
			topIDs, topLP := g.getI32(sp.TopIDs, rows*MaxSampleTop), g.getF32(sp.TopLogprobs, rows*MaxSampleTop)
			for r, p := range params {
				if got[r] != want[r] {
					t.Errorf("vocab %d row %d %+v: token %d, CPU sampler %d", vocab, r, p, got[r], want[r])
				}
				if math.Abs(float64(gotLP[r]-wantLP[r])) > 1e-3 {
					t.Errorf("vocab %d row %d: logprob %g, CPU %g", vocab, r, gotLP[r], wantLP[r])
				}
				for j, w := range wantTop[r] {
					at := r*MaxSampleTop + j
					if topIDs[at] != w.Token || math.Abs(float64(topLP[at]-w.Logprob)) > 1e-3 {
						t.Errorf("vocab %d row %d: alternative %d is %d (%g), CPU %d (%g)", vocab, r, j, topIDs[at], topLP[at], w.Token, w.Logprob)
					}
				}
				if n := len(wantTop[r]); n < MaxSampleTop && topIDs[r*MaxSampleTop+n] != -1 {
					t.Errorf("vocab %d row %d: alternative %d set past the %d asked for", vocab, r, n, n)
				}
			}
			if err := k.Sample(g.c, nil, sp); err != nil {
				t.Fatal(err)
			}
			again := g.getI32(sp.Tokens, rows)
			for r := range rows {
				if again[r] != got[r] {
					t.Errorf("vocab %d row %d: a second run drew %d, the first %d", vocab, r, again[r], got[r])
				}
			}
			t.Logf("sample vocab %d: %d rows, tokens %v", vocab, rows, got[:8])
		})
	}
}

// TestGPUBiasHeadRMSNorm checks bias_headnorm.cu on a fused QKV activation with a row
// wider than q and k (the v heads after them, left alone): the bias add as ref.Add per
// row, one bf16 rounding of an exact sum, and the per-head RMSNorm as ref.RMSNorm over
// each q head with q_w and each k head with k_w.
func TestGPUBiasHeadRMSNorm(t *testing.T) {
	d, k := openKernels(t)
	for _, hd := range []int{128, 64, 256, 40} {
		const tokens, heads, kvHeads = 7, 8, 2
		stride := (heads + 2*kvHeads) * hd
		x, xh := rndBF16(31, tokens*stride, 3)
		bias, bh := rndBF16(32, stride, 1)
		qw, qwh := rndBF16(33, hd, 1)
		kw, kwh := rndBF16(34, hd, 1)
		withBias := make([]float32, tokens*stride)
		for r := range tokens {
			ref.Add(withBias[r*stride:(r+1)*stride], x[r*stride:(r+1)*stride], bias)
		}
		roundBF16(withBias)
		want := append([]float32(nil), withBias...)
		for r := range tokens {
			row := want[r*stride:]
			ref.RMSNorm(row[:heads*hd], row[:heads*hd], qw, heads, hd, 1e-6)
			ref.RMSNorm(row[heads*hd:(heads+kvHeads)*hd], row[heads*hd:(heads+kvHeads)*hd], kw, kvHeads, hd, 1e-6)
		}
		on(t, d, func(g *dev) {
			p := g.bf16(xh)
			if err := k.AddBiasBF16(g.c, nil, p, g.bf16(bh), tokens, stride); err != nil {
				t.Fatal(err)
			}
			parity(t, fmt.Sprintf("add-bias-bf16 dim %d", stride), g.getBF16(p, tokens*stride), withBias, 0)
			n := HeadRMSNorm{X: p, QW: g.bf16(qwh), KW: g.bf16(kwh), Tokens: tokens, Heads: heads, KVHeads: kvHeads, HeadDim: hd, Stride: stride, Eps: 1e-6}
			if err := k.HeadRMSNormBF16(g.c, nil, n); err != nil {
				t.Fatal(err)
			}
			got := g.getBF16(p, tokens*stride)
			parity(t, fmt.Sprintf("head-rmsnorm-bf16 head dim %d", hd), got, want, bf16Tol)
			for r := range tokens { // the values are not touched
				v := (heads + kvHeads) * hd
				parity(t, "head-rmsnorm-bf16 values", got[r*stride+v:(r+1)*stride], withBias[r*stride+v:(r+1)*stride], 0)
			}
		})
	}
}
