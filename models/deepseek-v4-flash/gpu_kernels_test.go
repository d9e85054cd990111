package deepseekv4flash

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"unsafe"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/cudart/emu"
	"github.com/resin-llm/resin/core/gpurunner"
	"github.com/resin-llm/resin/core/kernels/cuda"
	"github.com/resin-llm/resin/models/deepseek-v4-flash/kernels"
)

// The V4 kernels (kernels/*.cu, and the core's rotary.cu for the partial RoPE) run on the
// emulated device (core/cudart/emu) against the model's own reference functions
// (Rotary.Apply, compressInto, indexerPick, attendSeq), with the launches the kernels
// package's launchers build, every launch under every schedule (the buffers must end
// bit-identical under each).

// emuV4Modules builds and opens the sources once per test binary.
var emuV4Modules = sync.OnceValues(func() (map[string]*emu.Module, error) {
	if err := emu.Available(); err != nil {
		return nil, err
	}
	mods := map[string]*emu.Module{}
	for _, f := range []string{"compress.cu", "indexer.cu", "attention.cu", "groups.cu", "rotary.cu"} {
		var src string
		var err error
		if f == "rotary.cu" {
			src, err = cuda.Source(f)
		} else {
			src, err = kernels.Source(f)
		}
		if err != nil {
			return nil, err
		}
		path, err := emu.Build(src, f)
		if err != nil {
			return nil, err
		}
		if mods[f], err = emu.Open(path); err != nil {
			return nil, err
		}
	}
	return mods, nil
})

// emuDev is host memory standing in for device memory: each buffer a Go byte slice on
// 64 bytes whose address the launches pass.
type emuDev struct {
	t    testing.TB
	mods map[string]*emu.Module
	bufs [][]byte
}

func newEmuDev(t testing.TB) *emuDev {
	t.Helper()
	if err := emu.Available(); err != nil {
		t.Skipf("no emulated device: %v", err)
	}
	mods, err := emuV4Modules()
	if err != nil {
		t.Fatal(err)
	}
	return &emuDev{t: t, mods: mods}
}

func (d *emuDev) alloc(n int) cudart.DevicePtr {
	raw := make([]byte, max(n, 4)+64)
	off := int((64 - uintptr(unsafe.Pointer(&raw[0]))%64) % 64)
	b := raw[off : off+max(n, 4)]
	d.bufs = append(d.bufs, b)
	return cudart.DevicePtr(uintptr(unsafe.Pointer(&b[0])))
}

func (d *emuDev) find(p cudart.DevicePtr) []byte {
	for _, b := range d.bufs {
		base := cudart.DevicePtr(uintptr(unsafe.Pointer(&b[0])))
		if p >= base && p < base+cudart.DevicePtr(len(b)) {
			return b[p-base:]
		}
	}
	d.t.Fatalf("address %#x is in no buffer", uint64(p))
	return nil
}

func (d *emuDev) f32(v []float32) cudart.DevicePtr {
	p := d.alloc(4 * len(v))
	d.put(p, v)
	return p
}

func (d *emuDev) put(p cudart.DevicePtr, v []float32) {
	if len(v) > 0 {
		copy(d.find(p), unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), 4*len(v)))
	}
}

func (d *emuDev) i32(v []int32) cudart.DevicePtr {
	p := d.alloc(4 * len(v))
	if len(v) > 0 {
		copy(d.find(p), unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), 4*len(v)))
	}
	return p
}

func (d *emuDev) getF32(p cudart.DevicePtr, n int) []float32 {
	out := make([]float32, n)
	if n > 0 {
		copy(unsafe.Slice((*byte)(unsafe.Pointer(&out[0])), 4*n), d.find(p))
	}
	return out
}

func (d *emuDev) getI32(p cudart.DevicePtr, n int) []int32 {
	out := make([]int32, n)
	if n > 0 {
		copy(unsafe.Slice((*byte)(unsafe.Pointer(&out[0])), 4*n), d.find(p))
	}
	return out
}

// run runs the launches in order under every schedule.
func (d *emuDev) run(name string, ls ...kernels.Launch) {
	d.t.Helper()
	err := emu.AllSchedules(d.bufs, uint64(len(name)), func(s emu.Schedule, seed uint64) error {
		for _, l := range ls {
			m := d.mods[l.File]
			if m == nil {
				return fmt.Errorf("no module %s", l.File)
			}
			vals := append([]uint64(nil), l.Args...)
			params := make([]unsafe.Pointer, len(vals))
			for i := range vals {
				params[i] = unsafe.Pointer(&vals[i])
			}
			if err := m.Launch(l.Entry, [3]uint32{l.Grid.X, l.Grid.Y, l.Grid.Z}, [3]uint32{l.Block.X, l.Block.Y, l.Block.Z},
				uint32(l.Shared), params, s, seed); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		d.t.Fatalf("%s: %v", name, err)
	}
}

func (d *emuDev) rope(r Rotary, maxPos int) kernels.Rope {
	cos, sin, neg := kernels.RopeTables(r.InvFreq, r.Scale, maxPos)
	return kernels.Rope{Cos: d.f32(cos), Sin: d.f32(sin), NegSin: d.f32(neg), RotDim: r.Dim, MaxPos: maxPos}
}

func rnd(r *rand.Rand, n int, scale float32) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = float32(r.NormFloat64()) * scale
	}
	return s
}

// closeTo fails when got and want differ by more than tol·(1+|want|).
func closeTo(t testing.TB, name string, got, want []float32, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", name, len(got), len(want))
	}
	for i := range want {
		if d := math.Abs(float64(got[i]) - float64(want[i])); !(d <= tol*(1+math.Abs(float64(want[i])))) {
			t.Fatalf("%s: element %d = %g, want %g", name, i, got[i], want[i])
		}
	}
}

func sameBits(t testing.TB, name string, got, want []float32) {
	t.Helper()
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("%s: element %d = %g, want %g", name, i, got[i], want[i])
		}
	}
}

// TestEmuPartialRope rotates the trailing 8 of 16 channels (the tiny config's
// partial_rotary_factor 0.5) of queries and of the single K=V head with the core's rotary.cu, and de-rotates an
// output, against Rotary.Apply: bit-exact, main and compress rotaries.
func TestEmuPartialRope(t *testing.T) {
	d := newEmuDev(t)
	m := tinyModel(t)
	c := m.Config
	rng := rand.New(rand.NewPCG(1, 2))
	pos := []int32{0, 1, 17, 300, 511}
	for _, rc := range []struct {
		name    string
		rot     Rotary
		heads   int
		inverse bool
	}{
		{"main q", m.main, c.NumAttentionHeads, false},
		{"main kv", m.main, 1, false},
		{"compress q inverse", m.compress, c.NumAttentionHeads, true},
	} {
		rows, hd := len(pos), c.HeadDim
		x := rnd(rng, rows*rc.heads*hd, 1)
		want := append([]float32(nil), x...)
		rc.rot.Apply(want, pos, rows, rc.heads, hd, rc.inverse)
		xp := d.f32(x)
		l, err := kernels.PartialRope(xp, d.i32(pos), d.rope(rc.rot, m.maxContext), rows, rc.heads, hd, rc.inverse)
		if err != nil {
			t.Fatal(err)
		}
		d.run(rc.name, l)
		sameBits(t, rc.name, d.getF32(xp, len(x)), want)
	}
	if _, err := kernels.PartialRope(0, 0, kernels.Rope{RotDim: 70, MaxPos: 8}, 1, 1, 64, false); err == nil {
		t.Error("a rotary dim above the head dim accepted")
	}
}

// compressCase is one compressor of the tiny model: its kind, weights and dim.
type compressCase struct {
	name    string
	ratio   int
	dim     int
	overlap bool
	w       *Compressor
	steps   [][2]int // per step, each sequence's new rows (nil: compressSteps)
}

// compressSteps are the default steps of TestEmuCompressor: windows closing inside a
// chunk, at its last row and across chunks, a chunk inside one window, decode rows.
var compressSteps = [][2]int{{3, 9}, {6, 1}, {1, 0}, {9, 16}, {2, 1}, {1, 1}, {21, 3}, {17, 15}}

func compressCases(m *Model) []compressCase {
	c := m.Config
	var csa, hca *Layer
	for i, k := range c.LayerTypes {
		switch {
		case k == CompressedSparse && csa == nil:
			csa = &m.W.Layers[i]
		case k == HeavilyCompressed && hca == nil:
			hca = &m.W.Layers[i]
		}
	}
	// V4-Flash's head dim of 512 (4 channels a thread) and an HCA ratio above the tiny
	// config's, on random weights.
	rng := rand.New(rand.NewPCG(9, 10))
	synth := func(ratio, dim int, overlap bool) *Compressor {
		width := dim
		if overlap {
			width *= 2
		}
		norm := rnd(rng, dim, 0.1)
		for i := range norm {
			norm[i]++
		}
		return &Compressor{PositionBias: rnd(rng, ratio*width, 0.5), Norm: norm}
	}
	return []compressCase{
		{"CSA", c.CompressRates[CompressedSparse], c.HeadDim, true, csa.Compressor, nil},
		{"CSA indexer", c.CompressRates[CompressedSparse], c.IndexHeadDim, true, &csa.Indexer.Compressor, nil},
		{"HCA", c.CompressRates[HeavilyCompressed], c.HeadDim, false, hca.Compressor, nil},
		{"CSA head dim 512", 4, 512, true, synth(4, 512, true), nil},
		{"HCA ratio 16 dim 200", 16, 200, false, synth(16, 200, false), nil},
		// V4-Flash's HCA: ratio 128 over 512 channels, one window closing across chunks
		// and one inside the last.
		{"HCA ratio 128 dim 512", 128, 512, false, synth(128, 512, false), [][2]int{{100, 130}, {60, 1}, {1, 0}, {100, 126}}},
	}
}

// TestEmuCompressor runs compress.cu's two kernels step by step over two sequences whose
// chunks differ in length (windows closing inside a chunk, at its last row, and across
// chunks; a chunk inside one window; decode rows) against compressInto on the model's
// CompressorState: the entries within 2e-5, the pending window and the Ca half bit-exact.
func TestEmuCompressor(t *testing.T) {
	d := newEmuDev(t)
	m := tinyModel(t)
	eps := float32(m.Config.RMSNormEps)
	rng := rand.New(rand.NewPCG(3, 4))
	for _, cc := range compressCases(m) {
		steps := compressSteps
		if cc.steps != nil {
			steps = cc.steps
		}
		ref := []*CompressorState{newLayerStateFor(cc), newLayerStateFor(cc)}
		width := ref[0].Width()
		const maxEntries = 40
		dc := kernels.Compressor{
			PendingKV: d.alloc(4 * 2 * cc.ratio * width), PendingGate: d.alloc(4 * 2 * cc.ratio * width),
			PrevKV: d.alloc(4 * 2 * cc.ratio * cc.dim), PrevGate: d.alloc(4 * 2 * cc.ratio * cc.dim),
			Entries: d.alloc(4 * 2 * maxEntries * cc.dim), Bias: d.f32(cc.w.PositionBias), Norm: d.f32(cc.w.Norm),
			State: d.i32([]int32{1, 0}), EntryRow0: d.i32([]int32{0, maxEntries}),
			Ratio: cc.ratio, Dim: cc.dim, Overlap: cc.overlap, Eps: eps,
		}
		rope := d.rope(m.compress, m.maxContext)
		lens := [2]int{}
		for si, st := range steps {
			var pos, rowSeq, seqStart, len0 []int32
			for s := range 2 {
				seqStart = append(seqStart, int32(len(pos)))
				len0 = append(len0, int32(lens[s]))
				for i := range st[s] {
					pos = append(pos, int32(lens[s]+i))
					rowSeq = append(rowSeq, int32(s))
				}
			}
			seqStart = append(seqStart, int32(len(pos)))
			rows := len(pos)
			kv, gate := rnd(rng, rows*width, 1), rnd(rng, rows*width, 1)
			for s := range 2 {
				r0, r1 := seqStart[s], seqStart[s+1]
				m.compressInto(ref[s], cc.w.PositionBias, cc.w.Norm, kv[int(r0)*width:int(r1)*width], gate[int(r0)*width:int(r1)*width], pos[r0:r1])
			}
			ch := kernels.Chunk{Pos: d.i32(pos), RowSeq: d.i32(rowSeq), SeqStart: d.i32(seqStart), Len0: d.i32(len0), Rows: rows, Seqs: 2}
			ls, err := dc.Compress(ch, d.f32(kv), d.f32(gate), rope)
			if err != nil {
				t.Fatal(err)
			}
			name := fmt.Sprintf("%s step %d", cc.name, si)
			d.run(name, ls[0], ls[1])
			for s := range 2 {
				lens[s] += st[s]
				n := lens[s] / cc.ratio
				slot := 1 - s // State maps sequence 0 to slot 1
				got := d.getF32(dc.Entries+cudart.DevicePtr(4*s*maxEntries*cc.dim), n*cc.dim)
				for e := range n {
					closeTo(t, fmt.Sprintf("%s: sequence %d entry %d", name, s, e), got[e*cc.dim:(e+1)*cc.dim], ref[s].Entries.Row(e), 2e-5)
				}
				sameBits(t, name+" pending kv", d.getF32(dc.PendingKV+cudart.DevicePtr(4*slot*cc.ratio*width), cc.ratio*width), ref[s].PendingKV)
				sameBits(t, name+" pending gate", d.getF32(dc.PendingGate+cudart.DevicePtr(4*slot*cc.ratio*width), cc.ratio*width), ref[s].PendingGate)
				if cc.overlap {
					sameBits(t, name+" prev kv", d.getF32(dc.PrevKV+cudart.DevicePtr(4*slot*cc.ratio*cc.dim), cc.ratio*cc.dim), ref[s].PrevKV)
					sameBits(t, name+" prev gate", d.getF32(dc.PrevGate+cudart.DevicePtr(4*slot*cc.ratio*cc.dim), cc.ratio*cc.dim), ref[s].PrevGate)
				}
			}
		}
		if lens[0]/cc.ratio < 2 || lens[1]/cc.ratio < 2 {
			t.Fatalf("%s: the steps close too few windows", cc.name)
		}
	}
}

func newLayerStateFor(cc compressCase) *CompressorState {
	s := &CompressorState{Ratio: cc.ratio, Dim: cc.dim, Overlap: cc.overlap, Entries: &sliceRows{dim: cc.dim}}
	s.PendingKV, s.PendingGate = make([]float32, cc.ratio*s.Width()), make([]float32, cc.ratio*s.Width())
	if cc.overlap {
		s.PrevKV, s.PrevGate = make([]float32, cc.ratio*cc.dim), make([]float32, cc.ratio*cc.dim)
	}
	return s
}

// attnCase is one sequence of the attention tests: the tokens it held and its new rows.
type attnCase struct{ len0, n int }

// TestEmuIndexerAttention runs, for a CSA, an HCA and a sliding layer of the tiny model,
// indexer.cu's top-k (CSA) and attention.cu's attention with per-head sinks and ring store
// over three sequences at different lengths in one launch (a decode row seeing fewer
// entries than index_topk, one seeing exactly index_topk, prompts past the window whose
// early queries read keys the chunk then overwrites in the ring, a sequence whose
// indexer keys repeat, so that scores tie at the cut), against attendSeq (with indexerPick) on
// the model's LayerState: the picks exactly, the outputs within 2e-5, the ring bit-exact.
func TestEmuIndexerAttention(t *testing.T) {
	d := newEmuDev(t)
	m := tinyModel(t)
	emuIndexerAttention(t, d, m, "")
	// V4-Flash's head dim of 512 (4 output dimensions a thread), 2 heads (blocks of 2).
	wide := *m.Config
	wide.HeadDim, wide.NumAttentionHeads = 512, 2
	mw, err := NewModel(&wide, m.W, m.maxContext)
	if err != nil {
		t.Fatal(err)
	}
	emuIndexerAttention(t, d, mw, "head dim 512 ")
	// 3 heads: a block of one head each (4 heads make blocks of 4, 2 of 2).
	odd := *m.Config
	odd.NumAttentionHeads = 3
	mo, err := NewModel(&odd, m.W, m.maxContext)
	if err != nil {
		t.Fatal(err)
	}
	emuIndexerAttention(t, d, mo, "3 heads ")
}

func emuIndexerAttention(t *testing.T, d *emuDev, m *Model, label string) {
	c := m.Config
	hd, nh, win, id, ih, topk := c.HeadDim, c.NumAttentionHeads, c.SlidingWindow, c.IndexHeadDim, c.IndexNHeads, c.IndexTopK
	rng := rand.New(rand.NewPCG(5, 6))
	seqs := []attnCase{{30, 1}, {0, 37}, {120, 5}}
	for li, kind := range c.LayerTypes {
		l := &m.W.Layers[li]
		ratio := c.CompressRates[kind]
		name := label + kind
		var pos, rowSeq, seqStart, len0, winRow0, entryRow0 []int32
		for s, sc := range seqs {
			seqStart = append(seqStart, int32(len(pos)))
			len0 = append(len0, int32(sc.len0))
			winRow0 = append(winRow0, int32(s*win))
			entryRow0 = append(entryRow0, int32(s*64))
			for i := range sc.n {
				pos = append(pos, int32(sc.len0+i))
				rowSeq = append(rowSeq, int32(s))
			}
		}
		seqStart = append(seqStart, int32(len(pos)))
		rows := len(pos)
		ch := kernels.Chunk{Pos: d.i32(pos), RowSeq: d.i32(rowSeq), SeqStart: d.i32(seqStart), Len0: d.i32(len0), Rows: rows, Seqs: len(seqs)}

		// Each sequence's cache: every position's K=V row, its entries and indexer keys.
		q, kv := rnd(rng, rows*nh*hd, 1), rnd(rng, rows*hd, 1)
		iq, iw := rnd(rng, rows*ih*id, 1), rnd(rng, rows*ih, 1)
		ring := make([]float32, len(seqs)*win*hd)
		entries, keys := make([]float32, len(seqs)*64*hd), make([]float32, len(seqs)*64*id)
		states := make([]LayerState, len(seqs))
		for s, sc := range seqs {
			st := &states[s]
			st.Window = &sliceRows{dim: hd}
			for p := range sc.len0 {
				row := rnd(rng, hd, 1)
				copy(st.Window.Row(p), row)
				if p >= sc.len0-win {
					copy(ring[(s*win+p%win)*hd:], row)
				}
			}
			for i := range sc.n {
				copy(st.Window.Row(sc.len0+i), kv[(int(seqStart[s])+i)*hd:(int(seqStart[s])+i+1)*hd])
			}
			if ratio == 0 {
				continue
			}
			st.Compressor = &CompressorState{Ratio: ratio, Dim: hd, Entries: &sliceRows{dim: hd}}
			st.Indexer = &CompressorState{Ratio: ratio, Dim: id, Entries: &sliceRows{dim: id}}
			for e := range (sc.len0 + sc.n) / ratio {
				er, kr := rnd(rng, hd, 1), rnd(rng, id, 1)
				if s == 2 && e >= 2 {
					kr = st.Indexer.Entries.Row(1) // scores that tie at the cut
				}
				copy(st.Compressor.Entries.Row(e), er)
				copy(st.Indexer.Entries.Row(e), kr)
				copy(entries[(s*64+e)*hd:], er)
				copy(keys[(s*64+e)*id:], kr)
			}
		}
		want := make([]float32, rows*nh*hd)
		for s, st := range states {
			r0, r1 := int(seqStart[s]), int(seqStart[s+1])
			m.attendSeq(l, kind, &st, q[r0*nh*hd:r1*nh*hd], pos[r0:r1], want[r0*nh*hd:r1*nh*hd], iq, iw, r0)
		}

		a := kernels.Attention{Out: d.alloc(4 * rows * nh * hd), Q: d.f32(q), KV: d.f32(kv), WindowKV: d.f32(ring),
			WinRow0: d.i32(winRow0), Sinks: d.f32(l.Sinks[:nh]), Heads: nh, HeadDim: hd, Window: win, Ratio: ratio,
			Scale: float32(1 / math.Sqrt(float64(hd)))}
		var launches []kernels.Launch
		if ratio > 0 {
			a.Entries, a.EntryRow0 = d.f32(entries), d.i32(entryRow0)
		}
		var x kernels.Indexer
		if kind == CompressedSparse {
			x = kernels.Indexer{Picks: d.alloc(4 * rows * topk), Counts: d.alloc(4 * rows), Scores: d.alloc(4 * rows * 64),
				Q: d.f32(iq), W: d.f32(iw), Keys: d.f32(keys), KeyRow0: d.i32(entryRow0), Ratio: ratio, Heads: ih,
				HeadDim: id, TopK: topk, MaxVisible: 64}
			il, err := x.Launch(ch)
			if err != nil {
				t.Fatal(err)
			}
			launches = append(launches, il)
			a.Picks, a.Counts, a.TopK = x.Picks, x.Counts, topk
		}
		al, err := a.Launches(ch)
		if err != nil {
			t.Fatal(err)
		}
		launches = append(launches, al[0], al[1])
		d.run(name, launches...)

		if kind == CompressedSparse {
			picks, counts := d.getI32(x.Picks, rows*topk), d.getI32(x.Counts, rows)
			sawCut, sawFew := false, false
			m.MinTopKMargin = math.Inf(1)
			for r := range rows {
				s := rowSeq[r]
				wantPicks := m.indexerPick(states[s].Indexer, iq[r*ih*id:(r+1)*ih*id], iw[r*ih:(r+1)*ih], (int(pos[r])+1)/ratio)
				if int(counts[r]) != len(wantPicks) {
					t.Fatalf("%s row %d (position %d): %d picks, want %d", name, r, pos[r], counts[r], len(wantPicks))
				}
				for i, e := range wantPicks {
					if picks[r*topk+i] != int32(e) {
						t.Fatalf("%s row %d (position %d): picks %v, want %v", name, r, pos[r], picks[r*topk:r*topk+int(counts[r])], wantPicks)
					}
				}
				for i := int(counts[r]); i < topk; i++ {
					if picks[r*topk+i] != -1 {
						t.Fatalf("%s row %d: pick %d past the count is %d", name, r, i, picks[r*topk+i])
					}
				}
				sawCut = sawCut || (int(pos[r])+1)/ratio > topk
				sawFew = sawFew || (int(pos[r])+1)/ratio < topk
			}
			if m.MinTopKMargin != 0 {
				t.Fatalf("%s: no scores tie at a top-k cut (smallest gap %g)", name, m.MinTopKMargin)
			}
			if !sawCut || !sawFew {
				t.Fatalf("%s: the rows do not cross the top-k cut both ways", name)
			}
		}
		closeTo(t, name+" attention", d.getF32(a.Out, rows*nh*hd), want, 2e-5)
		gotRing := d.getF32(a.WindowKV, len(ring))
		for s, sc := range seqs {
			end := sc.len0 + sc.n
			for p := max(0, end-win); p < end; p++ {
				sameBits(t, fmt.Sprintf("%s ring of sequence %d position %d", name, s, p), gotRing[(s*win+p%win)*hd:(s*win+p%win+1)*hd], states[s].Window.Row(p))
			}
		}
	}
}

// TestEmuSwap01 checks groups.cu's layout change both ways against a Go loop, bit-exact.
func TestEmuSwap01(t *testing.T) {
	d := newEmuDev(t)
	rng := rand.New(rand.NewPCG(7, 8))
	const a, b, c = 5, 3, 70
	src := rnd(rng, a*b*c, 1)
	dst := d.alloc(4 * a * b * c)
	l, err := kernels.Swap01(dst, d.f32(src), a, b, c)
	if err != nil {
		t.Fatal(err)
	}
	d.run("swap01", l)
	got := d.getF32(dst, a*b*c)
	want := make([]float32, a*b*c)
	for i := range a {
		for j := range b {
			copy(want[(j*a+i)*c:(j*a+i+1)*c], src[(i*b+j)*c:(i*b+j+1)*c])
		}
	}
	sameBits(t, "swap01", got, want)
}

// TestEmuAddRows checks groups.cu's broadcast add (the MTP head's e_proj output added to
// each h_proj stream) against the Go loop of Model.mtpForward, bit-exact.
func TestEmuAddRows(t *testing.T) {
	d := newEmuDev(t)
	rng := rand.New(rand.NewPCG(9, 10))
	const rows, rep, dim = 7, 4, 300
	x, y := rnd(rng, rows*rep*dim, 1), rnd(rng, rows*dim, 1)
	xp := d.f32(x)
	l, err := kernels.AddRows(xp, d.f32(y), rows, rep, dim)
	if err != nil {
		t.Fatal(err)
	}
	d.run("add_rows", l)
	want := slices.Clone(x)
	for r := range rows {
		for i := range rep {
			for j := range dim {
				want[(r*rep+i)*dim+j] += y[r*dim+j]
			}
		}
	}
	sameBits(t, "add_rows", d.getF32(xp, rows*rep*dim), want)
}

// TestEmuShardIDs checks groups.cu's id rewrite for a TP rank's embedding shard against
// gpurunner.VocabShard.LocalIDs, for each rank of a 130-token vocabulary over 3 ranks
// (the last holding 2 real tokens) and ids on every side of each shard's bounds.
func TestEmuShardIDs(t *testing.T) {
	d := newEmuDev(t)
	ids := []int32{0, 1, 63, 64, 65, 127, 128, 129, 130, 500, -1}
	for r := range 3 {
		v := gpurunner.NewVocabShard(130, r, 3)
		in := d.i32(ids)
		l, err := kernels.ShardIDs(in, in, len(ids), v.Start, v.Lo, v.Hi)
		if err != nil {
			t.Fatal(err)
		}
		d.run("shard_ids", l)
		want := slices.Clone(ids)
		v.LocalIDs(want)
		if got := d.getI32(in, len(ids)); !slices.Equal(got, want) {
			t.Errorf("rank %d: %v, want %v", r, got, want)
		}
	}
	if _, err := kernels.ShardIDs(0, 0, 4, 64, 10, 20); err == nil {
		t.Errorf("ShardIDs took ids below the shard's start")
	}
}

// TestEmuIndexerManyEntries runs indexer.cu past one block of entries: 700 and 520
// visible entries with a top-k of 300 (the prefix sums carried across tiles of 256, the
// picks past 256), 400 equal scores across two tile ends with the cut among them, and
// 300 visible exactly; against indexerPick, the picks exactly.
func TestEmuIndexerManyEntries(t *testing.T) {
	d := newEmuDev(t)
	m := tinyModel(t)
	cfg := *m.Config
	cfg.IndexTopK = 300
	mk, err := NewModel(&cfg, m.W, 4096)
	if err != nil {
		t.Fatal(err)
	}
	id, ih := cfg.IndexHeadDim, cfg.IndexNHeads
	rng := rand.New(rand.NewPCG(13, 14))
	const entries, ratio = 700, 4
	st := &CompressorState{Ratio: ratio, Dim: id, Entries: &sliceRows{dim: id}}
	keys := rnd(rng, entries*id, 1)
	for e := 200; e < 600; e++ { // equal scores across two tiles' ends, the cut among them
		copy(keys[e*id:(e+1)*id], keys[199*id:200*id])
	}
	for e := range entries {
		copy(st.Entries.Row(e), keys[e*id:(e+1)*id])
	}
	pos := []int32{entries*ratio - 1, 520*ratio + 2, 300*ratio - 1}
	rows := len(pos)
	q, w := rnd(rng, rows*ih*id, 1), rnd(rng, rows*ih, 1)
	ch := kernels.Chunk{Pos: d.i32(pos), RowSeq: d.i32(make([]int32, rows)), SeqStart: d.i32([]int32{0, int32(rows)}),
		Len0: d.i32([]int32{0}), Rows: rows, Seqs: 1}
	x := kernels.Indexer{Picks: d.alloc(4 * rows * cfg.IndexTopK), Counts: d.alloc(4 * rows), Scores: d.alloc(4 * rows * entries),
		Q: d.f32(q), W: d.f32(w), Keys: d.f32(keys), KeyRow0: d.i32([]int32{0}), Ratio: ratio, Heads: ih, HeadDim: id,
		TopK: cfg.IndexTopK, MaxVisible: entries}
	l, err := x.Launch(ch)
	if err != nil {
		t.Fatal(err)
	}
	d.run("indexer 700 entries", l)
	picks, counts := d.getI32(x.Picks, rows*cfg.IndexTopK), d.getI32(x.Counts, rows)
	mk.MinTopKMargin = math.Inf(1)
	for r := range rows {
		want := mk.indexerPick(st, q[r*ih*id:(r+1)*ih*id], w[r*ih:(r+1)*ih], (int(pos[r])+1)/ratio)
		if int(counts[r]) != len(want) {
			t.Fatalf("row %d: %d picks, want %d", r, counts[r], len(want))
		}
		for i, e := range want {
			if picks[r*cfg.IndexTopK+i] != int32(e) {
				t.Fatalf("row %d: pick %d is %d, want %d", r, i, picks[r*cfg.IndexTopK+i], e)
			}
		}
	}
	if mk.MinTopKMargin != 0 {
		t.Fatalf("no scores tie at the cut (smallest gap %g)", mk.MinTopKMargin)
	}
}
