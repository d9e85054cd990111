//go:build gpu

package cuda

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/kernels/ref"
	"github.com/resin-llm/resin/core/kvslab"
)

// These tests need a GPU: go test -tags gpu ./core/kernels/cuda (scripts/gpu-check.sh).

func openKernels(t *testing.T) (*cudart.Device, *Kernels) {
	t.Helper()
	d, err := cudart.OpenDevice(0)
	if errors.Is(err, cudart.ErrNoCUDA) {
		t.Skipf("%s needs a GPU: %v", t.Name(), err)
	}
	if err != nil {
		t.Fatalf("open GPU 0: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	cache, err := cudart.OpenKernelCache(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	k, err := Load(d, cache)
	if err != nil {
		t.Fatalf("load kernels for %s: %v", d.Info.Arch(), err)
	}
	t.Cleanup(func() { k.Close() })
	return d, k
}

// dev uploads host data and frees it at the end of a Do.
type dev struct {
	t    *testing.T
	c    *cudart.Ctx
	bufs []cudart.Buffer
}

func (g *dev) alloc(bytes int) cudart.DevicePtr {
	b, err := g.c.Alloc(int64(max(bytes, 4)))
	if err != nil {
		g.t.Fatal(err)
	}
	g.bufs = append(g.bufs, b)
	if err := g.c.Memset(b.Ptr, 0, b.Size); err != nil {
		g.t.Fatal(err)
	}
	return b.Ptr
}

func (g *dev) f32(h []float32) cudart.DevicePtr {
	p := g.alloc(4 * len(h))
	if err := cudart.Upload(g.c, p, h); err != nil {
		g.t.Fatal(err)
	}
	return p
}

func (g *dev) i32(h []int32) cudart.DevicePtr {
	p := g.alloc(4 * len(h))
	if err := cudart.Upload(g.c, p, h); err != nil {
		g.t.Fatal(err)
	}
	return p
}

func (g *dev) u32(h []uint32) cudart.DevicePtr {
	p := g.alloc(4 * len(h))
	if err := cudart.Upload(g.c, p, h); err != nil {
		g.t.Fatal(err)
	}
	return p
}

func (g *dev) getF32(p cudart.DevicePtr, n int) []float32 {
	if err := g.c.Synchronize(); err != nil {
		g.t.Fatal(err)
	}
	out := make([]float32, n)
	if err := cudart.Download(g.c, out, p); err != nil {
		g.t.Fatal(err)
	}
	return out
}

func (g *dev) getI32(p cudart.DevicePtr, n int) []int32 {
	if err := g.c.Synchronize(); err != nil {
		g.t.Fatal(err)
	}
	out := make([]int32, n)
	if err := cudart.Download(g.c, out, p); err != nil {
		g.t.Fatal(err)
	}
	return out
}

func (g *dev) free() {
	for _, b := range g.bufs {
		g.c.Free(b)
	}
}

// on runs fn inside Do with a dev helper.
func on(t *testing.T, d *cudart.Device, fn func(g *dev)) {
	t.Helper()
	if err := d.Do(func(c *cudart.Ctx) error {
		g := &dev{t: t, c: c}
		defer g.free()
		fn(g)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

func rnd(seed uint64, n int, scale float32) []float32 {
	r := rand.New(rand.NewPCG(seed, 7))
	s := make([]float32, n)
	for i := range s {
		s[i] = (r.Float32()*2 - 1) * scale
	}
	return s
}

// parity fails when got and want differ by more than tol·(1+|want|) and logs the largest
// difference.
func parity(t *testing.T, name string, got, want []float32, tol float64) {
	t.Helper()
	worst, at := 0.0, -1
	for i := range want {
		d := math.Abs(float64(got[i] - want[i]))
		if math.IsNaN(float64(got[i])) {
			d = math.Inf(1)
		}
		if d > worst {
			worst, at = d, i
		}
		if d > tol*(1+math.Abs(float64(want[i]))) {
			t.Fatalf("%s[%d] = %g, reference %g (|Δ| %g)", name, i, got[i], want[i], d)
		}
	}
	t.Logf("parity %-22s %8d values  max|Δ| %.3g (at %d)", name, len(want), worst, at)
}

func TestGPURMSNorm(t *testing.T) {
	d, k := openKernels(t)
	for _, dim := range []int{4096, 1000, 7} {
		rows := 9
		x, w := rnd(1, rows*dim, 3), rnd(2, dim, 1)
		want := make([]float32, rows*dim)
		ref.RMSNorm(want, x, w, rows, dim, 1e-6)
		on(t, d, func(g *dev) {
			out := g.alloc(4 * rows * dim)
			if err := k.RMSNorm(g.c, nil, out, g.f32(x), g.f32(w), rows, dim, 1e-6); err != nil {
				t.Fatal(err)
			}
			parity(t, "rmsnorm", g.getF32(out, rows*dim), want, 1e-5)
		})
	}
}

func TestGPURoPE(t *testing.T) {
	d, k := openKernels(t)
	const rows, heads, headDim, maxPos = 6, 4, 128, 4096
	for _, rot := range []int{128, 64} { // full and partial rotary
		tab, err := ref.NewRopeTable(rot, maxPos, 10000)
		if err != nil {
			t.Fatal(err)
		}
		pos := []int32{0, 1, 17, 4095, 300, 2048}
		for _, interleaved := range []bool{false, true} {
			x := rnd(3, rows*heads*headDim, 1)
			want := append([]float32(nil), x...)
			if interleaved {
				tab.RoPEInterleaved(want, pos, rows, heads, headDim)
			} else {
				tab.RoPENeoX(want, pos, rows, heads, headDim)
			}
			on(t, d, func(g *dev) {
				xd := g.f32(x)
				rope := Rope{Cos: g.f32(tab.Cos), Sin: g.f32(tab.Sin), Dim: tab.Dim, MaxPos: tab.MaxPos}
				launch := k.RoPENeoX
				name := "rope-neox"
				if interleaved {
					launch, name = k.RoPEInterleaved, "rope-interleaved"
				}
				if err := launch(g.c, nil, xd, g.i32(pos), rope, rows, heads, headDim); err != nil {
					t.Fatal(err)
				}
				parity(t, name, g.getF32(xd, len(x)), want, 1e-5)
			})
		}
	}
}

func TestGPUSiLUMul(t *testing.T) {
	d, k := openKernels(t)
	const rows, dim = 5, 1536
	gu := rnd(4, rows*2*dim, 6)
	want := make([]float32, rows*dim)
	ref.SiLUMul(want, gu, rows, dim)
	gate, up := rnd(5, rows*dim, 6), rnd(6, rows*dim, 6)
	want2 := make([]float32, rows*dim)
	ref.SiLUMulSplit(want2, gate, up, rows, dim)
	on(t, d, func(g *dev) {
		out := g.alloc(4 * rows * dim)
		if err := k.SiLUMul(g.c, nil, out, g.f32(gu), rows, dim); err != nil {
			t.Fatal(err)
		}
		parity(t, "silu-mul", g.getF32(out, rows*dim), want, 1e-5)
		if err := k.SiLUMulSplit(g.c, nil, out, g.f32(gate), g.f32(up), rows*dim); err != nil {
			t.Fatal(err)
		}
		parity(t, "silu-mul-split", g.getF32(out, rows*dim), want2, 1e-5)
	})
}

func TestGPUSoftmax(t *testing.T) {
	d, k := openKernels(t)
	const rows, n = 3, 151936 // a vocabulary-sized row
	x := rnd(7, rows*n, 20)
	want := append([]float32(nil), x...)
	ref.Softmax(want, rows, n)
	on(t, d, func(g *dev) {
		xd := g.f32(x)
		if err := k.Softmax(g.c, nil, xd, rows, n); err != nil {
			t.Fatal(err)
		}
		parity(t, "softmax", g.getF32(xd, rows*n), want, 1e-6)
	})
}

func TestGPUEmbedding(t *testing.T) {
	d, k := openKernels(t)
	const vocab, dim = 1000, 256
	table := rnd(8, vocab*dim, 1)
	ids := []int32{0, 999, 5, 5, 421}
	want := make([]float32, len(ids)*dim)
	ref.Embedding(want, table, ids, dim)
	on(t, d, func(g *dev) {
		out := g.alloc(4 * len(want))
		if err := k.Embedding(g.c, nil, out, g.f32(table), g.i32(ids), len(ids), dim, vocab); err != nil {
			t.Fatal(err)
		}
		parity(t, "embedding", g.getF32(out, len(want)), want, 0)
	})
}

func TestGPUArgmax(t *testing.T) {
	d, k := openKernels(t)
	const rows, n = 4, 50000
	x := rnd(9, rows*n, 1)
	x[1*n+7], x[1*n+40000] = 5, 5 // a tie: the first wins
	x[2*n+n-1] = 9
	nan := float32(math.NaN())
	for i := 0; i < n; i++ {
		if i%3 == 0 {
			x[3*n+i] = nan
		}
	}
	want := make([]int32, rows)
	ref.ArgmaxRows(want, x, rows, n)
	on(t, d, func(g *dev) {
		out := g.alloc(4 * rows)
		if err := k.Argmax(g.c, nil, out, g.f32(x), rows, n); err != nil {
			t.Fatal(err)
		}
		got := g.getI32(out, rows)
		for r := range want {
			if got[r] != want[r] {
				t.Fatalf("argmax row %d = %d, reference %d", r, got[r], want[r])
			}
		}
		t.Logf("parity argmax %v", got)
	})
}

func TestGPUMoETopK(t *testing.T) {
	d, k := openKernels(t)
	const tokens, experts, topK = 7, 256, 8
	logits := rnd(10, tokens*experts, 4)
	bias := rnd(11, experts, 0.5)
	for _, r := range []ref.Routing{
		{TopK: topK, Scoring: ref.ScoreSoftmax, Renormalize: false},
		{TopK: topK, Scoring: ref.ScoreSigmoid, Renormalize: true, Bias: bias, Scale: 2.5},
		{TopK: topK, Scoring: ref.ScoreSigmoid, Renormalize: true, Bias: bias, Groups: 8, GroupTopK: 4, Scale: 2.5},
	} {
		wantW, wantID := make([]float32, tokens*topK), make([]int32, tokens*topK)
		if err := ref.MoETopK(wantW, wantID, logits, tokens, experts, r); err != nil {
			t.Fatal(err)
		}
		on(t, d, func(g *dev) {
			w, ids := g.alloc(4*tokens*topK), g.alloc(4*tokens*topK)
			var b cudart.DevicePtr
			if r.Bias != nil {
				b = g.f32(r.Bias)
			}
			if err := k.MoETopK(g.c, nil, MoERouting{Weights: w, IDs: ids, Logits: g.f32(logits), Bias: b, Tokens: tokens,
				Experts: experts, TopK: topK, Scoring: r.Scoring, Renormalize: r.Renormalize, Groups: r.Groups,
				GroupTopK: r.GroupTopK, Scale: r.Scale}); err != nil {
				t.Fatal(err)
			}
			gotID := g.getI32(ids, tokens*topK)
			for i := range wantID {
				if gotID[i] != wantID[i] {
					t.Fatalf("scoring %d: ids[%d] = %d, reference %d", r.Scoring, i, gotID[i], wantID[i])
				}
			}
			parity(t, "moe-topk weights", g.getF32(w, tokens*topK), wantW, 1e-5)
		})
	}
}

func TestGPUPagedAttention(t *testing.T) {
	d, k := openKernels(t)
	const heads, kvHeads, headDim, pageTokens, layers = 8, 2, 128, 16, 2
	lens := []int{1, 37, 1300} // 1300 spans three score chunks
	ctxLens := []int32{1, 37, 1300}
	batch := len(lens)
	maxPages := (1300 + pageTokens - 1) / pageTokens
	scale := float32(1 / math.Sqrt(headDim))

	// A kvslab pool over a host arena holds both layers' keys and values; its page tables,
	// scattered over many slabs by churn, go to the kernel as they are.
	s := newSlabKV(t, layers, pageTokens, kvHeads, headDim, 4, 48, lens)
	copy(s.arena, rnd(14, len(s.arena), 1))
	slabTable := s.table(maxPages)
	slabs := map[uint32]bool{}
	for _, p := range slabTable {
		if p != uint32(kvslab.NoPage) {
			slabs[p>>PageSlotBits] = true
		}
	}
	if len(slabs) < 10 {
		t.Fatalf("the page tables span only %d slabs", len(slabs))
	}

	// Packed pages in separate key and value buffers, handed out in a shuffled order.
	numPages := batch * maxPages
	pageElems := pageTokens * kvHeads * headDim
	perm := rand.New(rand.NewPCG(12, 13)).Perm(numPages)
	packedTable := make([]uint32, batch*maxPages)
	for i := range packedTable {
		packedTable[i] = uint32(perm[i])
	}
	packed := &ref.PagedKV{K: rnd(15, numPages*pageElems, 1), V: rnd(16, numPages*pageElems, 1),
		PageTokens: pageTokens, KVHeads: kvHeads, HeadDim: headDim}

	type cacheCase struct {
		name   string
		layout KVSlabLayout
		cache  *ref.PagedKV
		table  []uint32
		shared bool // keys and values through one pointer: the kvslab arena
	}
	cases := []cacheCase{{"packed", PackedKV(int64(pageElems)), packed, packedTable, false}}
	for layer := range layers {
		l := s.layout(t, layer)
		cases = append(cases, cacheCase{fmt.Sprintf("kvslab layer %d", layer), l, s.refKV(l), slabTable, true})
	}
	for _, c := range cases {
		on(t, d, func(g *dev) {
			var kc, vc cudart.DevicePtr
			if c.shared {
				kc = g.f32(s.arena)
				vc = kc
			} else {
				kc, vc = g.f32(c.cache.K), g.f32(c.cache.V)
			}
			table, lensDev := g.u32(c.table), g.i32(ctxLens)
			for _, nq := range []int{1, 3} {
				for _, window := range []int{0, 100} {
					q := rnd(17, batch*nq*heads*headDim, 1)
					want := make([]float32, len(q))
					rows := nq * heads * headDim
					for b := 0; b < batch; b++ {
						if lens[b] < nq {
							continue // the kernel writes zeros for queries before the first token
						}
						err := ref.PagedAttention(want[b*rows:(b+1)*rows], q[b*rows:(b+1)*rows], c.cache,
							c.table[b*maxPages:(b+1)*maxPages], lens[b], nq, ref.Attention{Heads: heads, Scale: scale, Window: window})
						if err != nil {
							t.Fatal(err)
						}
					}
					out := g.alloc(4 * len(q))
					p := PagedAttention{Out: out, Q: g.f32(q), KCache: kc, VCache: vc, PageTable: table, CtxLens: lensDev,
						Layout: c.layout, Batch: batch, NQ: nq, Heads: heads, KVHeads: kvHeads, HeadDim: headDim,
						PageTokens: pageTokens, MaxPages: maxPages, Scale: scale, Window: window}
					if err := k.PagedAttention(g.c, nil, p); err != nil {
						t.Fatal(err)
					}
					got := g.getF32(out, len(q))
					if nq > lens[0] { // sequence 0 has fewer tokens than queries: compare the others
						got, want = got[rows:], want[rows:]
					}
					parity(t, fmt.Sprintf("paged-attention %s nq=%d window=%d", c.name, nq, window), got, want, 2e-5)
				}
			}
		})
	}
}

func TestGPULauncherShapeErrors(t *testing.T) {
	d, k := openKernels(t)
	on(t, d, func(g *dev) {
		if err := k.RMSNorm(g.c, nil, 0, 0, 0, 0, 8, 1e-6); err == nil {
			t.Error("rows 0: no error")
		}
		if err := k.PagedAttention(g.c, nil, PagedAttention{Batch: 1, NQ: 1, Heads: 3, KVHeads: 2, HeadDim: 64, PageTokens: 16, MaxPages: 1,
			Layout: PackedKV(16 * 2 * 64)}); err == nil {
			t.Error("heads not a multiple of kv heads: no error")
		}
		if err := k.MoETopK(g.c, nil, MoERouting{Tokens: 1, Experts: 2000, TopK: 2}); err == nil {
			t.Error("too many experts: no error")
		}
		if err := k.MoETopK(g.c, nil, MoERouting{Tokens: 1, Experts: 64, TopK: 8, Groups: 8, GroupTopK: 1}); err == nil {
			t.Error("top-k larger than the kept groups: no error")
		}
	})
}
