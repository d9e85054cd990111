package gpurunner

import (
	"encoding/binary"
	"slices"
	"strings"
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
	for _, c := range []struct {
		name string
		edit func(c *DenseConfig, l *DenseLayer)
		want string
	}{
		{"qkv bias flag without biases", func(c *DenseConfig, l *DenseLayer) { c.QKVBias = true }, "layer 0 q bias weight has 0 values, want 32 (the config sets qkv bias)"},
		{"short k bias", func(c *DenseConfig, l *DenseLayer) { l.KBias = l.KBias[:3] }, "layer 1 k bias weight has 3 values, want 16"},
		{"o bias not in config", func(c *DenseConfig, l *DenseLayer) { c.OBias = false }, "layer 0 o bias weight given but the config does not set o bias"},
		{"short k norm", func(c *DenseConfig, l *DenseLayer) { l.KNorm = l.KNorm[:7] }, "layer 1 k norm weight has 7 values, want 8"},
		{"q norm without the flag", func(c *DenseConfig, l *DenseLayer) { c.QKNorm = false }, "layer 0 q norm weight given but the config does not set qk norm"},
	} {
		cfg, w := randomDense(100, 32, 2, 4, 2, 8, 64, 32, 1)
		if c.name != "qkv bias flag without biases" {
			withVariants(cfg, w, true, true, true, 2)
		}
		c.edit(cfg, &w.Layers[1])
		err := w.Check(cfg)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one saying %q", c.name, err, c.want)
		}
	}
	c, w = randomDense(100, 32, 2, 4, 2, 8, 64, 32, 1)
	withVariants(c, w, true, true, true, 2)
	if err := w.Check(c); err != nil {
		t.Errorf("a config with every Qwen option and its weights: %v", err)
	}
}

// TestWeightLayoutVariants lays out and packs, as uploadWeights does but into host bytes,
// the weights of Qwen2-, Qwen3- and o-bias-shaped configs, and reads back from each
// layer's sections what the forward's kernels read: the q|k|v bias in the order of the
// fused QKV GEMM's output row, the o bias, and the q and k norm weights.
func TestWeightLayoutVariants(t *testing.T) {
	for _, v := range []struct {
		name                   string
		qkvBias, oBias, qkNorm bool
	}{{"qwen2", true, false, false}, {"qwen3", false, false, true}, {"all", true, true, true}, {"llama", false, false, false}} {
		c, w := randomDense(300, 64, 2, 4, 2, 16, 128, 64, 5)
		withVariants(c, w, v.qkvBias, v.oBias, v.qkNorm, 6)
		if err := w.Check(c); err != nil {
			t.Fatalf("%s: %v", v.name, err)
		}
		l := NewWeightLayout(c)
		buf := make([]byte, l.Size)
		var uploaded int64
		for _, p := range w.pieces(c, &l) {
			if n := int64(packBF16(buf[p.dst.Off:p.dst.Off+p.dst.Len], p.src...)); n != p.dst.Len {
				t.Fatalf("%s, %s: %d bytes into a %d-byte section", v.name, p.name, n, p.dst.Len)
			}
			if p.dst.Off%workspaceAlign != 0 {
				t.Errorf("%s, %s at %d: not %d-aligned", v.name, p.name, p.dst.Off, workspaceAlign)
			}
			uploaded += p.dst.Len
		}
		if uploaded != c.WeightBytes() {
			t.Errorf("%s: %d bytes uploaded, WeightBytes says %d", v.name, uploaded, c.WeightBytes())
		}
		read := func(s Section) []float32 {
			out := make([]float32, s.Len/2)
			for i := range out {
				out[i] = weights.BF16ToFloat32(binary.LittleEndian.Uint16(buf[s.Off+int64(2*i):]))
			}
			return out
		}
		for i, lw := range l.Layers {
			hw := &w.Layers[i]
			want := map[string][]float32{}
			got := map[string]Section{"qkv bias": lw.QKVBias, "o bias": lw.OBias, "q norm": lw.QNorm, "k norm": lw.KNorm}
			if v.qkvBias {
				want["qkv bias"] = slices.Concat(hw.QBias, hw.KBias, hw.VBias)
			}
			if v.oBias {
				want["o bias"] = hw.OBias
			}
			if v.qkNorm {
				want["q norm"], want["k norm"] = hw.QNorm, hw.KNorm
			}
			for name, sec := range got {
				if e, on := want[name]; !on {
					if sec.Len != 0 {
						t.Errorf("%s, layer %d: %s section %+v in a config without it", v.name, i, name, sec)
					}
				} else if g := read(sec); !slices.Equal(g, e) {
					t.Errorf("%s, layer %d: %s section reads %v, want %v", v.name, i, name, g, e)
				}
			}
			if v.qkvBias && lw.QKVBias.Len != int64(2*c.QKVDim()) {
				t.Errorf("%s, layer %d: qkv bias of %d bytes, want one bf16 per QKV output column (%d)", v.name, i, lw.QKVBias.Len, c.QKVDim())
			}
			// The projections are still where they were: q|k|v rows, as before.
			if g := read(lw.QKV)[:4]; !slices.Equal(g, hw.Q[:4]) {
				t.Errorf("%s, layer %d: qkv section starts %v, want q's %v", v.name, i, g, hw.Q[:4])
			}
		}
	}
}
