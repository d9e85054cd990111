package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/kernels/ref"
)

// The float32 kernels on the emulated device. Their launchers (launch.go) pack their
// parameters straight into cudart.Args; legacy builds the same launch: the same grid,
// block and parameters in the same order (TestEmuLegacyLaunchesMatchSignatures checks
// them against the C signatures).

func legacy(file, entry string, grid, block cudart.Dim3, a *argBuf) emuLaunch {
	return emuLaunch{file: file, entry: entry, grid: grid, block: block, args: *a}
}

func launchRMSNorm(out, x, w cudart.DevicePtr, rows, dim int, eps float32) emuLaunch {
	var a argBuf
	a.ptr(out).ptr(x).ptr(w).i32(rows).i32(dim).f32(eps)
	return legacy("rmsnorm.cu", "resin_rmsnorm", cudart.D1(rows), cudart.D1(rowThreads), &a)
}

func launchRope(entry string, x, pos cudart.DevicePtr, t Rope, rows, heads, headDim int) emuLaunch {
	var a argBuf
	grid, block := elementwise(rows * heads * t.Dim / 2)
	a.ptr(x).ptr(pos).ptr(t.Cos).ptr(t.Sin).i32(rows).i32(heads).i32(headDim).i32(t.Dim).i32(t.MaxPos)
	return legacy("rotary.cu", entry, grid, block, &a)
}

func launchSiLUMul(out, gateUp cudart.DevicePtr, rows, dim int) emuLaunch {
	var a argBuf
	grid, block := elementwise(rows * dim)
	a.ptr(out).ptr(gateUp).i32(rows).i32(dim)
	return legacy("silu_mul.cu", "resin_silu_mul", grid, block, &a)
}

func launchSiLUMulSplit(out, gate, up cudart.DevicePtr, n int) emuLaunch {
	var a argBuf
	grid, block := elementwise(n)
	a.ptr(out).ptr(gate).ptr(up).i64(int64(n))
	return legacy("silu_mul.cu", "resin_silu_mul_split", grid, block, &a)
}

func launchSoftmax(x cudart.DevicePtr, rows, n int) emuLaunch {
	var a argBuf
	a.ptr(x).i32(rows).i32(n)
	return legacy("softmax.cu", "resin_softmax", cudart.D1(rows), cudart.D1(rowThreads), &a)
}

func launchEmbedding(out, table, ids cudart.DevicePtr, tokens, dim, vocab int) emuLaunch {
	var a argBuf
	grid, block := elementwise(tokens * dim)
	a.ptr(out).ptr(table).ptr(ids).i32(tokens).i32(dim).i32(vocab)
	return legacy("embedding.cu", "resin_embedding", grid, block, &a)
}

func launchPagedAttention(t testing.TB, p PagedAttention) emuLaunch {
	if err := p.check(); err != nil {
		t.Fatal(err)
	}
	l := p.Layout
	var a argBuf
	a.ptr(p.Out).ptr(p.Q).ptr(p.KCache).ptr(p.VCache).ptr(p.PageTable).ptr(p.CtxLens).
		i32(p.NQ).i32(p.Heads).i32(p.KVHeads).i32(p.HeadDim).i32(p.PageTokens).i32(p.MaxPages).f32(p.Scale).i32(p.Window).
		i64(l.SlabElems).i64(l.PageElems).i64(l.KOffset).i64(l.VOffset)
	grid := cudart.Dim3{X: uint32(p.Heads), Y: uint32(p.Batch), Z: uint32(p.NQ)}
	return legacy("paged_attention.cu", "resin_paged_attention", grid, cudart.D1(attnThread), &a)
}

func launchMoETopK(r MoERouting) emuLaunch {
	scale := r.Scale
	if scale == 0 {
		scale = 1
	}
	var a argBuf
	a.ptr(r.Weights).ptr(r.IDs).ptr(r.Logits).ptr(r.Bias).i32(r.Tokens).i32(r.Experts).i32(r.TopK).
		i32(int(r.Scoring)).flag(r.Renormalize).f32(scale).i32(max(r.Groups, 1)).i32(r.GroupTopK)
	return legacy("moe_topk.cu", "resin_moe_topk", cudart.D1(r.Tokens), cudart.D1(32), &a)
}

func launchArgmax(out, x cudart.DevicePtr, rows, n int) emuLaunch {
	var a argBuf
	a.ptr(out).ptr(x).i32(rows).i32(n)
	return legacy("argmax.cu", "resin_argmax", cudart.D1(rows), cudart.D1(rowThreads), &a)
}

// TestEmuLegacyLaunchesMatchSignatures checks legacy's launches kind by kind against the
// kernels' C signatures, as TestPackingMatchesSignatures does for launchSpec.
func TestEmuLegacyLaunchesMatchSignatures(t *testing.T) {
	rope := Rope{Cos: 1, Sin: 2, Dim: 64, MaxPos: 10}
	pa := PagedAttention{Out: 1, Q: 2, KCache: 3, VCache: 3, PageTable: 4, CtxLens: 5, Layout: PackedKV(16 * 2 * 64),
		Batch: 1, NQ: 1, Heads: 4, KVHeads: 2, HeadDim: 64, PageTokens: 16, MaxPages: 2, Scale: 1}
	for _, l := range []emuLaunch{
		launchRMSNorm(1, 2, 3, 4, 5, 1e-6),
		launchRope("resin_rope_neox", 1, 2, rope, 3, 4, 64),
		launchRope("resin_rope_interleaved", 1, 2, rope, 3, 4, 64),
		launchSiLUMul(1, 2, 3, 4),
		launchSiLUMulSplit(1, 2, 3, 4),
		launchSoftmax(1, 2, 3),
		launchEmbedding(1, 2, 3, 4, 5, 6),
		launchPagedAttention(t, pa),
		launchMoETopK(MoERouting{Weights: 1, IDs: 2, Logits: 3, Tokens: 4, Experts: 8, TopK: 2}),
		launchArgmax(1, 2, 3, 4),
	} {
		want := signature(t, l.file, l.entry)
		got := l.args.kinds[:l.args.n]
		if len(got) != len(want) {
			t.Errorf("%s: %d parameters, the kernel takes %d", l.entry, len(got), len(want))
			continue
		}
		for i := range want {
			if got[i] != want[i] {
				t.Errorf("%s: parameter %d is kind %d, the kernel declares %d", l.entry, i, got[i], want[i])
			}
		}
	}
}

// specialRow fills a row with the values that break reductions: ±0, NaN, ±inf, ties.
func specialRow(r *rand.Rand, n int, scale float32) []float32 {
	row := make([]float32, n)
	for i := range row {
		switch r.IntN(12) {
		case 0:
			row[i] = 0
		case 1:
			row[i] = float32(math.Copysign(0, -1))
		case 2:
			row[i] = 3 // ties
		default:
			row[i] = (r.Float32()*2 - 1) * scale
		}
	}
	return row
}

func TestEmuRMSNorm(t *testing.T) {
	emuKernels(t)
	for _, dim := range []int{1, 7, 100, 255, 256, 257, 1000, 4096} {
		const rows = 4
		x, w := emuRnd(uint64(dim), rows*dim, 3), emuRnd(uint64(dim)+1, dim, 1)
		x[0] = float32(math.Copysign(0, -1))
		want := make([]float32, rows*dim)
		if err := ref.RMSNorm(want, x, w, rows, dim, 1e-6); err != nil {
			t.Fatal(err)
		}
		m := &emuMem{t: t}
		xd, wd, out := m.f32(x), m.f32(w), m.alloc(4*rows*dim)
		emuRun(t, fmt.Sprintf("rmsnorm dim %d", dim), m, launchRMSNorm(out, xd, wd, rows, dim, 1e-6))
		emuClose(t, fmt.Sprintf("rmsnorm dim %d", dim), m.getF32(out, rows*dim), want, 2e-6)
		// In place, as ref.RMSNorm allows (out may alias x).
		emuRun(t, fmt.Sprintf("rmsnorm in place dim %d", dim), m, launchRMSNorm(xd, xd, wd, rows, dim, 1e-6))
		emuClose(t, fmt.Sprintf("rmsnorm in place dim %d", dim), m.getF32(xd, rows*dim), want, 2e-6)
	}
}

// TestEmuRMSNormMayAlias: ref.RMSNorm lets out alias x, and RMSNormBF16 says so too, so
// no normalising kernel may promise the compiler (__restrict__) that they are distinct.
func TestEmuRMSNormMayAlias(t *testing.T) {
	for _, k := range []struct{ file, entry string }{
		{"rmsnorm.cu", "resin_rmsnorm"}, {"add_rmsnorm.cu", "resin_rmsnorm_bf16"},
	} {
		ps := kernelParams(t, k.file, k.entry)
		for _, p := range ps[:2] { // out, x
			if strings.Contains(p, "__restrict__") {
				t.Errorf("%s: parameter %q is __restrict__, but out may alias x", k.entry, p)
			}
		}
	}
}

func TestEmuRoPE(t *testing.T) {
	emuKernels(t)
	for _, c := range []struct{ heads, headDim, rot int }{{4, 64, 64}, {3, 80, 32}, {2, 256, 256}, {5, 100, 64}} {
		tab, err := ref.NewRopeTable(c.rot, 64, 10000)
		if err != nil {
			t.Fatal(err)
		}
		pos := []int32{0, 1, 63, 64, -1, 17, 5}
		rows := len(pos)
		for _, entry := range []string{"resin_rope_neox", "resin_rope_interleaved"} {
			x := emuRnd(3, rows*c.heads*c.headDim, 2)
			want := append([]float32(nil), x...)
			rot := tab.RoPENeoX
			if entry == "resin_rope_interleaved" {
				rot = tab.RoPEInterleaved
			}
			// The reference refuses positions outside the table; the kernel leaves them alone.
			for r, p := range pos {
				if p >= 0 && int(p) < tab.MaxPos {
					row := want[r*c.heads*c.headDim : (r+1)*c.heads*c.headDim]
					if err := rot(row, pos[r:r+1], 1, c.heads, c.headDim); err != nil {
						t.Fatal(err)
					}
				}
			}
			m := &emuMem{t: t}
			xd := m.f32(x)
			rope := Rope{Cos: m.f32(tab.Cos), Sin: m.f32(tab.Sin), Dim: tab.Dim, MaxPos: tab.MaxPos}
			name := fmt.Sprintf("%s heads %d dim %d rot %d", entry, c.heads, c.headDim, c.rot)
			emuRun(t, name, m, launchRope(entry, xd, m.i32(pos), rope, rows, c.heads, c.headDim))
			emuMaxUlps(t, name, m.getF32(xd, len(x)), want, 0)
		}
	}
}

func TestEmuSiLUMul(t *testing.T) {
	emuKernels(t)
	for _, c := range []struct{ rows, dim int }{{1, 1}, {3, 100}, {7, 1536}, {300, 300}} {
		gu := emuRnd(5, c.rows*2*c.dim, 8)
		gu[0], gu[1] = float32(math.Inf(1)), float32(math.Inf(-1))
		want := make([]float32, c.rows*c.dim)
		if err := ref.SiLUMul(want, gu, c.rows, c.dim); err != nil {
			t.Fatal(err)
		}
		m := &emuMem{t: t}
		gd, out := m.f32(gu), m.alloc(4*c.rows*c.dim)
		name := fmt.Sprintf("silu_mul %dx%d", c.rows, c.dim)
		emuRun(t, name, m, launchSiLUMul(out, gd, c.rows, c.dim))
		emuClose(t, name, m.getF32(out, c.rows*c.dim), want, 1e-6)

		n := c.rows * c.dim
		gate, up := gu[:n], gu[n:]
		wantS := make([]float32, n)
		if err := ref.SiLUMulSplit(wantS, gate, up, c.rows, c.dim); err != nil {
			t.Fatal(err)
		}
		outS := m.alloc(4 * n)
		emuRun(t, name+" split", m, launchSiLUMulSplit(outS, m.f32(gate), m.f32(up), n))
		emuClose(t, name+" split", m.getF32(outS, n), wantS, 1e-6)
	}
}

func TestEmuSoftmax(t *testing.T) {
	emuKernels(t)
	r := rand.New(rand.NewPCG(8, 9))
	for _, n := range []int{1, 31, 256, 257, 1000, 3001} {
		const rows = 3
		x := append(append(specialRow(r, n, 20), emuRnd(uint64(n), n, 5)...), emuRnd(uint64(n)+1, n, 50)...)
		x[n+n/2] = float32(math.Inf(-1)) // a masked score
		want := append([]float32(nil), x...)
		if err := ref.Softmax(want, rows, n); err != nil {
			t.Fatal(err)
		}
		m := &emuMem{t: t}
		xd := m.f32(x)
		name := fmt.Sprintf("softmax n %d", n)
		emuRun(t, name, m, launchSoftmax(xd, rows, n))
		emuClose(t, name, m.getF32(xd, rows*n), want, 1e-6)
	}
}

func TestEmuEmbedding(t *testing.T) {
	emuKernels(t)
	const dim, vocab = 100, 37
	table := emuRnd(11, vocab*dim, 1)
	ids := []int32{0, 36, 5, 5, -1, 37, 12}
	want := make([]float32, len(ids)*dim)
	if err := ref.Embedding(want[:4*dim], table, ids[:4], dim); err != nil {
		t.Fatal(err)
	}
	if err := ref.Embedding(want[6*dim:], table, ids[6:], dim); err != nil {
		t.Fatal(err)
	}
	m := &emuMem{t: t}
	out := m.alloc(4 * len(want))
	emuRun(t, "embedding", m, launchEmbedding(out, m.f32(table), m.i32(ids), len(ids), dim, vocab))
	emuMaxUlps(t, "embedding", m.getF32(out, len(want)), want, 0) // rows of ids outside the table are zero
}

func TestEmuArgmax(t *testing.T) {
	emuKernels(t)
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	negz := float32(math.Copysign(0, -1))
	r := rand.New(rand.NewPCG(12, 13))
	const n = 1001
	var rows [][]float32
	mk := func(f func(i int) float32) {
		row := make([]float32, n)
		for i := range row {
			row[i] = f(i)
		}
		rows = append(rows, row)
	}
	mk(func(int) float32 { return nan })                                                // all NaN: 0
	mk(func(i int) float32 { return map[bool]float32{true: negz, false: 0}[i%2 == 0] }) // ±0 tie: the first
	mk(func(int) float32 { return float32(math.Inf(-1)) })                              // all -inf: 0
	mk(func(i int) float32 {
		if i == 700 || i == 900 {
			return inf
		}
		if i%3 == 0 {
			return nan
		}
		return 5
	})
	mk(func(i int) float32 { return float32(i % 10) }) // ties at 9
	rows = append(rows, specialRow(r, n, 4))
	var x []float32
	for _, row := range rows {
		x = append(x, row...)
	}
	want := make([]int32, len(rows))
	if err := ref.ArgmaxRows(want, x, len(rows), n); err != nil {
		t.Fatal(err)
	}
	m := &emuMem{t: t}
	out := m.alloc(4 * len(rows))
	emuRun(t, "argmax", m, launchArgmax(out, m.f32(x), len(rows), n))
	got := m.getI32(out, len(rows))
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("argmax row %d: %d, ref %d", i, got[i], want[i])
		}
	}
	// The row of NaN: engine's argmax takes token 0 (an MTP draft chained on the device
	// embeds it), not -1.
	if got[0] != 0 {
		t.Errorf("argmax of a row of NaN: %d, engine's sampler takes 0", got[0])
	}
}

func TestEmuMoETopK(t *testing.T) {
	emuKernels(t)
	for _, c := range []struct {
		name    string
		experts int
		r       ref.Routing
	}{
		{"softmax top-2 of 8", 8, ref.Routing{TopK: 2, Scoring: ref.ScoreSoftmax}},
		{"softmax top-6 of 60 renorm", 60, ref.Routing{TopK: 6, Scoring: ref.ScoreSoftmax, Renormalize: true}},
		{"sigmoid biased groups", 256, ref.Routing{TopK: 8, Scoring: ref.ScoreSigmoid, Renormalize: true, Groups: 8, GroupTopK: 4, Scale: 2.5}},
		{"sigmoid 1000 experts", 1000, ref.Routing{TopK: 3, Scoring: ref.ScoreSigmoid}},
		{"one group per expert", 32, ref.Routing{TopK: 4, Scoring: ref.ScoreSigmoid, Groups: 32, GroupTopK: 5}},
	} {
		const tokens = 5
		logits := emuRnd(uint64(c.experts), tokens*c.experts, 3)
		for e := 0; e < c.experts; e += 7 { // ties
			logits[e] = 1
		}
		if c.r.Scoring == ref.ScoreSigmoid {
			c.r.Bias = emuRnd(99, c.experts, 0.1)
		}
		wantW, wantID := make([]float32, tokens*c.r.TopK), make([]int32, tokens*c.r.TopK)
		if err := ref.MoETopK(wantW, wantID, logits, tokens, c.experts, c.r); err != nil {
			t.Fatal(err)
		}
		m := &emuMem{t: t}
		w, ids := m.alloc(4*len(wantW)), m.alloc(4*len(wantID))
		var bias cudart.DevicePtr
		if c.r.Bias != nil {
			bias = m.f32(c.r.Bias)
		}
		emuRun(t, c.name, m, launchMoETopK(MoERouting{Weights: w, IDs: ids, Logits: m.f32(logits), Bias: bias, Tokens: tokens,
			Experts: c.experts, TopK: c.r.TopK, Scoring: c.r.Scoring, Renormalize: c.r.Renormalize, Groups: c.r.Groups,
			GroupTopK: c.r.GroupTopK, Scale: c.r.Scale}))
		gotID := m.getI32(ids, len(wantID))
		for i := range wantID {
			if gotID[i] != wantID[i] {
				t.Fatalf("%s: choice %d is expert %d, ref %d (%v vs %v)", c.name, i, gotID[i], wantID[i], gotID, wantID)
			}
		}
		emuClose(t, c.name, m.getF32(w, len(wantW)), wantW, 2e-6)
	}
}

// f32Cache is a float32 paged cache of packed pages (PackedKV) or kvslab slabs.
func f32Attention(t testing.TB, m *emuMem, heads, kvHeads, headDim, nq, window int, ctx []int, slabs bool) (emuLaunch, cudart.DevicePtr, []float32) {
	const pageTokens = 16
	tokElems := kvHeads * headDim
	pageElems := pageTokens * tokElems
	maxPages := 0
	for _, c := range ctx {
		maxPages = max(maxPages, (c+pageTokens-1)/pageTokens)
	}
	batch := len(ctx)
	pagesTotal := batch * maxPages
	// Keys and values of a page side by side (K at 0, V at pageElems), pages shuffled over
	// two slabs or packed.
	layout := KVSlabLayout{SlabElems: int64(2*pageElems) << PageSlotBits, PageElems: int64(2 * pageElems), VOffset: int64(pageElems)}
	ids := make([]uint32, pagesTotal)
	r := rand.New(rand.NewPCG(uint64(headDim), uint64(heads)))
	perm := r.Perm(pagesTotal)
	arenaPages := pagesTotal
	if slabs {
		half := (pagesTotal + 1) / 2
		layout.SlabElems = int64(half * 2 * pageElems)
		for i, p := range perm {
			ids[i] = uint32(p/half)<<PageSlotBits | uint32(p%half)
		}
		arenaPages = 2 * half
	} else {
		for i, p := range perm {
			ids[i] = uint32(p)
		}
	}
	arena := emuRnd(uint64(headDim)*3, arenaPages*2*pageElems, 1)
	q := emuRnd(uint64(headDim)*5, batch*nq*heads*headDim, 1)
	kv := &ref.PagedKV{K: arena, V: arena, PageTokens: pageTokens, KVHeads: kvHeads, HeadDim: headDim,
		PageOffset:  func(p uint32) int { return int(layout.KeyOffset(p)) },
		VPageOffset: func(p uint32) int { return int(layout.ValueOffset(p)) }}
	want := make([]float32, len(q))
	row := nq * heads * headDim
	for b, c := range ctx {
		// With fewer tokens than queries the first nq-c rows have no key (the kernel writes
		// zeros) and the last c are the reference's c queries.
		n := min(c, nq)
		skip := (nq - n) * heads * headDim
		if err := ref.PagedAttention(want[b*row+skip:(b+1)*row], q[b*row+skip:(b+1)*row], kv, ids[b*maxPages:(b+1)*maxPages], c, n,
			ref.Attention{Heads: heads, Scale: float32(1 / math.Sqrt(float64(headDim))), Window: window}); err != nil {
			t.Fatal(err)
		}
	}
	lens := make([]int32, batch)
	for i, c := range ctx {
		lens[i] = int32(c)
	}
	ad := m.f32(arena)
	p := PagedAttention{Out: m.alloc(4 * len(q)), Q: m.f32(q), KCache: ad, VCache: ad, PageTable: m.u32(ids), CtxLens: m.i32(lens),
		Layout: layout, Batch: batch, NQ: nq, Heads: heads, KVHeads: kvHeads, HeadDim: headDim, PageTokens: pageTokens,
		MaxPages: maxPages, Scale: float32(1 / math.Sqrt(float64(headDim))), Window: window}
	return launchPagedAttention(t, p), p.Out, want
}

func TestEmuPagedAttention(t *testing.T) {
	emuKernels(t)
	for _, c := range []struct {
		heads, kvHeads, headDim, nq, window int
		ctx                                 []int
	}{
		{8, 2, 128, 1, 0, []int{1, 17, 600}}, // decode; 600 keys cross the 512-key chunk
		{4, 4, 32, 3, 0, []int{3, 40, 2}},    // speculative verify; a sequence shorter than its queries
		{32, 1, 80, 2, 20, []int{5, 100}},    // GQA 32, a window
		{6, 3, 100, 1, 0, []int{33}},         // head dim 100
		{2, 1, 256, 1, 7, []int{520}},        // head dim 256 (two per thread), window
		{16, 16, 64, 4, 0, []int{16, 4, 1030}},
	} {
		for _, slabs := range []bool{false, true} {
			m := &emuMem{t: t}
			l, out, want := f32Attention(t, m, c.heads, c.kvHeads, c.headDim, c.nq, c.window, c.ctx, slabs)
			name := fmt.Sprintf("paged attention h %d kv %d d %d nq %d window %d ctx %v slabs %v", c.heads, c.kvHeads, c.headDim, c.nq, c.window, c.ctx, slabs)
			emuRun(t, name, m, l)
			emuClose(t, name, m.getF32(out, len(want)), want, 2e-5)
		}
	}
}

// TestEmuParamSizesMatchPacking checks every launch's packed parameters, the production
// launchers' (launchSpec) and legacy's, against the parameter sizes of the kernel as g++
// compiled it: a parameter of the wrong width would read garbage on the GPU.
func TestEmuParamSizesMatchPacking(t *testing.T) {
	mods := emuKernels(t)
	var k Kernels
	packAll(t, &k)
	launches := []emuLaunch{}
	for id := range numKernels {
		if k.specs[id].kernel == id { // packAll's (kernels added since may not be there yet)
			launches = append(launches, fromSpec(&k.specs[id]))
		}
	}
	rope := Rope{Cos: 1, Sin: 2, Dim: 64, MaxPos: 10}
	pa := PagedAttention{Out: 1, Q: 2, KCache: 3, VCache: 3, PageTable: 4, CtxLens: 5, Layout: PackedKV(16 * 2 * 64),
		Batch: 1, NQ: 1, Heads: 4, KVHeads: 2, HeadDim: 64, PageTokens: 16, MaxPages: 2, Scale: 1}
	launches = append(launches, launchRMSNorm(1, 2, 3, 4, 5, 1e-6), launchRope("resin_rope_neox", 1, 2, rope, 3, 4, 64),
		launchRope("resin_rope_interleaved", 1, 2, rope, 3, 4, 64), launchSiLUMul(1, 2, 3, 4), launchSiLUMulSplit(1, 2, 3, 4),
		launchSoftmax(1, 2, 3), launchEmbedding(1, 2, 3, 4, 5, 6), launchPagedAttention(t, pa),
		launchMoETopK(MoERouting{Weights: 1, IDs: 2, Logits: 3, Tokens: 4, Experts: 8, TopK: 2}), launchArgmax(1, 2, 3, 4))
	size := map[argKind]uint32{argPtr: 8, argI32: 4, argI64: 8, argF32: 4}
	seen := map[string]bool{}
	for _, l := range launches {
		want, err := mods[l.file].ParamSizes(l.entry)
		if err != nil {
			t.Fatal(err)
		}
		seen[l.file+":"+l.entry] = true
		got := make([]uint32, l.args.n)
		for i := range got {
			got[i] = size[l.args.kinds[i]]
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: packed parameter sizes %v, the compiled kernel takes %v", l.entry, got, want)
		}
	}
	for _, e := range emuEntries(t) {
		if !seen[e] && emuCovered[e] {
			t.Errorf("%s: no launcher's packing checked", e)
		}
	}
}
