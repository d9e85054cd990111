package llama

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/resin-llm/resin/core/weights"
)

// Layer holds one decoder layer's parameters, row-major as in the checkpoint (a Linear
// weight is [out, in]). Optional tensors are nil when the variant has none.
type Layer struct {
	AttnNorm, MLPNorm   []float32 // [hidden]
	Q, K, V, O          []float32 // [heads*headDim, hidden], [kvHeads*headDim, hidden] ×2, [hidden, heads*headDim]
	QBias, KBias, VBias []float32 // [heads*headDim], [kvHeads*headDim] ×2
	OBias               []float32 // [hidden]
	QNorm, KNorm        []float32 // [headDim]
	Gate, Up, Down      []float32 // [inter, hidden] ×2, [hidden, inter]

	// QKV and GateUp hold Q, K, V and Gate, Up back to back, so that each is one GEMM over
	// all of a step's tokens; Q, K, V, Gate and Up are views of them (see fuse).
	QKV    []float32 // [(heads + 2·kvHeads)·headDim, hidden]
	GateUp []float32 // [2·inter, hidden]
}

// fuse lays the layer's projections out as the forward's GEMMs read them: Q, K, V in one
// matrix and Gate, Up in another, the separate fields becoming views of them. It changes
// no value and does nothing the second time.
func (l *Layer) fuse() {
	if l.QKV == nil {
		l.QKV = slices.Concat(l.Q, l.K, l.V)
		q, k := len(l.Q), len(l.K)
		l.Q, l.K, l.V = l.QKV[:q:q], l.QKV[q:q+k:q+k], l.QKV[q+k:]
	}
	if l.GateUp == nil {
		l.GateUp = slices.Concat(l.Gate, l.Up)
		g := len(l.Gate)
		l.Gate, l.Up = l.GateUp[:g:g], l.GateUp[g:]
	}
}

// dropProjections releases the layers' float32 projections and an untied head, once a
// Model holds them in another dtype: the forward then reads only the embeddings and
// norms here.
func (w *Weights) dropProjections() {
	for i := range w.Layers {
		l := &w.Layers[i]
		l.Q, l.K, l.V, l.O, l.Gate, l.Up, l.Down, l.QKV, l.GateUp = nil, nil, nil, nil, nil, nil, nil, nil, nil
	}
	if len(w.Head) > 0 && len(w.Embed) > 0 && &w.Head[0] != &w.Embed[0] {
		w.Head = nil
	}
}

// Weights holds every parameter of the model.
type Weights struct {
	Embed  []float32 // [vocab, hidden]
	Layers []Layer
	Norm   []float32 // [hidden]
	Head   []float32 // [vocab, hidden]; aliases Embed when the embeddings are tied
}

// param is one tensor of the checkpoint: its HF name, shape and where it goes.
type param struct {
	name  string
	shape []int
	dst   *[]float32
	norm  bool // a norm weight (initialised near 1 by Random)
}

// params lists every tensor the config needs, with its HF name and its field in w. It is the one place the
// model's weight names live: loading, random initialisation and saving all walk it.
func params(c *Config, w *Weights) []param {
	h, d, inter := c.HiddenSize, c.HeadDim, c.IntermediateSize
	qd, kvd := c.NumAttentionHeads*d, c.NumKeyValueHeads*d
	if len(w.Layers) != c.NumHiddenLayers {
		w.Layers = make([]Layer, c.NumHiddenLayers)
	}
	ps := []param{{name: "model.embed_tokens.weight", shape: []int{c.VocabSize, h}, dst: &w.Embed}}
	for i := range w.Layers {
		l := &w.Layers[i]
		p := fmt.Sprintf("model.layers.%d.", i)
		ps = append(ps,
			param{name: p + "input_layernorm.weight", shape: []int{h}, dst: &l.AttnNorm, norm: true},
			param{name: p + "self_attn.q_proj.weight", shape: []int{qd, h}, dst: &l.Q},
			param{name: p + "self_attn.k_proj.weight", shape: []int{kvd, h}, dst: &l.K},
			param{name: p + "self_attn.v_proj.weight", shape: []int{kvd, h}, dst: &l.V},
			param{name: p + "self_attn.o_proj.weight", shape: []int{h, qd}, dst: &l.O},
			param{name: p + "post_attention_layernorm.weight", shape: []int{h}, dst: &l.MLPNorm, norm: true},
			param{name: p + "mlp.gate_proj.weight", shape: []int{inter, h}, dst: &l.Gate},
			param{name: p + "mlp.up_proj.weight", shape: []int{inter, h}, dst: &l.Up},
			param{name: p + "mlp.down_proj.weight", shape: []int{h, inter}, dst: &l.Down},
		)
		if c.QKVBias {
			ps = append(ps,
				param{name: p + "self_attn.q_proj.bias", shape: []int{qd}, dst: &l.QBias},
				param{name: p + "self_attn.k_proj.bias", shape: []int{kvd}, dst: &l.KBias},
				param{name: p + "self_attn.v_proj.bias", shape: []int{kvd}, dst: &l.VBias},
			)
		}
		if c.OBias {
			ps = append(ps, param{name: p + "self_attn.o_proj.bias", shape: []int{h}, dst: &l.OBias})
		}
		if c.QKNorm {
			ps = append(ps,
				param{name: p + "self_attn.q_norm.weight", shape: []int{d}, dst: &l.QNorm, norm: true},
				param{name: p + "self_attn.k_norm.weight", shape: []int{d}, dst: &l.KNorm, norm: true},
			)
		}
	}
	ps = append(ps, param{name: "model.norm.weight", shape: []int{h}, dst: &w.Norm, norm: true})
	if !c.TieWordEmbeddings {
		ps = append(ps, param{name: "lm_head.weight", shape: []int{c.VocabSize, h}, dst: &w.Head})
	}
	return ps
}

// LoadWeights reads every parameter from a checkpoint by HF name, checking shapes. A
// checkpoint must hold exactly the tensors the config needs: missing ones and ones the
// model would not use (a q_proj.bias with attention_bias false, another model's extra
// tensors) are refused, listed as transformers' load report lists them. Tolerated, as
// transformers tolerates them: rotary_emb.inv_freq buffers, and lm_head.weight beside tied
// embeddings when it equals them (transformers unties a different one; that is refused).
func LoadWeights(c *Config, ck *weights.Checkpoint) (*Weights, error) {
	w := &Weights{}
	ps := params(c, w)
	if err := checkNames(c, ck, ps); err != nil {
		return nil, fmt.Errorf("load weights: %w", err)
	}
	for _, p := range ps {
		v, err := ck.Float32(p.name, p.shape...)
		if err != nil {
			return nil, fmt.Errorf("load weights: %w", err)
		}
		*p.dst = v
	}
	if c.TieWordEmbeddings {
		w.Head = w.Embed
		if ck.Has("lm_head.weight") {
			head, err := ck.Float32("lm_head.weight", c.VocabSize, c.HiddenSize)
			if err != nil {
				return nil, fmt.Errorf("load weights: %w", err)
			}
			if !slices.Equal(head, w.Embed) {
				return nil, fmt.Errorf("load weights: lm_head.weight differs from model.embed_tokens.weight while tie_word_embeddings is true " +
					"(transformers then unties them and uses lm_head.weight): set tie_word_embeddings to false in config.json")
			}
		}
	}
	return w, nil
}

// checkNames compares the checkpoint's tensor names with the ones the model loads and
// reports the difference as transformers' load report does: UNEXPECTED tensors the model
// would not use, MISSING ones it needs (which transformers would initialize at random).
func checkNames(c *Config, ck *weights.Checkpoint, ps []param) error {
	want := map[string]bool{}
	for _, p := range ps {
		want[p.name] = true
	}
	var unexpected, missing []string
	for _, n := range ck.Names() {
		switch {
		case want[n]:
			delete(want, n)
		case strings.HasSuffix(n, "rotary_emb.inv_freq"): // a buffer older checkpoints saved
		case n == "lm_head.weight" && c.TieWordEmbeddings: // checked against the embeddings
		default:
			unexpected = append(unexpected, n)
		}
	}
	for _, p := range ps {
		if want[p.name] {
			missing = append(missing, p.name)
		}
	}
	if len(unexpected) == 0 && len(missing) == 0 {
		return nil
	}
	arch := c.Architecture()
	if arch == "" {
		arch = "the model"
	}
	var parts []string
	if len(unexpected) > 0 {
		parts = append(parts, fmt.Sprintf("UNEXPECTED (in the checkpoint, not used by the model) [%s]", strings.Join(unexpected, ", ")))
	}
	if len(missing) > 0 {
		parts = append(parts, fmt.Sprintf("MISSING (needed by the model; transformers would initialize them at random) [%s]", strings.Join(missing, ", ")))
	}
	return fmt.Errorf("%s load report from %s: %s", arch, ck.Dir, strings.Join(parts, "; "))
}

// WeightBytes is the size of the config's weights in float32, as RandomWeights and
// LoadWeights hold them.
func WeightBytes(c *Config) int64 {
	var n int64
	for _, p := range params(c, &Weights{}) {
		e := int64(4)
		for _, s := range p.shape {
			e *= int64(s)
		}
		n += e
	}
	return n
}

// RandomWeights returns seeded random weights for any config: uniform in ±1/sqrt(fan-in)
// for projections and embeddings, 1 ± 0.1 for norm weights, so that a tiny model produces
// varied tokens. The same seed gives the same weights.
func RandomWeights(c *Config, seed uint64) *Weights {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	w := &Weights{}
	for _, p := range params(c, w) {
		n := 1
		for _, s := range p.shape {
			n *= s
		}
		v := make([]float32, n)
		scale := float32(1 / math.Sqrt(float64(p.shape[len(p.shape)-1])))
		for i := range v {
			u := float32(rng.Float64()*2 - 1)
			if p.norm {
				v[i] = 1 + 0.1*u
			} else {
				v[i] = scale * u
			}
		}
		*p.dst = v
	}
	if c.TieWordEmbeddings {
		w.Head = w.Embed
	}
	return w
}

// Tensors returns the weights as safetensors tensors with HF names, stored as dt.
func (w *Weights) Tensors(c *Config, dt weights.DType) ([]weights.Tensor, error) {
	var ts []weights.Tensor
	for _, p := range params(c, w) {
		t, err := weights.NewTensor(p.name, dt, p.shape, *p.dst)
		if err != nil {
			return nil, err
		}
		ts = append(ts, t)
	}
	return ts, nil
}

// Save writes the weights to dir/model.safetensors as dt.
func (w *Weights) Save(c *Config, dir string, dt weights.DType) error {
	ts, err := w.Tensors(c, dt)
	if err != nil {
		return fmt.Errorf("save weights: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("save weights: %w", err)
	}
	return weights.WriteFile(filepath.Join(dir, "model.safetensors"), ts, map[string]string{"format": "pt"})
}
