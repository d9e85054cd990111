package dspark

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"

	"github.com/resin-llm/resin/core/weights"
)

// Layer is one draft decoder layer (Qwen3DSparkDecoderLayer): a Qwen3 layer whose k/v
// projections also read the context features. A Linear weight is [out, in].
type Layer struct {
	AttnNorm, MLPNorm   []float32 // [hidden]
	Q, K, V, O          []float32 // [heads·hd, hidden], [kv·hd, hidden] ×2, [hidden, heads·hd]
	QBias, KBias, VBias []float32 // attention_bias only
	OBias               []float32
	QNorm, KNorm        []float32 // [hd]
	Gate, Up, Down      []float32 // [inter, hidden] ×2, [hidden, inter]
}

// Weights holds a drafter's parameters under DeepSpec's names.
type Weights struct {
	Embed      []float32 // embed_tokens.weight [vocab, hidden]
	Layers     []Layer
	FC         []float32 // fc.weight [hidden, taps·hidden]
	HiddenNorm []float32 // hidden_norm.weight [hidden]
	Norm       []float32 // norm.weight [hidden]
	Head       []float32 // lm_head.weight [vocab, hidden]

	MarkovW1 []float32 // markov_head.markov_w1.weight [vocab, rank] (an embedding)
	MarkovW2 []float32 // markov_head.markov_w2.weight [vocab, rank]
	GateW    []float32 // gated: markov_head.gate_proj.weight [rank, hidden+rank]
	GateB    []float32 // [rank]
	JointW   []float32 // rnn: markov_head.joint_proj.weight [3·rank, 2·rank+hidden]
	JointB   []float32 // [3·rank]
	ConfW    []float32 // confidence_head.proj.weight [1, hidden (+rank)]
	ConfB    []float32 // [1]
}

// param is one tensor: its name in the drafter's safetensors, its shape and its field.
type param struct {
	name  string
	shape []int
	dst   *[]float32
	norm  bool // a norm weight (near 1 in RandomWeights)
}

// params lists every tensor the config needs: the one place the drafter's names live.
func params(c *Config, w *Weights) []param {
	b := c.Base
	h, d, inter, r := b.HiddenSize, b.HeadDim, b.IntermediateSize, c.MarkovRank
	qd, kvd := b.NumAttentionHeads*d, b.NumKeyValueHeads*d
	if len(w.Layers) != b.NumHiddenLayers {
		w.Layers = make([]Layer, b.NumHiddenLayers)
	}
	ps := []param{{name: "embed_tokens.weight", shape: []int{b.VocabSize, h}, dst: &w.Embed}}
	for i := range w.Layers {
		l := &w.Layers[i]
		p := fmt.Sprintf("layers.%d.", i)
		ps = append(ps,
			param{name: p + "input_layernorm.weight", shape: []int{h}, dst: &l.AttnNorm, norm: true},
			param{name: p + "self_attn.q_proj.weight", shape: []int{qd, h}, dst: &l.Q},
			param{name: p + "self_attn.k_proj.weight", shape: []int{kvd, h}, dst: &l.K},
			param{name: p + "self_attn.v_proj.weight", shape: []int{kvd, h}, dst: &l.V},
			param{name: p + "self_attn.o_proj.weight", shape: []int{h, qd}, dst: &l.O},
			param{name: p + "self_attn.q_norm.weight", shape: []int{d}, dst: &l.QNorm, norm: true},
			param{name: p + "self_attn.k_norm.weight", shape: []int{d}, dst: &l.KNorm, norm: true},
			param{name: p + "post_attention_layernorm.weight", shape: []int{h}, dst: &l.MLPNorm, norm: true},
			param{name: p + "mlp.gate_proj.weight", shape: []int{inter, h}, dst: &l.Gate},
			param{name: p + "mlp.up_proj.weight", shape: []int{inter, h}, dst: &l.Up},
			param{name: p + "mlp.down_proj.weight", shape: []int{h, inter}, dst: &l.Down},
		)
		if b.AttentionBias {
			ps = append(ps,
				param{name: p + "self_attn.q_proj.bias", shape: []int{qd}, dst: &l.QBias},
				param{name: p + "self_attn.k_proj.bias", shape: []int{kvd}, dst: &l.KBias},
				param{name: p + "self_attn.v_proj.bias", shape: []int{kvd}, dst: &l.VBias},
				param{name: p + "self_attn.o_proj.bias", shape: []int{h}, dst: &l.OBias},
			)
		}
	}
	ps = append(ps,
		param{name: "norm.weight", shape: []int{h}, dst: &w.Norm, norm: true},
		param{name: "fc.weight", shape: []int{h, c.FeatureDim()}, dst: &w.FC},
		param{name: "hidden_norm.weight", shape: []int{h}, dst: &w.HiddenNorm, norm: true},
		param{name: "lm_head.weight", shape: []int{b.VocabSize, h}, dst: &w.Head},
	)
	if r > 0 {
		ps = append(ps,
			param{name: "markov_head.markov_w1.weight", shape: []int{b.VocabSize, r}, dst: &w.MarkovW1},
			param{name: "markov_head.markov_w2.weight", shape: []int{b.VocabSize, r}, dst: &w.MarkovW2},
		)
		switch c.MarkovHead {
		case MarkovGated:
			ps = append(ps,
				param{name: "markov_head.gate_proj.weight", shape: []int{r, h + r}, dst: &w.GateW},
				param{name: "markov_head.gate_proj.bias", shape: []int{r}, dst: &w.GateB},
			)
		case MarkovRNN:
			ps = append(ps,
				param{name: "markov_head.joint_proj.weight", shape: []int{3 * r, 2*r + h}, dst: &w.JointW},
				param{name: "markov_head.joint_proj.bias", shape: []int{3 * r}, dst: &w.JointB},
			)
		}
	}
	if c.Confidence {
		in := h
		if c.ConfidenceMarkov {
			in += r
		}
		ps = append(ps,
			param{name: "confidence_head.proj.weight", shape: []int{1, in}, dst: &w.ConfW},
			param{name: "confidence_head.proj.bias", shape: []int{1}, dst: &w.ConfB},
		)
	}
	return ps
}

// LoadWeights reads every tensor the config needs, checking shapes. The checkpoint must
// hold exactly those: a missing tensor and one the drafter would not use (a "model."
// prefixed name, a head the config does not enable) are refused by name.
func LoadWeights(c *Config, ck *weights.Checkpoint) (*Weights, error) {
	w := &Weights{}
	ps := params(c, w)
	want := map[string]bool{}
	for _, p := range ps {
		want[p.name] = true
	}
	var unexpected, missing []string
	for _, n := range ck.Names() {
		switch {
		case want[n]:
		case strings.HasSuffix(n, "rotary_emb.inv_freq"):
		default:
			unexpected = append(unexpected, n)
		}
	}
	for _, p := range ps {
		if !ck.Has(p.name) {
			missing = append(missing, p.name)
		}
	}
	if len(unexpected) > 0 || len(missing) > 0 {
		var parts []string
		if len(unexpected) > 0 {
			parts = append(parts, fmt.Sprintf("unexpected tensors (not used by this config) [%s]", strings.Join(unexpected, ", ")))
		}
		if len(missing) > 0 {
			parts = append(parts, fmt.Sprintf("missing tensors [%s]", strings.Join(missing, ", ")))
		}
		return nil, fmt.Errorf("dspark: load weights from %s: %s", ck.Dir, strings.Join(parts, "; "))
	}
	for _, p := range ps {
		v, err := ck.Float32(p.name, p.shape...)
		if err != nil {
			return nil, fmt.Errorf("dspark: load weights: %w", err)
		}
		*p.dst = v
	}
	return w, nil
}

// RandomWeights returns seeded random weights for a config: uniform in ±1/sqrt(fan-in),
// norms near 1. For tests and benchmarks.
func RandomWeights(c *Config, seed uint64) *Weights {
	w := &Weights{}
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	for _, p := range params(c, w) {
		n := 1
		for _, s := range p.shape {
			n *= s
		}
		v := make([]float32, n)
		scale := 1 / math.Sqrt(float64(p.shape[len(p.shape)-1]))
		for i := range v {
			if p.norm {
				v[i] = float32(1 + 0.1*(rng.Float64()*2-1))
			} else {
				v[i] = float32(scale * (rng.Float64()*2 - 1))
			}
		}
		*p.dst = v
	}
	return w
}

// Tensors returns w as safetensors tensors under DeepSpec's names, in float32.
func Tensors(c *Config, w *Weights) ([]weights.Tensor, error) {
	var ts []weights.Tensor
	for _, p := range params(c, w) {
		t, err := weights.NewTensor(p.name, weights.F32, p.shape, *p.dst)
		if err != nil {
			return nil, fmt.Errorf("dspark: %s: %w", p.name, err)
		}
		ts = append(ts, t)
	}
	return ts, nil
}
