package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kernels/ref"
)

// The GPU runner's kernels (the bf16 path and the float32 variants launched through a
// launchSpec) on the emulated device, packed by the production pack functions. The
// reference runs on the bf16-rounded inputs, so what differs is the kernels' float32
// accumulation order and their bf16 output rounding: outputs within emuBF16Tol·(1+|ref|)
// (half a bf16 ulp is 2^-9, plus the accumulation).
const emuBF16Tol = 8e-3

func specLaunch(t testing.TB, err error, spec *launchSpec) emuLaunch {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	return fromSpec(spec)
}

func TestEmuAddRMSNorm(t *testing.T) {
	emuKernels(t)
	for _, dim := range []int{4096, 1000, 7, 256, 300} {
		const rows = 3
		x, xh := emuRndBF16(21, rows*dim, 3)
		res, resh := emuRndBF16(22, rows*dim, 3)
		w, wh := emuRndBF16(23, dim, 1)
		wantRes := make([]float32, rows*dim)
		ref.Add(wantRes, res, x)
		emuRoundBF16(wantRes)
		want := make([]float32, rows*dim)
		ref.RMSNorm(want, wantRes, w, rows, dim, 1e-6)
		m := &emuMem{t: t}
		out, rd := m.alloc(2*rows*dim), m.bf16(resh)
		var spec launchSpec
		name := fmt.Sprintf("add_rmsnorm bf16 dim %d", dim)
		emuRun(t, name, m, specLaunch(t, packAddRMSNorm(&spec, BF16, out, rd, m.bf16(xh), m.bf16(wh), rows, dim, 1e-6), &spec))
		emuClose(t, name+" residual", m.getBF16(rd, rows*dim), wantRes, 0)
		emuClose(t, name, m.getBF16(out, rows*dim), want, emuBF16Tol)

		// RMSNormBF16, in place (out aliases x) as its doc allows.
		want2 := make([]float32, rows*dim)
		ref.RMSNorm(want2, res, w, rows, dim, 1e-6)
		xd := m.bf16(resh)
		emuRun(t, "rmsnorm bf16 in place", m, specLaunch(t, packRMSNormBF16(&spec, xd, xd, m.bf16(wh), rows, dim, 1e-6), &spec))
		emuClose(t, fmt.Sprintf("rmsnorm bf16 dim %d", dim), m.getBF16(xd, rows*dim), want2, emuBF16Tol)

		// The float32 variant.
		x32, res32, w32 := emuRnd(24, rows*dim, 3), emuRnd(25, rows*dim, 3), emuRnd(26, dim, 1)
		wantRes32 := make([]float32, rows*dim)
		ref.Add(wantRes32, res32, x32)
		want32 := make([]float32, rows*dim)
		ref.RMSNorm(want32, wantRes32, w32, rows, dim, 1e-6)
		out32, rd32 := m.alloc(4*rows*dim), m.f32(res32)
		emuRun(t, "add_rmsnorm f32", m, specLaunch(t, packAddRMSNorm(&spec, F32, out32, rd32, m.f32(x32), m.f32(w32), rows, dim, 1e-6), &spec))
		emuClose(t, "add_rmsnorm f32 residual", m.getF32(rd32, rows*dim), wantRes32, 0)
		emuClose(t, "add_rmsnorm f32", m.getF32(out32, rows*dim), want32, 2e-6)
	}
}

func TestEmuSiLUMulEmbeddingBF16(t *testing.T) {
	emuKernels(t)
	const rows, dim, vocab = 5, 300, 1000
	gu, guh := emuRndBF16(27, rows*2*dim, 6)
	want := make([]float32, rows*dim)
	ref.SiLUMul(want, gu, rows, dim)
	table, tableh := emuRndBF16(28, vocab*dim, 1)
	ids := []int32{0, 999, 5, 5, 421, -1, 1000}
	wantE := make([]float32, len(ids)*dim)
	ref.Embedding(wantE[:5*dim], table, ids[:5], dim)
	m := &emuMem{t: t}
	out := m.alloc(2 * rows * dim)
	var spec launchSpec
	emuRun(t, "silu_mul bf16", m, specLaunch(t, packSiLUMulBF16(&spec, out, m.bf16(guh), rows, dim), &spec))
	emuClose(t, "silu_mul bf16", m.getBF16(out, rows*dim), want, emuBF16Tol)
	emb := m.alloc(2 * len(wantE))
	emuRun(t, "embedding bf16", m, specLaunch(t, packEmbeddingBF16(&spec, emb, m.bf16(tableh), m.i32(ids), len(ids), dim, vocab), &spec))
	emuMaxUlps(t, "embedding bf16", m.getBF16(emb, len(wantE)), wantE, 0)
}

func TestEmuBiasHeadRMSNorm(t *testing.T) {
	emuKernels(t)
	for _, hd := range []int{128, 64, 256, 40, 100} {
		const tokens, heads, kvHeads = 3, 8, 2
		stride := (heads + 2*kvHeads) * hd
		x, xh := emuRndBF16(31, tokens*stride, 3)
		bias, bh := emuRndBF16(32, stride, 1)
		qw, qwh := emuRndBF16(33, hd, 1)
		kw, kwh := emuRndBF16(34, hd, 1)
		withBias := make([]float32, tokens*stride)
		for r := range tokens {
			ref.Add(withBias[r*stride:(r+1)*stride], x[r*stride:(r+1)*stride], bias)
		}
		emuRoundBF16(withBias)
		want := append([]float32(nil), withBias...)
		for r := range tokens {
			row := want[r*stride:]
			ref.RMSNorm(row[:heads*hd], row[:heads*hd], qw, heads, hd, 1e-6)
			ref.RMSNorm(row[heads*hd:(heads+kvHeads)*hd], row[heads*hd:(heads+kvHeads)*hd], kw, kvHeads, hd, 1e-6)
		}
		m := &emuMem{t: t}
		p := m.bf16(xh)
		var spec, spec2 launchSpec
		n := HeadRMSNorm{X: p, QW: m.bf16(qwh), KW: m.bf16(kwh), Tokens: tokens, Heads: heads, KVHeads: kvHeads, HeadDim: hd, Stride: stride, Eps: 1e-6}
		name := fmt.Sprintf("bias + head rmsnorm head dim %d", hd)
		emuRun(t, name, m, specLaunch(t, packAddBiasBF16(&spec, p, m.bf16(bh), tokens, stride), &spec),
			specLaunch(t, n.pack(&spec2), &spec2))
		got := m.getBF16(p, tokens*stride)
		emuClose(t, name, got, want, emuBF16Tol)
		for r := range tokens { // the values are not touched, the bias added exactly once
			v := (heads + kvHeads) * hd
			emuClose(t, name+" values", got[r*stride+v:(r+1)*stride], withBias[r*stride+v:(r+1)*stride], 0)
		}
	}
}

// emuCache is a paged KV cache over an arena of slabs as a kvslab group lays it out, in
// bf16 (or float32) values, with its float32 twin for the reference.
type emuCache struct {
	arena  []float32
	layout KVSlabLayout
	pt     int
	kvh    int
	hd     int
	free   []uint32
}

func newEmuCache(seed uint64, dt DType, layers, layer, pageTokens, kvHeads, headDim, slabPages, slabs int) *emuCache {
	pageBytes := int64(layers * 2 * pageTokens * kvHeads * headDim * dt.Size())
	slabBytes := int64(slabPages) * pageBytes
	l, err := NewKVSlabLayoutOf(dt, slabBytes, pageBytes, layer, pageTokens, kvHeads, headDim)
	if err != nil {
		panic(err)
	}
	c := &emuCache{arena: emuRnd(seed, int(slabBytes)*slabs/dt.Size(), 1), layout: l, pt: pageTokens, kvh: kvHeads, hd: headDim}
	if dt == BF16 {
		emuRoundBF16(c.arena)
	}
	for s := range slabs {
		for p := range slabPages {
			c.free = append(c.free, uint32(s)<<PageSlotBits|uint32(p))
		}
	}
	r := rand.New(rand.NewPCG(seed, 99))
	r.Shuffle(len(c.free), func(i, j int) { c.free[i], c.free[j] = c.free[j], c.free[i] })
	return c
}

func (c *emuCache) pages(n int) []uint32 {
	k := (n + c.pt - 1) / c.pt
	p := c.free[:k]
	c.free = c.free[k:]
	return p
}

func (c *emuCache) ref() *ref.PagedKV {
	l := c.layout
	return &ref.PagedKV{K: c.arena, V: c.arena, PageTokens: c.pt, KVHeads: c.kvh, HeadDim: c.hd,
		PageOffset:  func(p uint32) int { return int(l.KeyOffset(p)) },
		VPageOffset: func(p uint32) int { return int(l.ValueOffset(p)) }}
}

func TestEmuRopeKV(t *testing.T) {
	emuKernels(t)
	const heads, kvHeads, pageTokens, maxPos = 4, 2, 16, 64
	for _, c := range []struct{ headDim, rot int }{{64, 64}, {80, 32}, {128, 64}} {
		width := (heads + 2*kvHeads) * c.headDim
		pos := []int32{0, 1, 17, 63, 30, 64, -1, 5}
		tokens := len(pos)
		tab, err := ref.NewRopeTable(c.rot, maxPos, 10000)
		if err != nil {
			t.Fatal(err)
		}
		for _, gptj := range []bool{false, true} {
			for _, dt := range []DType{BF16, F32} {
				name := fmt.Sprintf("rope_kv %s head dim %d rot %d gptj %v", dt, c.headDim, c.rot, gptj)
				cache := newEmuCache(31, dt, 2, 1, pageTokens, kvHeads, c.headDim, 4, 4)
				table := cache.pages(tokens * pageTokens)
				slots := make([]int64, tokens)
				for i, p := range pos {
					slots[i] = int64(table[i])*pageTokens + int64(max(p, 0))%pageTokens
				}
				slots[7] = engine.NoSlot
				qkv := emuRnd(33, tokens*width, 1)
				var qkvh []uint16
				if dt == BF16 {
					qkvh = emuRoundBF16(qkv)
				}
				q := make([]float32, tokens*heads*c.headDim)
				kk := make([]float32, tokens*kvHeads*c.headDim)
				v := make([]float32, tokens*kvHeads*c.headDim)
				for i := range tokens {
					row := qkv[i*width:]
					copy(q[i*heads*c.headDim:], row[:heads*c.headDim])
					copy(kk[i*kvHeads*c.headDim:], row[heads*c.headDim:(heads+kvHeads)*c.headDim])
					copy(v[i*kvHeads*c.headDim:], row[(heads+kvHeads)*c.headDim:width])
				}
				rotate := tab.RoPENeoX
				if gptj {
					rotate = tab.RoPEInterleaved
				}
				for i, p := range pos { // positions outside the table stay unrotated
					if p < 0 || int(p) >= maxPos {
						continue
					}
					rotate(q[i*heads*c.headDim:(i+1)*heads*c.headDim], pos[i:i+1], 1, heads, c.headDim)
					rotate(kk[i*kvHeads*c.headDim:(i+1)*kvHeads*c.headDim], pos[i:i+1], 1, kvHeads, c.headDim)
				}
				wantArena := append([]float32(nil), cache.arena...)
				rk := cache.ref()
				rk.K, rk.V = wantArena, wantArena
				if err := rk.StoreKV(kk, v, slots); err != nil {
					t.Fatal(err)
				}
				m := &emuMem{t: t}
				var qkvd, arena cudart.DevicePtr
				get := m.getF32
				if dt == BF16 {
					qkvd, arena = m.bf16(qkvh), m.bf16(emuRoundBF16(append([]float32(nil), cache.arena...)))
					get = m.getBF16
				} else {
					qkvd, arena = m.f32(qkv), m.f32(cache.arena)
				}
				es := cudart.DevicePtr(dt.Size())
				r := RopeKV{Q: qkvd, K: qkvd + es*cudart.DevicePtr(heads*c.headDim), V: qkvd + es*cudart.DevicePtr((heads+kvHeads)*c.headDim),
					Cache: arena, Positions: m.i32(pos), Slots: m.i64(slots),
					Rope: Rope{Cos: m.f32(tab.Cos), Sin: m.f32(tab.Sin), Dim: tab.Dim, MaxPos: tab.MaxPos},
					GPTJ: gptj, Layout: cache.layout, DType: dt, Tokens: tokens, Heads: heads, KVHeads: kvHeads, HeadDim: c.headDim,
					QStride: width, KVStride: width, PageTokens: pageTokens}
				var spec launchSpec
				emuRun(t, name, m, specLaunch(t, r.pack(&spec), &spec))
				tol := 1e-6
				if dt == BF16 {
					tol = emuBF16Tol
				}
				got := get(qkvd, len(qkv))
				gotQ := make([]float32, len(q))
				for i := range tokens {
					copy(gotQ[i*heads*c.headDim:], got[i*width:i*width+heads*c.headDim])
				}
				emuClose(t, name+" q", gotQ, q, tol)
				emuClose(t, name+" cache", get(arena, len(cache.arena)), wantArena, tol)
			}
		}
	}
}

// emuSeq is one sequence of an attention batch: tokens already cached and n new ones.
type emuSeq struct{ computed, n int }

type emuBatch struct {
	qs, lens, pts []int32
	table         []uint32
	q             []float32
	qh            []uint16
	want          []float32
	tokens        int
}

func newEmuBatch(t testing.TB, c *emuCache, seqs []emuSeq, heads int, scale float32, window int, seed uint64) *emuBatch {
	b := &emuBatch{qs: []int32{0}, pts: []int32{0}}
	for _, s := range seqs {
		b.qs = append(b.qs, b.qs[len(b.qs)-1]+int32(s.n))
		b.lens = append(b.lens, int32(s.computed+s.n))
		b.table = append(b.table, c.pages(s.computed+s.n)...)
		b.pts = append(b.pts, int32(len(b.table)))
	}
	b.tokens = int(b.qs[len(seqs)])
	row := heads * c.hd
	b.q, b.qh = emuRndBF16(seed, b.tokens*row, 1)
	b.want = make([]float32, len(b.q))
	rk := c.ref()
	for i, s := range seqs {
		q0 := int(b.qs[i])
		if err := ref.PagedAttention(b.want[q0*row:(q0+s.n)*row], b.q[q0*row:(q0+s.n)*row], rk, b.table[b.pts[i]:b.pts[i+1]],
			s.computed+s.n, s.n, ref.Attention{Heads: heads, Scale: scale, Window: window}); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

func (b *emuBatch) upload(m *emuMem, c *emuCache, heads int, scale float32, window int) PagedBatch {
	arena := m.bf16(emuRoundBF16(append([]float32(nil), c.arena...)))
	return PagedBatch{Out: m.alloc(2 * len(b.q)), Q: m.bf16(b.qh), KCache: arena, VCache: arena,
		QueryStart: m.i32(b.qs), SeqLens: m.i32(b.lens), PageTableStart: m.i32(b.pts), PageTable: m.u32(b.table),
		Layout: c.layout, Batch: len(b.lens), Tokens: b.tokens, Heads: heads, KVHeads: c.kvh, HeadDim: c.hd,
		PageTokens: c.pt, Scale: scale, Window: window}
}

// TestEmuPrefillAttention: one ragged launch of a fresh prompt longer than a 16-row tile,
// prompt chunks on cached pages, decode rows and a padding sequence, for head dims 32 to
// 256 (80 and 100 among them: key rows off 16 bytes take the 4-byte load path), GQA
// groups 1 to 32, with and without a window, against ref.PagedAttention row by row; and
// skipDecode leaving the one-query rows alone.
func TestEmuPrefillAttention(t *testing.T) {
	emuKernels(t)
	seqs := []emuSeq{{0, 37}, {50, 20}, {100, 1}, {40, 0}, {0, 1}, {16, 16}, {70, 33}}
	for _, shape := range []struct{ heads, kvHeads, headDim int }{{4, 2, 128}, {2, 2, 32}, {4, 1, 80}, {2, 2, 100}, {2, 1, 256}, {32, 1, 32}, {3, 3, 36}} {
		for _, window := range []int{0, 24} {
			if window > 0 && shape.headDim != 128 && shape.headDim != 80 {
				continue // the window's arithmetic does not depend on the head dim
			}
			c := newEmuCache(41, BF16, 2, 1, 16, shape.kvHeads, shape.headDim, 8, 6)
			scale := float32(1 / math.Sqrt(float64(shape.headDim)))
			b := newEmuBatch(t, c, seqs, shape.heads, scale, window, 42)
			name := fmt.Sprintf("prefill h %d kv %d d %d window %d", shape.heads, shape.kvHeads, shape.headDim, window)
			m := &emuMem{t: t}
			p := b.upload(m, c, shape.heads, scale, window)
			var spec launchSpec
			emuRun(t, name, m, specLaunch(t, p.packPrefill(&spec, false), &spec))
			emuClose(t, name, m.getBF16(p.Out, len(b.want)), b.want, emuBF16Tol)
			if shape.headDim != 128 {
				continue
			}
			out := m.find(p.Out)
			clear(out[:2*len(b.want)])
			emuRun(t, name+" skip decode", m, specLaunch(t, p.packPrefill(&spec, true), &spec))
			got := m.getBF16(p.Out, len(b.want))
			row := shape.heads * shape.headDim
			for i, s := range seqs {
				q0 := int(b.qs[i]) * row
				for j := q0; j < q0+s.n*row; j++ {
					if s.n == 1 && got[j] != 0 {
						t.Fatalf("%s skip decode: the decode row of sequence %d was written", name, i)
					}
				}
				if s.n > 1 {
					emuClose(t, name+" skip decode", got[q0:q0+s.n*row], b.want[q0:q0+s.n*row], emuBF16Tol)
				}
			}
		}
	}
}

// TestEmuDecodeAttention: split-K decode with one partition, a few, and more than the
// keys fill (empty partitions, whose log-sum-exp is -inf), GQA groups 1 to 16, windows,
// against ref.PagedAttention; prompt rows of the batch are left alone.
func TestEmuDecodeAttention(t *testing.T) {
	emuKernels(t)
	seqs := []emuSeq{{0, 1}, {32, 1}, {199, 1}, {10, 5}, {40, 0}, {95, 1}}
	const maxCtx = 200
	for _, shape := range []struct{ heads, kvHeads, headDim int }{{4, 4, 128}, {16, 1, 64}, {8, 2, 256}, {6, 2, 100}, {6, 3, 80}, {2, 1, 32}} {
		for _, window := range []int{0, 70} {
			c := newEmuCache(51, BF16, 1, 0, 16, shape.kvHeads, shape.headDim, 16, 3)
			scale := float32(1 / math.Sqrt(float64(shape.headDim)))
			b := newEmuBatch(t, c, seqs, shape.heads, scale, window, 52)
			keys := maxCtx
			if window > 0 {
				keys = window
			}
			chosen, err := ChooseDecodeSplit(len(seqs), shape.kvHeads, keys, 132)
			if err != nil {
				t.Fatal(err)
			}
			splits := []DecodeSplit{chosen, {12, 32}} // {12, 32}: partitions past the keys, empty
			if shape.headDim == 128 {
				// {2, 32}: fewer keys planned than the longest context has, the last
				// partition runs to the end.
				splits = append(splits, DecodeSplit{1, (keys + 31) / 32 * 32}, DecodeSplit{3, 128}, DecodeSplit{2, 32})
			} else if window > 0 {
				continue
			}
			for _, split := range splits {
				name := fmt.Sprintf("decode h %d kv %d d %d window %d split %+v", shape.heads, shape.kvHeads, shape.headDim, window, split)
				m := &emuMem{t: t}
				p := b.upload(m, c, shape.heads, scale, window)
				var work cudart.DevicePtr
				if n := DecodeWorkspaceBytes(p.Batch, p.Heads, p.HeadDim, split.Parts); n > 0 {
					work = m.alloc(int(n))
				}
				var spec, red launchSpec
				if err := p.packDecode(&spec, &red, split, work); err != nil {
					t.Fatal(err)
				}
				launches := []emuLaunch{fromSpec(&spec)}
				if split.Parts > 1 {
					launches = append(launches, fromSpec(&red))
				}
				emuRun(t, name, m, launches...)
				got := m.getBF16(p.Out, len(b.want))
				row := shape.heads * shape.headDim
				for i, s := range seqs {
					q0 := int(b.qs[i]) * row
					if s.n != 1 {
						for j := q0; j < q0+s.n*row; j++ {
							if !math.IsNaN(float64(got[j])) { // still the poison
								t.Fatalf("%s: the prompt row of sequence %d was written", name, i)
							}
						}
						continue
					}
					emuClose(t, fmt.Sprintf("%s sequence %d", name, i), got[q0:q0+row], b.want[q0:q0+row], emuBF16Tol)
				}
			}
		}
	}
}

// TestEmuAttentionPageSizes runs prefill and split decode over pages of 8 and 64 tokens
// (a 32-key tile spans four pages, or a quarter of one).
func TestEmuAttentionPageSizes(t *testing.T) {
	emuKernels(t)
	for _, pt := range []int{8, 64} {
		c := newEmuCache(61, BF16, 1, 0, pt, 2, 64, 64/pt*4, 3)
		scale := float32(0.125)
		b := newEmuBatch(t, c, []emuSeq{{20, 45}, {130, 1}, {7, 1}, {0, 9}}, 4, scale, 0, 62)
		m := &emuMem{t: t}
		p := b.upload(m, c, 4, scale, 0)
		var pre, dec, red launchSpec
		work := m.alloc(int(DecodeWorkspaceBytes(p.Batch, p.Heads, p.HeadDim, 3)))
		if err := firstErrOf(p.packPrefill(&pre, true), p.packDecode(&dec, &red, DecodeSplit{3, 64}, work)); err != nil {
			t.Fatal(err)
		}
		name := fmt.Sprintf("attention page tokens %d", pt)
		emuRun(t, name, m, fromSpec(&pre), fromSpec(&dec), fromSpec(&red))
		emuClose(t, name, m.getBF16(p.Out, len(b.want)), b.want, emuBF16Tol)
	}
}
