package gpurunner

import (
	"fmt"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/weights"
)

// DenseLayer is one decoder layer's parameters on the host, float32 and row-major as in
// the checkpoint (a Linear weight is [out, in]); optional tensors are nil. Its fields are
// those of models/llama.Layer, in the same order, so a llama layer converts to it.
type DenseLayer struct {
	AttnNorm, MLPNorm   []float32 // [hidden]
	Q, K, V, O          []float32 // [q, hidden], [kv, hidden] ×2, [hidden, q]
	QBias, KBias, VBias []float32 // [q], [kv] ×2
	OBias               []float32 // [hidden]
	QNorm, KNorm        []float32 // [headDim]
	Gate, Up, Down      []float32 // [inter, hidden] ×2, [hidden, inter]
}

// DenseWeights are a dense model's parameters on the host.
type DenseWeights struct {
	Embed  []float32 // [vocab, hidden]; a vocab-parallel rank's [VocabShard, hidden] (DenseConfig)
	Layers []DenseLayer
	Norm   []float32 // [hidden]
	Head   []float32 // as Embed; the embeddings when tied
}

// LayerWeights are where one layer's bf16 parameters sit in the device weights. QKV is the
// q, k and v projections stacked ([q+2kv, hidden], one GEMM) and GateUp gate over up
// ([2·inter, hidden]), the layout the fused SiLU-mul reads. The optional parameters of
// the Qwen variants are empty sections when the config lacks them: QKVBias the q, k and
// v biases stacked as the QKV GEMM's output row ([q+2kv]), OBias [hidden], QNorm and
// KNorm [headDim] each.
type LayerWeights struct {
	AttnNorm, MLPNorm, QKV, O, GateUp, Down Section
	QKVBias, OBias, QNorm, KNorm            Section
}

// WeightLayout is where every parameter sits in the one device allocation of a dense
// model's bf16 weights, each at a 256-byte boundary.
type WeightLayout struct {
	Embed, Norm, Head Section // Head equals Embed when tied
	Layers            []LayerWeights
	Size              int64
}

// NewWeightLayout lays out the bf16 weights of c.
func NewWeightLayout(c *DenseConfig) WeightLayout {
	var off int64
	next := func(elems int) Section {
		s := Section{Off: off, Len: int64(elems) * 2}
		off += (s.Len + workspaceAlign - 1) / workspaceAlign * workspaceAlign
		return s
	}
	h := c.Hidden
	w := WeightLayout{Embed: next(c.VocabRows() * h), Layers: make([]LayerWeights, c.Layers)}
	for l := range w.Layers {
		lw := &w.Layers[l]
		*lw = LayerWeights{
			AttnNorm: next(h), MLPNorm: next(h), QKV: next(c.QKVDim() * h), O: next(h * c.QDim()),
			GateUp: next(2 * c.Intermediate * h), Down: next(h * c.Intermediate),
		}
		if c.QKVBias {
			lw.QKVBias = next(c.QKVDim())
		}
		if c.OBias {
			lw.OBias = next(h)
		}
		if c.QKNorm {
			lw.QNorm, lw.KNorm = next(c.HeadDim), next(c.HeadDim)
		}
	}
	w.Norm = next(h)
	if c.TiedEmbeddings {
		w.Head = w.Embed
	} else {
		w.Head = next(c.VocabRows() * h)
	}
	w.Size = off
	return w
}

// Check reports the first tensor of w whose size does not match c: the optional q/k/v
// and o biases and q/k norms must be there exactly when c asks for them (one the config
// does not name would be left out of the GPU forward).
func (w *DenseWeights) Check(c *DenseConfig) error {
	h, q, kv, in := c.Hidden, c.QDim(), c.KVDim(), c.Intermediate
	if len(w.Layers) != c.Layers {
		return fmt.Errorf("gpurunner: %d layers of weights for %d layers", len(w.Layers), c.Layers)
	}
	sizes := []struct {
		name string
		v    []float32
		n    int
	}{{"embed", w.Embed, c.VocabRows() * h}, {"norm", w.Norm, h}, {"head", w.Head, c.VocabRows() * h}}
	for i, l := range w.Layers {
		p := fmt.Sprintf("layer %d ", i)
		sizes = append(sizes, []struct {
			name string
			v    []float32
			n    int
		}{{p + "attn norm", l.AttnNorm, h}, {p + "mlp norm", l.MLPNorm, h}, {p + "q", l.Q, q * h}, {p + "k", l.K, kv * h},
			{p + "v", l.V, kv * h}, {p + "o", l.O, h * q}, {p + "gate", l.Gate, in * h}, {p + "up", l.Up, in * h}, {p + "down", l.Down, h * in}}...)
		for _, o := range []struct {
			name, flag string
			on         bool
			v          []float32
			n          int
		}{{"q bias", "qkv bias", c.QKVBias, l.QBias, q}, {"k bias", "qkv bias", c.QKVBias, l.KBias, kv}, {"v bias", "qkv bias", c.QKVBias, l.VBias, kv},
			{"o bias", "o bias", c.OBias, l.OBias, h}, {"q norm", "qk norm", c.QKNorm, l.QNorm, c.HeadDim}, {"k norm", "qk norm", c.QKNorm, l.KNorm, c.HeadDim}} {
			switch {
			case o.on && len(o.v) != o.n:
				return fmt.Errorf("gpurunner: %s%s weight has %d values, want %d (the config sets %s)", p, o.name, len(o.v), o.n, o.flag)
			case !o.on && o.v != nil:
				return fmt.Errorf("gpurunner: %s%s weight given but the config does not set %s", p, o.name, o.flag)
			}
		}
	}
	for _, s := range sizes {
		if len(s.v) != s.n {
			return fmt.Errorf("gpurunner: %s weight has %d values, want %d", s.name, len(s.v), s.n)
		}
	}
	return nil
}

// pieces lists what goes where: each destination section of the layout with the host
// tensors concatenated into it, in order.
func (w *DenseWeights) pieces(c *DenseConfig, l *WeightLayout) []weightPiece {
	ps := []weightPiece{{"embed", l.Embed, [][]float32{w.Embed}}}
	for i, lw := range w.Layers {
		d := &l.Layers[i]
		ps = append(ps,
			weightPiece{fmt.Sprintf("layer %d attn norm", i), d.AttnNorm, [][]float32{lw.AttnNorm}},
			weightPiece{fmt.Sprintf("layer %d mlp norm", i), d.MLPNorm, [][]float32{lw.MLPNorm}},
			weightPiece{fmt.Sprintf("layer %d qkv", i), d.QKV, [][]float32{lw.Q, lw.K, lw.V}},
			weightPiece{fmt.Sprintf("layer %d o", i), d.O, [][]float32{lw.O}},
			weightPiece{fmt.Sprintf("layer %d gate_up", i), d.GateUp, [][]float32{lw.Gate, lw.Up}},
			weightPiece{fmt.Sprintf("layer %d down", i), d.Down, [][]float32{lw.Down}},
		)
		if c.QKVBias {
			ps = append(ps, weightPiece{fmt.Sprintf("layer %d qkv bias", i), d.QKVBias, [][]float32{lw.QBias, lw.KBias, lw.VBias}})
		}
		if c.OBias {
			ps = append(ps, weightPiece{fmt.Sprintf("layer %d o bias", i), d.OBias, [][]float32{lw.OBias}})
		}
		if c.QKNorm {
			ps = append(ps,
				weightPiece{fmt.Sprintf("layer %d q norm", i), d.QNorm, [][]float32{lw.QNorm}},
				weightPiece{fmt.Sprintf("layer %d k norm", i), d.KNorm, [][]float32{lw.KNorm}})
		}
	}
	ps = append(ps, weightPiece{"norm", l.Norm, [][]float32{w.Norm}})
	if !c.TiedEmbeddings {
		ps = append(ps, weightPiece{"head", l.Head, [][]float32{w.Head}})
	}
	return ps
}

type weightPiece struct {
	name string
	dst  Section
	src  [][]float32
}

// stageBytes is the size of the host buffer weights are converted to bf16 in.
const stageBytes = 64 << 20

// packBF16 converts src (concatenated) to bf16 little-endian bytes into dst.
func packBF16(dst []byte, src ...[]float32) int {
	n := 0
	for _, s := range src {
		for _, v := range s {
			b := weights.Float32ToBF16(v)
			dst[n], dst[n+1] = byte(b), byte(b>>8)
			n += 2
		}
	}
	return n
}

// uploadWeights converts w to bf16 and copies it into the device allocation buf laid out
// by l, reporting progress to progress (nil: silent) as a checkpoint load does.
func uploadWeights(c *cudart.Ctx, buf cudart.Buffer, cfg *DenseConfig, l *WeightLayout, w *DenseWeights, progress weights.ProgressFunc) error {
	ps := w.pieces(cfg, l)
	var total int64
	for _, p := range ps {
		total += p.dst.Len
	}
	stage, err := c.AllocHost(stageBytes)
	if err != nil {
		return fmt.Errorf("upload weights: staging buffer: %w", err)
	}
	defer c.FreeHost(stage)
	var done int64
	for i, p := range ps {
		// Convert and copy in chunks of whole rows of the staging buffer.
		off := p.dst.Off
		for _, src := range p.src {
			for len(src) > 0 {
				n := min(len(src), stageBytes/2)
				b := packBF16(stage.Bytes, src[:n])
				if err := c.CopyHtoD(buf.Ptr.Add(off), stage.Bytes[:b]); err != nil {
					return fmt.Errorf("upload weights: %s: %w", p.name, err)
				}
				off += int64(b)
				src = src[n:]
			}
		}
		if off != p.dst.Off+p.dst.Len {
			return fmt.Errorf("upload weights: %s: wrote %d bytes into %d", p.name, off-p.dst.Off, p.dst.Len)
		}
		done += p.dst.Len
		if progress != nil {
			progress(weights.Progress{Tensors: i + 1, TotalTensors: len(ps), Bytes: done, TotalBytes: total, Done: i+1 == len(ps)})
		}
	}
	return nil
}
