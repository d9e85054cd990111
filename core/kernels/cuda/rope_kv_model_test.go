package cuda

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/resin-llm/resin/core/kernels/ref"
)

// modelRopeKV is resin_rope_kv in Go, element for element: each token's rotated pairs of
// the query heads then the kv heads (keys also stored), then the keys' unrotated
// dimensions and the values copied to the token's slot. Checked against the reference
// (RoPE on q and k, then PagedKV.StoreKV) it tests the kernel's slot and layout arithmetic
// without a GPU; TestGPURopeKV tests the kernel.
func modelRopeKV(q, k, v, cache []float32, pos []int32, slots []int64, tab *ref.RopeTable, r RopeKV) {
	half, hd := tab.Dim/2, r.HeadDim
	for t := range r.Tokens {
		p := int(pos[t])
		rotate := p >= 0 && p < tab.MaxPos
		s := slots[t]
		kdst, vdst := int64(-1), int64(-1)
		if s >= 0 {
			base := r.Layout.PageBase(uint32(s/int64(r.PageTokens))) + (s%int64(r.PageTokens))*int64(r.KVHeads*hd)
			kdst, vdst = base+r.Layout.KOffset, base+r.Layout.VOffset
		}
		qr, kr, vr := q[t*r.QStride:], k[t*r.KVStride:], v[t*r.KVStride:]
		for j := 0; rotate && j < (r.Heads+r.KVHeads)*half; j++ {
			h, i := j/half, j%half
			isK := h >= r.Heads
			x := qr[h*hd:]
			if isK {
				x = kr[(h-r.Heads)*hd:]
			}
			a, b := i, i+half
			if r.GPTJ {
				a, b = 2*i, 2*i+1
			}
			c, sn := tab.Cos[p*half+i], tab.Sin[p*half+i]
			x0, x1 := x[a], x[b]
			y0, y1 := x0*c-x1*sn, x1*c+x0*sn
			x[a], x[b] = y0, y1
			if isK && kdst >= 0 {
				o := kdst + int64((h-r.Heads)*hd)
				cache[o+int64(a)], cache[o+int64(b)] = y0, y1
			}
		}
		if kdst < 0 {
			continue
		}
		lo := 0
		if rotate {
			lo = tab.Dim
		}
		for j := range r.KVHeads * hd {
			if j%hd >= lo {
				cache[kdst+int64(j)] = kr[j]
			}
			cache[vdst+int64(j)] = vr[j]
		}
	}
}

func TestRopeKVModelMatchesRef(t *testing.T) {
	const heads, kvHeads, headDim, pt, maxPos = 6, 2, 16, 4, 64
	width := (heads + 2*kvHeads) * headDim
	pos := []int32{0, 1, 17, 63, 30, 5, 9}
	for _, rot := range []int{16, 8} {
		tab, err := ref.NewRopeTable(rot, maxPos, 10000)
		if err != nil {
			t.Fatal(err)
		}
		for _, gptj := range []bool{false, true} {
			page := int64(3 * 2 * pt * kvHeads * headDim)
			l, err := NewKVSlabLayoutOf(F32, 4*8*page, 4*page, 2, pt, kvHeads, headDim)
			if err != nil {
				t.Fatal(err)
			}
			arena := modelRand(9, int(16*8*page))
			ids := rand.New(rand.NewPCG(1, 1)).Perm(16 * 8)
			slots := make([]int64, len(pos))
			for i, p := range pos {
				id := uint32(ids[i]/8)<<PageSlotBits | uint32(ids[i]%8)
				slots[i] = int64(id)*pt + int64(p)%pt
			}
			slots[5] = -1
			qkv := modelRand(10, len(pos)*width)
			r := RopeKV{Tokens: len(pos), Heads: heads, KVHeads: kvHeads, HeadDim: headDim, QStride: width, KVStride: width,
				PageTokens: pt, GPTJ: gptj, Layout: l}
			got, gotArena := slices.Clone(qkv), slices.Clone(arena)
			modelRopeKV(got, got[heads*headDim:], got[(heads+kvHeads)*headDim:], gotArena, pos, slots, tab, r)

			q, k, v := make([]float32, len(pos)*heads*headDim), make([]float32, len(pos)*kvHeads*headDim), make([]float32, len(pos)*kvHeads*headDim)
			for i := range pos {
				row := qkv[i*width:]
				copy(q[i*heads*headDim:], row[:heads*headDim])
				copy(k[i*kvHeads*headDim:], row[heads*headDim:(heads+kvHeads)*headDim])
				copy(v[i*kvHeads*headDim:], row[(heads+kvHeads)*headDim:width])
			}
			rotate := tab.RoPENeoX
			if gptj {
				rotate = tab.RoPEInterleaved
			}
			rotate(q, pos, len(pos), heads, headDim)
			rotate(k, pos, len(pos), kvHeads, headDim)
			want := slices.Clone(arena)
			rk := &ref.PagedKV{K: want, V: want, PageTokens: pt, KVHeads: kvHeads, HeadDim: headDim,
				PageOffset: func(p uint32) int { return int(l.KeyOffset(p)) }, VPageOffset: func(p uint32) int { return int(l.ValueOffset(p)) }}
			if err := rk.StoreKV(k, v, slots); err != nil {
				t.Fatal(err)
			}
			name := fmt.Sprintf("rot %d gptj %v", rot, gptj)
			if !slices.Equal(gotArena, want) {
				t.Errorf("%s: the cache differs from PagedKV.StoreKV of the rotated keys", name)
			}
			for i := range pos {
				gq, gk := got[i*width:i*width+heads*headDim], got[i*width+heads*headDim:i*width+(heads+kvHeads)*headDim]
				if !slices.Equal(gq, q[i*heads*headDim:(i+1)*heads*headDim]) || !slices.Equal(gk, k[i*kvHeads*headDim:(i+1)*kvHeads*headDim]) {
					t.Errorf("%s: token %d: rotated q or k differs from the reference", name, i)
				}
			}
		}
	}
}
