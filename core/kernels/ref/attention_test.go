package ref

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// denseAttention is causal GQA attention over contiguous k, v: [ctx, kvHeads, d].
func denseAttention(q, k, v []float32, ctx, nq, heads, kvHeads, d int, scale float32, window int) []float32 {
	out := make([]float32, nq*heads*d)
	for i := 0; i < nq; i++ {
		p := ctx - nq + i
		for h := 0; h < heads; h++ {
			kh := h / (heads / kvHeads)
			var sc []float64
			lo := 0
			if window > 0 {
				lo = max(0, p-window+1)
			}
			for t := lo; t <= p; t++ {
				sc = append(sc, dot(q[(i*heads+h)*d:(i*heads+h+1)*d], k[(t*kvHeads+kh)*d:(t*kvHeads+kh+1)*d])*float64(scale))
			}
			mx := math.Inf(-1)
			for _, s := range sc {
				mx = max(mx, s)
			}
			var sum float64
			for j := range sc {
				sc[j] = math.Exp(sc[j] - mx)
				sum += sc[j]
			}
			for j := 0; j < d; j++ {
				var a float64
				for n, t := 0, lo; t <= p; n, t = n+1, t+1 {
					a += sc[n] * float64(v[(t*kvHeads+kh)*d+j])
				}
				out[(i*heads+h)*d+j] = float32(a / sum)
			}
		}
	}
	return out
}

func TestPagedAttentionMatchesDense(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	const (
		pageTokens, kvHeads, heads, d = 4, 2, 6, 8
		ctx, nq, numPages             = 11, 3, 9
	)
	scale := float32(1 / math.Sqrt(d))
	k, v := randSlice(r, ctx*kvHeads*d), randSlice(r, ctx*kvHeads*d)
	q := randSlice(r, nq*heads*d)
	for _, window := range []int{0, 5} {
		want := denseAttention(q, k, v, ctx, nq, heads, kvHeads, d, scale, window)
		// Two different page layouts: results must not depend on where pages live.
		for _, pages := range [][]uint32{{0, 1, 2}, {7, 2, 5}} {
			c := &PagedKV{K: make([]float32, numPages*pageTokens*kvHeads*d), V: make([]float32, numPages*pageTokens*kvHeads*d),
				PageTokens: pageTokens, KVHeads: kvHeads, HeadDim: d}
			slots := make([]int64, ctx)
			for tk := range slots {
				slots[tk] = int64(pages[tk/pageTokens])*pageTokens + int64(tk%pageTokens)
			}
			if err := c.StoreKV(k, v, slots); err != nil {
				t.Fatal(err)
			}
			got := make([]float32, nq*heads*d)
			if err := PagedAttention(got, q, c, pages, ctx, nq, Attention{Heads: heads, Scale: scale, Window: window}); err != nil {
				t.Fatal(err)
			}
			near(t, "PagedAttention", got, want, 1e-5)
		}
	}
}

func TestPagedAttentionPrefillEqualsDecode(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	const pageTokens, kvHeads, heads, d, ctx = 2, 1, 4, 4, 5
	c := &PagedKV{K: make([]float32, 8*pageTokens*kvHeads*d), V: make([]float32, 8*pageTokens*kvHeads*d),
		PageTokens: pageTokens, KVHeads: kvHeads, HeadDim: d,
		PageOffset: func(p uint32) int { return (7 - int(p)) * pageTokens * kvHeads * d }} // pages stored in reverse
	pages := []uint32{4, 1, 6}
	k, v := randSlice(r, ctx*kvHeads*d), randSlice(r, ctx*kvHeads*d)
	q := randSlice(r, ctx*heads*d)
	slots := []int64{8, 9, 2, 3, 12}
	if err := c.StoreKV(k, v, slots); err != nil {
		t.Fatal(err)
	}
	a := Attention{Heads: heads, Scale: 0.5}
	prefill := make([]float32, ctx*heads*d)
	if err := PagedAttention(prefill, q, c, pages, ctx, ctx, a); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < ctx; i++ {
		one := make([]float32, heads*d)
		if err := PagedAttention(one, q[i*heads*d:(i+1)*heads*d], c, pages, i+1, 1, a); err != nil {
			t.Fatal(err)
		}
		near(t, "decode step", one, prefill[i*heads*d:(i+1)*heads*d], 1e-6)
	}
	// The first token sees only itself: its output is its own value row.
	near(t, "first token", prefill[:d], v[:d], 1e-6)
}

func TestPagedAttentionKAndVInOneArena(t *testing.T) {
	// One arena holds each page's keys followed by its values, as a kvslab page would.
	r := rand.New(rand.NewPCG(9, 10))
	const pageTokens, kvHeads, heads, d, ctx, pages = 4, 2, 4, 8, 7, 5
	half := pageTokens * kvHeads * d
	arena := make([]float32, pages*2*half)
	shared := &PagedKV{K: arena, V: arena, PageTokens: pageTokens, KVHeads: kvHeads, HeadDim: d,
		PageOffset:  func(p uint32) int { return int(p) * 2 * half },
		VPageOffset: func(p uint32) int { return int(p)*2*half + half }}
	split := &PagedKV{K: make([]float32, pages*half), V: make([]float32, pages*half), PageTokens: pageTokens, KVHeads: kvHeads, HeadDim: d}
	table := []uint32{3, 1}
	k, v := randSlice(r, ctx*kvHeads*d), randSlice(r, ctx*kvHeads*d)
	slots := make([]int64, ctx)
	for i := range slots {
		slots[i] = int64(table[i/pageTokens])*pageTokens + int64(i%pageTokens)
	}
	q := randSlice(r, 2*heads*d)
	var outs [2][]float32
	for i, c := range []*PagedKV{shared, split} {
		if err := c.StoreKV(k, v, slots); err != nil {
			t.Fatal(err)
		}
		outs[i] = make([]float32, len(q))
		if err := PagedAttention(outs[i], q, c, table, ctx, 2, Attention{Heads: heads, Scale: 0.3}); err != nil {
			t.Fatal(err)
		}
	}
	near(t, "one arena vs two", outs[0], outs[1], 0)
}

func TestPagedAttentionHighSlabPages(t *testing.T) {
	// kvslab page ids are uint32 slab<<16 | slot: a page in slab 32768 or above has the top
	// bit set, which an int32 page id would read as negative. Such pages, mapped to a small
	// arena by a PageOffset closure, must store and attend like packed pages 0 and 1.
	r := rand.New(rand.NewPCG(11, 12))
	const pageTokens, kvHeads, heads, d, ctx = 4, 2, 4, 8, 7
	elems := pageTokens * kvHeads * d
	high := []uint32{32768<<16 | 3, 65534<<16 | 0xffff}
	at := map[uint32]int{high[0]: 1, high[1]: 0} // arena position of each page
	slabbed := &PagedKV{K: make([]float32, 2*elems), V: make([]float32, 2*elems), PageTokens: pageTokens, KVHeads: kvHeads, HeadDim: d,
		PageOffset: func(p uint32) int {
			if i, ok := at[p]; ok {
				return i * elems
			}
			return -1 // not a page of this cache
		}}
	packed := &PagedKV{K: make([]float32, 2*elems), V: make([]float32, 2*elems), PageTokens: pageTokens, KVHeads: kvHeads, HeadDim: d}
	k, v := randSlice(r, ctx*kvHeads*d), randSlice(r, ctx*kvHeads*d)
	q := randSlice(r, 3*heads*d)
	var outs [2][]float32
	for i, run := range []struct {
		c     *PagedKV
		table []uint32
	}{{slabbed, high}, {packed, []uint32{0, 1}}} {
		slots := make([]int64, ctx)
		for j := range slots {
			slots[j] = int64(run.table[j/pageTokens])*pageTokens + int64(j%pageTokens)
		}
		if err := run.c.StoreKV(k, v, slots); err != nil {
			t.Fatalf("StoreKV into pages %#x: %v", run.table, err)
		}
		outs[i] = make([]float32, len(q))
		if err := PagedAttention(outs[i], q, run.c, run.table, ctx, 3, Attention{Heads: heads, Scale: 0.3}); err != nil {
			t.Fatalf("PagedAttention over pages %#x: %v", run.table, err)
		}
	}
	near(t, "slab ≥ 32768 vs packed", outs[0], outs[1], 0)
	// The high page holding tokens 0..3 sits second in the arena: its keys are there.
	near(t, "first high page's keys", slabbed.K[elems:2*elems], k[:elems], 0)
	if err := PagedAttention(outs[0], q, slabbed, []uint32{high[0], 1<<31 | 5}, ctx, 3, Attention{Heads: heads, Scale: 0.3}); err == nil {
		t.Error("a page the closure does not know was read without an error")
	}
}

func TestPagedAttentionErrors(t *testing.T) {
	c := &PagedKV{K: make([]float32, 16), V: make([]float32, 16), PageTokens: 2, KVHeads: 2, HeadDim: 2}
	out, q := make([]float32, 12), make([]float32, 12)
	for name, err := range map[string]error{
		"heads not a multiple": PagedAttention(out, q, c, []uint32{0}, 1, 1, Attention{Heads: 3, Scale: 1}),
		"short page table":     PagedAttention(out, q, c, []uint32{0}, 3, 1, Attention{Heads: 2, Scale: 1}),
		"page outside cache":   PagedAttention(out, q, c, []uint32{5}, 1, 1, Attention{Heads: 2, Scale: 1}),
		"more queries":         PagedAttention(out, q, c, []uint32{0}, 1, 2, Attention{Heads: 2, Scale: 1}),
		"largest page id":      PagedAttention(out, q, c, []uint32{math.MaxUint32}, 1, 1, Attention{Heads: 2, Scale: 1}),
		"store outside":        c.StoreKV(make([]float32, 4), make([]float32, 4), []int64{9}),
	} {
		if err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func BenchmarkPagedAttentionDecode(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 1))
	const pageTokens, kvHeads, heads, d, ctx = 16, 8, 32, 128, 1024
	c := &PagedKV{K: randSlice(r, ctx*kvHeads*d), V: randSlice(r, ctx*kvHeads*d), PageTokens: pageTokens, KVHeads: kvHeads, HeadDim: d}
	pages := make([]uint32, ctx/pageTokens)
	for i := range pages {
		pages[i] = uint32(i)
	}
	q, out := randSlice(r, heads*d), make([]float32, heads*d)
	b.ReportAllocs()
	for b.Loop() {
		if err := PagedAttention(out, q, c, pages, ctx, 1, Attention{Heads: heads, Scale: 0.088}); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkMatMulT(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 1))
	const m, k, n = 16, 1024, 1024
	x, w, out := randSlice(r, m*k), randSlice(r, n*k), make([]float32, m*n)
	b.ReportAllocs()
	for b.Loop() {
		if err := MatMulT(out, x, w, m, k, n); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(2*m*k*n)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
}

// batchCase is a random batch for PagedAttentionBatch: sequences whose pages are scattered
// over one cache in a random order, each with its own context and query count.
type batchCase struct {
	c     *PagedKV
	b     AttentionBatch
	q     []float32
	heads int
}

func randomBatch(r *rand.Rand, ctxs, nqs []int, pageTokens, kvHeads, heads, d int) batchCase {
	total := 0
	for _, n := range ctxs {
		total += (n + pageTokens - 1) / pageTokens
	}
	numPages := total + 3 // a few pages nobody uses
	c := &PagedKV{K: make([]float32, numPages*pageTokens*kvHeads*d), V: make([]float32, numPages*pageTokens*kvHeads*d),
		PageTokens: pageTokens, KVHeads: kvHeads, HeadDim: d}
	for i := range c.K {
		c.K[i], c.V[i] = r.Float32()*2-1, r.Float32()*2-1
	}
	free := r.Perm(numPages)
	bc := batchCase{c: c, heads: heads}
	b := &bc.b
	b.QueryStart, b.PageStart = []int32{0}, []int32{0}
	for i, n := range ctxs {
		for range (n + pageTokens - 1) / pageTokens {
			b.Pages = append(b.Pages, uint32(free[0]))
			free = free[1:]
		}
		b.CtxLen = append(b.CtxLen, int32(n))
		b.QueryStart = append(b.QueryStart, b.QueryStart[i]+int32(nqs[i]))
		b.PageStart = append(b.PageStart, int32(len(b.Pages)))
	}
	bc.q = randSlice(r, int(b.QueryStart[len(ctxs)])*heads*d)
	return bc
}

// serial is PagedAttention run sequence by sequence: the spec PagedAttentionBatch must meet.
func (bc *batchCase) serial(t *testing.T, a Attention) []float32 {
	t.Helper()
	d := bc.c.HeadDim
	out := make([]float32, len(bc.q))
	for i := range bc.b.CtxLen {
		q0, q1 := int(bc.b.QueryStart[i]), int(bc.b.QueryStart[i+1])
		pages := bc.b.Pages[bc.b.PageStart[i]:bc.b.PageStart[i+1]]
		rows := a.Heads * d
		if err := PagedAttention(out[q0*rows:q1*rows], bc.q[q0*rows:q1*rows], bc.c, pages, int(bc.b.CtxLen[i]), q1-q0, a); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// withSplitting sets PagedAttentionBatch's work split for one test.
func withSplitting(t *testing.T, gemmQueries, gemmTile, tile, splitQueries, splitKeys int) {
	t.Helper()
	oldGQ, oldGT, oldT, oldQ, oldK := attnGEMMQueries, attnGEMMTile, attnTileQueries, attnSplitQueries, attnSplitKeys
	attnGEMMQueries, attnGEMMTile, attnTileQueries, attnSplitQueries, attnSplitKeys = gemmQueries, gemmTile, tile, splitQueries, splitKeys
	t.Cleanup(func() {
		attnGEMMQueries, attnGEMMTile, attnTileQueries, attnSplitQueries, attnSplitKeys = oldGQ, oldGT, oldT, oldQ, oldK
	})
}

func TestPagedAttentionBatchMatchesSerial(t *testing.T) {
	shapes := []struct {
		name                string
		kvHeads, heads, d   int
		pageTokens, windows int
	}{
		{"gqa", 2, 8, 16, 4, 0},
		{"mqa", 1, 4, 8, 3, 0},
		{"mha", 3, 3, 8, 5, 0},
		{"gqa-window", 2, 6, 8, 4, 7},
	}
	splits := []struct {
		name                                                 string
		gemmQueries, gemmTile, tile, splitQueries, splitKeys int
	}{
		{"default", attnGEMMQueries, attnGEMMTile, attnTileQueries, attnSplitQueries, attnSplitKeys},
		{"small-tiles-and-key-splits", 1 << 20, 1, 3, 4, 5},
		{"split-everything", 1 << 20, 1, 1, 1 << 20, 1},
		{"gemm-from-2-queries-small-tiles", 2, 3, 3, 4, 5},
		{"gemm-everything-one-tile", 1, 1 << 20, 1, 0, 1 << 20},
	}
	for _, sp := range splits {
		for _, sh := range shapes {
			for _, unitKeys := range []int{1 << 20, 1, 0} { // units in loops; as GEMMs; even with no key in a split
				for _, vecQueries := range []int{attnVecQueries, 0} { // small units on the AVX2 kernels; never
					t.Run(fmt.Sprintf("%s/%s/unit-gemm-keys=%d/vec-queries=%d", sp.name, sh.name, unitKeys, vecQueries), func(t *testing.T) {
						withSplitting(t, sp.gemmQueries, sp.gemmTile, sp.tile, sp.splitQueries, sp.splitKeys)
						oldVec := attnVecQueries
						attnVecQueries = vecQueries
						t.Cleanup(func() { attnVecQueries = oldVec })
						old, oldGonum := attnUnitGEMMKeys, attnUnitGEMMKeysGonum
						attnUnitGEMMKeys, attnUnitGEMMKeysGonum = unitKeys, unitKeys
						oldUnits := attnGEMMUnits
						attnGEMMUnits = unitKeys != 1 // long sequences as units on a BLAS, but for one run
						t.Cleanup(func() { attnUnitGEMMKeys, attnUnitGEMMKeysGonum, attnGEMMUnits = old, oldGonum, oldUnits })
						r := rand.New(rand.NewPCG(uint64(sh.heads), uint64(sp.tile)))
						// Prefills, a chunk, decodes, a few drafts and an idle sequence together.
						ctxs := []int{1, 17, 23, 9, 30, 12, 6}
						nqs := []int{1, 17, 5, 1, 1, 3, 0}
						bc := randomBatch(r, ctxs, nqs, sh.pageTokens, sh.kvHeads, sh.heads, sh.d)
						a := Attention{Heads: sh.heads, Scale: float32(1 / math.Sqrt(float64(sh.d))), Window: sh.windows}
						want := bc.serial(t, a)
						got := make([]float32, len(want))
						for i := range got {
							got[i] = float32(math.NaN()) // every row must be written
						}
						if err := PagedAttentionBatch(got, bc.q, bc.c, &bc.b, a); err != nil {
							t.Fatal(err)
						}
						near(t, "PagedAttentionBatch", got, want, 1e-5)
					})
				}
			}
		}
	}
}

// TestPagedAttentionBatchLongContext decodes on contexts long enough for the default
// split of keys into blocks, and prefills a chunk long enough for two default GEMM tiles,
// with and without a sliding window.
func TestPagedAttentionBatchLongContext(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	ctxs := []int{3 * attnSplitKeys / 2, 2*attnSplitKeys + 7, 40, attnSplitKeys + 1, attnGEMMTile + 70}
	nqs := []int{1, 2, 1, 4, attnGEMMTile + 30} // the last: a chunk of two GEMM tiles
	bc := randomBatch(r, ctxs, nqs, 16, 2, 8, 32)
	for _, window := range []int{0, attnSplitKeys / 3, attnSplitKeys + 100} {
		a := Attention{Heads: 8, Scale: float32(1 / math.Sqrt(32)), Window: window}
		want := bc.serial(t, a)
		got := make([]float32, len(want))
		if err := PagedAttentionBatch(got, bc.q, bc.c, &bc.b, a); err != nil {
			t.Fatal(err)
		}
		near(t, "PagedAttentionBatch long context", got, want, 1e-5)
	}
}

func TestPagedAttentionBatchErrors(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	a := Attention{Heads: 4, Scale: 0.5}
	cases := []struct {
		name   string
		break_ func(bc *batchCase)
	}{
		{"page outside the cache", func(bc *batchCase) { bc.b.Pages[1] = 1 << 20 }},
		{"more queries than context", func(bc *batchCase) { bc.b.CtxLen[0] = 1 }},
		{"too few pages", func(bc *batchCase) { bc.b.CtxLen[1] += 8 }},
		{"short q", func(bc *batchCase) { bc.q = bc.q[:len(bc.q)-1] }},
		{"short starts", func(bc *batchCase) { bc.b.QueryStart = bc.b.QueryStart[:1] }},
	}
	for _, tc := range cases {
		bc := randomBatch(r, []int{6, 9}, []int{2, 1}, 4, 2, 4, 8)
		tc.break_(&bc)
		out := make([]float32, 3*4*8)
		if err := PagedAttentionBatch(out, bc.q, bc.c, &bc.b, a); err == nil {
			t.Errorf("%s: no error", tc.name)
		}
	}
}

// TestPagedAttentionBatchAllocatesNothing: decode steps (split keys included) allocate
// nothing once the scratch has grown. (A prefill's GEMMs allocate what MatMul does.)
func TestPagedAttentionBatchAllocatesNothing(t *testing.T) {
	r := rand.New(rand.NewPCG(15, 16))
	bc := randomBatch(r, []int{700, 33, 64}, []int{1, 1, 3}, 16, 2, 8, 16)
	a := Attention{Heads: 8, Scale: 0.25}
	out := make([]float32, len(bc.q))
	run := func() {
		if err := PagedAttentionBatch(out, bc.q, bc.c, &bc.b, a); err != nil {
			t.Fatal(err)
		}
	}
	run() // grows the scratch
	if n := testing.AllocsPerRun(20, run); n != 0 {
		t.Errorf("PagedAttentionBatch allocates %.1f times per call in steady state", n)
	}
}

func BenchmarkPagedAttentionBatch(b *testing.B) {
	r := rand.New(rand.NewPCG(17, 18))
	a := Attention{Heads: 16, Scale: 0.125}
	for _, bm := range []struct {
		name     string
		ctxs, nq []int
	}{
		{"prefill-512", []int{512}, []int{512}},
		{"decode-8x544", []int{544, 544, 544, 544, 544, 544, 544, 544}, []int{1, 1, 1, 1, 1, 1, 1, 1}},
		{"decode-1x4096", []int{4096}, []int{1}},
	} {
		bc := randomBatch(r, bm.ctxs, bm.nq, 16, 4, 16, 64)
		out := make([]float32, len(bc.q))
		b.Run(bm.name+"/batch", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := PagedAttentionBatch(out, bc.q, bc.c, &bc.b, a); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(bm.name+"/serial", func(b *testing.B) {
			for b.Loop() {
				for i := range bc.b.CtxLen {
					q0, q1 := int(bc.b.QueryStart[i]), int(bc.b.QueryStart[i+1])
					rows := a.Heads * 64
					if err := PagedAttention(out[q0*rows:q1*rows], bc.q[q0*rows:q1*rows], bc.c, bc.b.Pages[bc.b.PageStart[i]:bc.b.PageStart[i+1]], int(bc.b.CtxLen[i]), q1-q0, a); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}

// TestRowMax checks rowMax against the max builtin over v·scale, for positive and
// negative scales.
func TestRowMax(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	for n := 1; n < 40; n++ {
		row := make([]float32, n)
		for i := range row {
			row[i] = r.Float32()*20 - 10
		}
		for _, scale := range []float32{0.125, 1, -0.5} {
			want := float32(math.Inf(-1))
			for _, v := range row {
				want = max(want, v*scale)
			}
			if got := rowMax(row, scale); got != want {
				t.Fatalf("n=%d scale=%v: rowMax %v, want %v", n, scale, got, want)
			}
		}
	}
}

// BenchmarkPagedAttentionDecodeLayers decodes one token (and a batch of 8) at a context of
// 544 across 48 layers' caches of the ~120M llama's shape (4 kv heads, 16 query heads, head
// dim 64), one layer a call in turn: the 48 layers' keys and values (100 MiB for one
// sequence) do not stay in L3, so they come from memory, as in a decode step whose weights
// stream through the cache between its layers. Reports the cache's bytes read per second.
func BenchmarkPagedAttentionDecodeLayers(b *testing.B) {
	const layers, ctx, kvHeads, heads, d = 48, 544, 4, 16, 64
	a := Attention{Heads: heads, Scale: 0.125}
	for _, seqs := range []int{1, 8} {
		r := rand.New(rand.NewPCG(19, uint64(seqs)))
		ctxs, nqs := make([]int, seqs), make([]int, seqs)
		for i := range ctxs {
			ctxs[i], nqs[i] = ctx, 1
		}
		bcs := make([]batchCase, layers)
		for l := range bcs {
			bcs[l] = randomBatch(r, ctxs, nqs, 16, kvHeads, heads, d)
		}
		out := make([]float32, len(bcs[0].q))
		b.Run(fmt.Sprintf("seqs=%d", seqs), func(b *testing.B) {
			l, cpu0 := 0, processCPU()
			for b.Loop() {
				bc := &bcs[l%layers]
				if err := PagedAttentionBatch(out, bc.q, bc.c, &bc.b, a); err != nil {
					b.Fatal(err)
				}
				l++
			}
			bytes := float64(2*seqs*ctx*kvHeads*d*4) * float64(b.N)
			b.ReportMetric(bytes/b.Elapsed().Seconds()/1e9, "GB/s")
			if cpu := processCPU() - cpu0; cpu > 0 {
				b.ReportMetric(bytes/cpu.Seconds()/1e9, "GB/cpu-s")
			}
		})
	}
}
