package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/resin-llm/resin/core/kernels/ref"
)

// The attention kernels' control flow in Go, block by block and tile by tile as
// flash_attention.cu runs it (the sequence a block serves, its query rows, the key range
// and 32-key tiles, the causal and window masks, the online softmax, the decode
// partitions and their log-sum-exp merge), in float32 over a float32 cache. Checked
// against ref.PagedAttention it tests the kernels' index arithmetic without a GPU;
// TestGPUPrefillAttention and TestGPUDecodeAttention test the kernels themselves.

// faModelCache reads key or value (t, kv head) of a sequence, as resin_fa_load_tile does.
type faModelCache struct {
	arena  []float32
	layout KVSlabLayout
	pt     int
	kvh    int
	hd     int
}

func (c *faModelCache) row(pages []uint32, t, g int, value bool) []float32 {
	off := c.layout.KOffset
	if value {
		off = c.layout.VOffset
	}
	base := c.layout.PageBase(pages[t/c.pt]) + int64((t%c.pt)*c.kvh+g)*int64(c.hd) + off
	return c.arena[base : base+int64(c.hd)]
}

// faRow is one query row's running state: maximum, sum and unnormalised output.
type faRow struct {
	m, l float32
	acc  []float32
}

// attendTile is resin_fa_attend for one row: keys t0..t0+31, those in [lo, hi] seen.
func (r *faRow) attendTile(c *faModelCache, pages []uint32, q []float32, g, t0, end, lo, hi int, scale float32) {
	var s [faKeys]float32
	tm := float32(math.Inf(-1))
	for j := range faKeys {
		t := t0 + j
		s[j] = float32(math.Inf(-1))
		if t >= lo && t <= hi {
			k := make([]float32, c.hd) // a key at or past end is loaded as zeros
			if t < end {
				k = c.row(pages, t, g, false)
			}
			var dot float32
			for d := range q {
				dot += q[d] * k[d]
			}
			s[j] = dot * scale
		}
		tm = max(tm, s[j])
	}
	mn := max(r.m, tm)
	if math.IsInf(float64(mn), -1) {
		return
	}
	corr := float32(math.Exp(float64(r.m - mn))) // 0 while m is -inf
	for d := range r.acc {
		r.acc[d] *= corr
	}
	var sum float32
	for j := range faKeys {
		p := float32(math.Exp(float64(s[j] - mn)))
		sum += p
		if p == 0 {
			continue
		}
		v := make([]float32, c.hd)
		if t0+j < end {
			v = c.row(pages, t0+j, g, true)
		}
		for d := range r.acc {
			r.acc[d] += p * v[d]
		}
	}
	r.l = r.l*corr + sum
	r.m = mn
}

func newFARow(hd int) *faRow {
	return &faRow{m: float32(math.Inf(-1)), acc: make([]float32, hd)}
}

func (r *faRow) out(dst []float32) {
	inv := float32(0)
	if r.l > 0 {
		inv = 1 / r.l
	}
	for d := range dst {
		dst[d] = r.acc[d] * inv
	}
}

// modelPrefill is resin_prefill_attention_bf16's grid.
func modelPrefill(out, q []float32, c *faModelCache, qs, lens, pts []int32, table []uint32, heads int, scale float32, window int, skipDecode bool) {
	batch, hd := len(lens), c.hd
	for x := range prefillTiles(int(qs[batch]), batch) {
		for h := range heads {
			b, row0, ok := prefillTile(qs, x)
			n := int(qs[b+1] - qs[b])
			if !ok || skipDecode && n == 1 {
				continue
			}
			q0, first := int(qs[b]), int(lens[b])-n
			g := h / (heads / c.kvh)
			pages := table[pts[b]:pts[b+1]]
			rows := min(n-row0, faQueryRows)
			pFirst, end := first+row0, first+row0+rows
			tLo := 0
			if window > 0 && pFirst-window+1 > 0 {
				tLo = pFirst - window + 1
			}
			state := make([]*faRow, rows)
			for i := range state {
				state[i] = newFARow(hd)
			}
			for t0 := tLo; t0 < end; t0 += faKeys {
				for i := range rows {
					p := first + row0 + i
					lo := 0
					if window > 0 && p-window+1 > 0 {
						lo = p - window + 1
					}
					tok := q0 + row0 + i
					state[i].attendTile(c, pages, q[(tok*heads+h)*hd:(tok*heads+h+1)*hd], g, t0, end, lo, p, scale)
				}
			}
			for i := range rows {
				tok := q0 + row0 + i
				state[i].out(out[(tok*heads+h)*hd : (tok*heads+h+1)*hd])
			}
		}
	}
}

// modelDecode is resin_decode_attention_bf16's grid and resin_decode_reduce_bf16.
func modelDecode(out, q []float32, c *faModelCache, qs, lens, pts []int32, table []uint32, heads int, scale float32, window int, split DecodeSplit) {
	batch, hd := len(lens), c.hd
	group := heads / c.kvh
	partOut := make([]float32, batch*heads*split.Parts*hd)
	partLSE := make([]float32, batch*heads*split.Parts)
	for g := range c.kvh {
		for b := range batch {
			tok := int(qs[b+1]) - 1
			if tok != int(qs[b]) {
				continue
			}
			ln := int(lens[b])
			p := ln - 1
			loAll := 0
			if window > 0 && p-window+1 > 0 {
				loAll = p - window + 1
			}
			pages := table[pts[b]:pts[b+1]]
			for z := range split.Parts {
				start := loAll + z*split.PartLen
				end := start + split.PartLen
				if z == split.Parts-1 || end > ln {
					end = ln
				}
				for i := range group {
					h := g*group + i
					r := newFARow(hd)
					for t0 := start; t0 < end; t0 += faKeys {
						r.attendTile(c, pages, q[(tok*heads+h)*hd:(tok*heads+h+1)*hd], g, t0, end, start, end-1, scale)
					}
					if split.Parts == 1 {
						r.out(out[(tok*heads+h)*hd : (tok*heads+h+1)*hd])
						continue
					}
					at := (b*heads+h)*split.Parts + z
					r.out(partOut[at*hd : (at+1)*hd])
					partLSE[at] = float32(math.Inf(-1))
					if r.l > 0 {
						partLSE[at] = r.m + float32(math.Log(float64(r.l)))
					}
				}
			}
		}
	}
	if split.Parts == 1 {
		return
	}
	for b := range batch {
		tok := int(qs[b+1]) - 1
		if tok != int(qs[b]) {
			continue
		}
		for h := range heads {
			at := (b*heads + h) * split.Parts
			lse := partLSE[at : at+split.Parts]
			mx := float32(math.Inf(-1))
			for _, v := range lse {
				mx = max(mx, v)
			}
			var sum float32
			if !math.IsInf(float64(mx), -1) {
				for _, v := range lse {
					sum += float32(math.Exp(float64(v - mx)))
				}
			}
			o := out[(tok*heads+h)*hd : (tok*heads+h+1)*hd]
			for d := range o {
				var a float32
				if sum > 0 {
					for z, v := range lse {
						a += float32(math.Exp(float64(v-mx))) * partOut[(at+z)*hd+d]
					}
					a /= sum
				}
				o[d] = a
			}
		}
	}
}

// TestAttentionModelMatchesRef runs the kernels' control flow (modelPrefill,
// modelDecode) over random ragged batches on a slab-laid-out cache with scattered pages,
// with and without windows, one and many decode partitions, and compares every row with
// ref.PagedAttention.
func TestAttentionModelMatchesRef(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for trial := range 12 {
		heads, kvh, hd, pt := []int{8, 4, 12, 16}[trial%4], []int{2, 4, 2, 1}[trial%4], []int{16, 8, 24, 32}[trial%4], []int{16, 4, 8, 16}[trial%4]
		window := []int{0, 0, 37, 100}[trial%4]
		layers, layer, slabPages, slabs := 2, trial%2, 8, 64
		page := int64(layers * 2 * pt * kvh * hd)
		l, err := NewKVSlabLayoutOf(F32, 4*int64(slabPages)*page, 4*page, layer, pt, kvh, hd)
		if err != nil {
			t.Fatal(err)
		}
		c := &faModelCache{arena: modelRand(uint64(trial), int(int64(slabs*slabPages)*page)), layout: l, pt: pt, kvh: kvh, hd: hd}
		var free []uint32
		for s := range slabs {
			for p := range slabPages {
				free = append(free, uint32(s)<<PageSlotBits|uint32(p))
			}
		}
		r.Shuffle(len(free), func(i, j int) { free[i], free[j] = free[j], free[i] })
		qs, pts := []int32{0}, []int32{0}
		var lens []int32
		var table []uint32
		for range 1 + r.IntN(6) {
			computed, n := r.IntN(300), 1
			switch r.IntN(5) {
			case 0, 1:
				n = 1 + r.IntN(60)
			case 2:
				n = 0 // a graph bucket's padding sequence
			}
			need := (computed + n + pt - 1) / pt
			table = append(table, free[:need]...)
			free = free[need:]
			qs, lens, pts = append(qs, qs[len(qs)-1]+int32(n)), append(lens, int32(computed+n)), append(pts, int32(len(table)))
		}
		tokens, scale := int(qs[len(lens)]), float32(1/math.Sqrt(float64(hd)))
		q := modelRand(uint64(100+trial), tokens*heads*hd)
		want := make([]float32, len(q))
		rk := &ref.PagedKV{K: c.arena, V: c.arena, PageTokens: pt, KVHeads: kvh, HeadDim: hd,
			PageOffset: func(p uint32) int { return int(l.KeyOffset(p)) }, VPageOffset: func(p uint32) int { return int(l.ValueOffset(p)) }}
		row := heads * hd
		for b := range lens {
			q0, n := int(qs[b]), int(qs[b+1]-qs[b])
			if err := ref.PagedAttention(want[q0*row:(q0+n)*row], q[q0*row:(q0+n)*row], rk, table[pts[b]:pts[b+1]], int(lens[b]), n,
				ref.Attention{Heads: heads, Scale: scale, Window: window}); err != nil {
				t.Fatal(err)
			}
		}
		name := fmt.Sprintf("trial %d (h=%d kv=%d d=%d window=%d lens %v, queries %v)", trial, heads, kvh, hd, window, lens, qs)
		got := make([]float32, len(q))
		modelPrefill(got, q, c, qs, lens, pts, table, heads, scale, window, false)
		modelParity(t, name+" prefill", got, want)
		maxCtx := 0
		for _, n := range lens {
			maxCtx = max(maxCtx, int(n))
		}
		if window > 0 {
			maxCtx = min(maxCtx, window)
		}
		chosen, _ := ChooseDecodeSplit(len(lens), kvh, maxCtx, 132)
		for _, split := range []DecodeSplit{{1, 32}, chosen, {7, 32}, {3, 64}} {
			dec := make([]float32, len(q))
			modelDecode(dec, q, c, qs, lens, pts, table, heads, scale, window, split)
			for b := range lens {
				if qs[b+1]-qs[b] != 1 {
					continue
				}
				q0 := int(qs[b]) * row
				modelParity(t, fmt.Sprintf("%s decode %+v seq %d", name, split, b), dec[q0:q0+row], want[q0:q0+row])
			}
		}
	}
}

func modelParity(t *testing.T, name string, got, want []float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, ref %d", name, len(got), len(want))
	}
	for i := range want {
		if d := math.Abs(float64(got[i] - want[i])); !(d <= 2e-5*(1+math.Abs(float64(want[i])))) {
			t.Fatalf("%s: [%d] = %g, ref %g", name, i, got[i], want[i])
		}
	}
}

// modelRand returns n values uniform in [-1, 1).
func modelRand(seed uint64, n int) []float32 {
	r := rand.New(rand.NewPCG(seed, 11))
	x := make([]float32, n)
	for i := range x {
		x[i] = r.Float32()*2 - 1
	}
	return x
}
