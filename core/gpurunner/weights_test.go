package gpurunner

import (
	"encoding/binary"
	"slices"
	"testing"

	"github.com/resin-llm/resin/core/weights"
)

func TestWeightLayoutAndPieces(t *testing.T) {
	for _, tied := range []bool{false, true} {
		c, w := randomDense(1000, 64, 3, 4, 2, 16, 128, 64, 1)
		c.TiedEmbeddings = tied
		if tied {
			w.Head = w.Embed
		}
		if err := w.Check(c); err != nil {
			t.Fatal(err)
		}
		l := NewWeightLayout(c)
		ps := w.pieces(c, &l)
		var secs []Section
		var bytes int64
		for _, p := range ps {
			n := 0
			for _, s := range p.src {
				n += len(s)
			}
			if int64(2*n) != p.dst.Len {
				t.Errorf("tied %v, %s: %d values into %d bytes", tied, p.name, n, p.dst.Len)
			}
			if p.dst.Off%workspaceAlign != 0 {
				t.Errorf("tied %v, %s at %d: not %d-aligned", tied, p.name, p.dst.Off, workspaceAlign)
			}
			secs = append(secs, p.dst)
			bytes += p.dst.Len
		}
		slices.SortFunc(secs, func(a, b Section) int { return int(a.Off - b.Off) })
		for i := 1; i < len(secs); i++ {
			if secs[i-1].Off+secs[i-1].Len > secs[i].Off {
				t.Errorf("tied %v: %+v and %+v overlap", tied, secs[i-1], secs[i])
			}
		}
		if bytes != c.WeightBytes() {
			t.Errorf("tied %v: %d bytes uploaded, WeightBytes says %d", tied, bytes, c.WeightBytes())
		}
		if tied != (l.Head == l.Embed) {
			t.Errorf("tied %v: head %+v, embed %+v", tied, l.Head, l.Embed)
		}
		// The fused QKV rows are q, then k, then v.
		qkv := ps[3] // embed, attn norm, mlp norm, qkv
		if qkv.name != "layer 0 qkv" || &qkv.src[0][0] != &w.Layers[0].Q[0] || &qkv.src[2][0] != &w.Layers[0].V[0] {
			t.Errorf("piece 3 is %s, not layer 0's q, k, v", qkv.name)
		}
	}
}

func TestPackBF16(t *testing.T) {
	src := [][]float32{{1, -2.5}, {3.140625, 1e-3}}
	dst := make([]byte, 8)
	if n := packBF16(dst, src...); n != 8 {
		t.Fatalf("%d bytes", n)
	}
	for i, v := range []float32{1, -2.5, 3.140625, 1e-3} {
		if got := binary.LittleEndian.Uint16(dst[2*i:]); got != weights.Float32ToBF16(v) {
			t.Errorf("value %d: %#04x, want %#04x", i, got, weights.Float32ToBF16(v))
		}
	}
}

func TestDenseWeightsCheck(t *testing.T) {
	c, w := randomDense(100, 32, 2, 4, 2, 8, 64, 32, 1)
	w.Layers[1].Up = w.Layers[1].Up[:10]
	if err := w.Check(c); err == nil {
		t.Error("a short up projection passed")
	}
	c, w = randomDense(100, 32, 2, 4, 2, 8, 64, 32, 1)
	c.QKVBias = true
	if err := w.Check(c); err == nil {
		t.Error("a Qwen2-style config (q/k/v biases) passed though the GPU model does not run them")
	}
}
