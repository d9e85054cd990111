package deepseekv4flash

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/resin-llm/resin/core/weights"
)

// Architectures lists the HF architectures this model loads; `--model auto` picks the
// model by them.
var Architectures = []string{"DeepseekV4ForCausalLM"}

// ModelType is the config.json model_type of DeepSeek-V4.
const ModelType = "deepseek_v4"

// Attention layer kinds (config layer_types), as transformers 5.23.0 spells them.
const (
	SlidingAttention  = "sliding_attention"
	CompressedSparse  = "compressed_sparse_attention"  // CSA: overlapping compressor + lightning indexer
	HeavilyCompressed = "heavily_compressed_attention" // HCA: non-overlapping compressor, all entries
)

// MLP layer kinds (config mlp_layer_types).
const (
	HashMoE = "hash_moe" // experts chosen by tid2eid[token id]
	MoE     = "moe"      // experts chosen by the learned router
)

// legacyCompressRatio maps the upstream per-layer compress_ratios to layer types.
var legacyCompressRatio = map[int]string{0: SlidingAttention, 4: CompressedSparse, 128: HeavilyCompressed}

// RopeParams is one of rope_parameters' two sub-dicts ("main" for sliding layers,
// "compress" for CSA/HCA layers, their compressors and the indexer). Raw keeps every key as
// transformers leaves it after normalisation.
type RopeParams struct {
	Raw map[string]any
}

func (r RopeParams) num(key string) (float64, bool) {
	v, ok := r.Raw[key].(float64)
	return v, ok
}

// Type is rope_type ("default" or "yarn").
func (r RopeParams) Type() string {
	if s, ok := r.Raw["rope_type"].(string); ok {
		return s
	}
	return "default"
}

// Theta is rope_theta.
func (r RopeParams) Theta() float64 { v, _ := r.num("rope_theta"); return v }

// RotaryDim is the number of rotated (trailing) channels of a head: int(head_dim ·
// partial_rotary_factor), the factor defaulting to 1 when the sub-dict lacks it.
func (r RopeParams) RotaryDim(headDim int) int {
	f, ok := r.num("partial_rotary_factor")
	if !ok {
		f = 1
	}
	return int(float64(headDim) * f)
}

// Config is DeepSeek-V4's configuration after transformers 5.23.0's DeepseekV4Config
// normalisation: legacy fields folded in, per-layer kinds filled, rope_parameters nested.
type Config struct {
	Architectures         []string         `json:"architectures"`
	ModelType             string           `json:"model_type"`
	VocabSize             int              `json:"vocab_size"`
	HiddenSize            int              `json:"hidden_size"`
	MoEIntermediateSize   int              `json:"moe_intermediate_size"`
	NumHiddenLayers       int              `json:"num_hidden_layers"`
	NumAttentionHeads     int              `json:"num_attention_heads"`
	NumKeyValueHeads      int              `json:"num_key_value_heads"` // read by nothing: V4 has one shared K=V head
	HeadDim               int              `json:"head_dim"`
	QLoraRank             int              `json:"q_lora_rank"`
	NumExpertsPerTok      int              `json:"num_experts_per_tok"`
	NRoutedExperts        int              `json:"n_routed_experts"`
	NSharedExperts        int              `json:"n_shared_experts"` // the modeling builds one shared MLP whatever its value
	ScoringFunc           string           `json:"scoring_func"`
	NormTopKProb          bool             `json:"norm_topk_prob"` // ignored: weights are always normalised
	RoutedScalingFactor   float64          `json:"routed_scaling_factor"`
	MaxPositionEmbeddings int              `json:"max_position_embeddings"`
	RopeTheta             float64          `json:"rope_theta"`
	LayerTypes            []string         `json:"layer_types"`
	CompressRates         map[string]int   `json:"compress_rates"`
	CompressRopeTheta     float64          `json:"compress_rope_theta"`
	HCMult                int              `json:"hc_mult"`
	HCSinkhornIters       int              `json:"hc_sinkhorn_iters"`
	HCEps                 float64          `json:"hc_eps"`
	MLPLayerTypes         []string         `json:"mlp_layer_types"`
	SwigluLimit           float64          `json:"swiglu_limit"`
	SlidingWindow         int              `json:"sliding_window"`
	OGroups               int              `json:"o_groups"`
	OLoraRank             int              `json:"o_lora_rank"`
	IndexNHeads           int              `json:"index_n_heads"`
	IndexHeadDim          int              `json:"index_head_dim"`
	IndexTopK             int              `json:"index_topk"`
	NumNextNPredictLayers int              `json:"num_nextn_predict_layers"`
	HiddenAct             string           `json:"hidden_act"`
	RMSNormEps            float64          `json:"rms_norm_eps"`
	BOSTokenID            weights.TokenIDs `json:"bos_token_id"`
	EOSTokenID            weights.TokenIDs `json:"eos_token_id"`
	PadTokenID            weights.TokenIDs `json:"pad_token_id"`
	TieWordEmbeddings     bool             `json:"tie_word_embeddings"`
	PartialRotaryFactor   float64          `json:"partial_rotary_factor"`
	AttentionBias         bool             `json:"attention_bias"`
	MLPBias               bool             `json:"mlp_bias"`
	TorchDType            string           `json:"torch_dtype"`

	// QKRopeHeadDim is int(head_dim · partial_rotary_factor), the attribute transformers
	// derives (save_pretrained writes it; it is ignored on input when
	// partial_rotary_factor is set).
	QKRopeHeadDim int `json:"-"`
	// Quant is quantization_config (with a top-level expert_dtype folded in); nil for an
	// unquantized checkpoint.
	Quant *weights.Quant `json:"-"`
	// Rope holds rope_parameters' "main" and "compress" sub-dicts.
	Rope map[string]RopeParams `json:"-"`
	// Raw keeps every config.json field.
	Raw map[string]json.RawMessage `json:"-"`
	// dspark is set by ParseDSparkConfig: the checkpoint's mtp.* tensors are then DSpark
	// drafter stages, which LoadWeights leaves to LoadDSparkStages.
	dspark *DSparkConfig
}

// defaultConfig is DeepseekV4Config's dataclass defaults.
func defaultConfig() Config {
	return Config{
		VocabSize: 129280, HiddenSize: 4096, MoEIntermediateSize: 2048, NumHiddenLayers: 43,
		NumAttentionHeads: 64, NumKeyValueHeads: 1, HeadDim: 512, QLoraRank: 1024,
		NumExpertsPerTok: 6, NRoutedExperts: 256, NSharedExperts: 1, ScoringFunc: "sqrtsoftplus",
		NormTopKProb: true, RoutedScalingFactor: 1.5, MaxPositionEmbeddings: 1048576,
		RopeTheta: 10000, CompressRopeTheta: 160000, HCMult: 4, HCSinkhornIters: 20, HCEps: 1e-6,
		SwigluLimit: 10, SlidingWindow: 128, OGroups: 8, OLoraRank: 1024, IndexNHeads: 64,
		IndexHeadDim: 128, IndexTopK: 512, NumNextNPredictLayers: 1, HiddenAct: "silu",
		RMSNormEps: 1e-6, BOSTokenID: weights.TokenIDs{0}, EOSTokenID: weights.TokenIDs{1},
	}
}

// legacyFields are the upstream (V3-flavoured) keys DeepseekV4Config folds into current ones.
type legacyFields struct {
	CompressRatios  []int           `json:"compress_ratios"`
	CompressRateCSA *int            `json:"compress_rate_csa"`
	CompressRateHCA *int            `json:"compress_rate_hca"`
	NumHashLayers   *int            `json:"num_hash_layers"`
	QKRopeHeadDim   *int            `json:"qk_rope_head_dim"`
	RopeScaling     json.RawMessage `json:"rope_scaling"`
	RopeParameters  json.RawMessage `json:"rope_parameters"`
}

// ParseConfig parses config.json and normalises it as DeepseekV4Config.__post_init__ does
// (transformers 5.23.0), then refuses what this model cannot run, naming the field.
func ParseConfig(data []byte) (*Config, error) {
	c := defaultConfig()
	if err := json.Unmarshal(data, &c.Raw); err != nil {
		return nil, fmt.Errorf("config: %w: %v", weights.ErrFormat, err)
	}
	// A null scalar means "unset" (the dataclass default stays); a null list or dict is
	// None, which is also "derive the default" below.
	clean := map[string]json.RawMessage{}
	for k, v := range c.Raw {
		if string(v) != "null" {
			clean[k] = v
		}
	}
	b, _ := json.Marshal(clean)
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, fmt.Errorf("config: %w: %v", weights.ErrFormat, err)
	}
	for _, k := range []string{"bos_token_id", "eos_token_id", "pad_token_id"} {
		if v, ok := c.Raw[k]; ok && string(v) == "null" {
			switch k {
			case "bos_token_id":
				c.BOSTokenID = nil
			case "eos_token_id":
				c.EOSTokenID = nil
			}
		}
	}
	var lg legacyFields
	if err := json.Unmarshal(b, &lg); err != nil {
		return nil, fmt.Errorf("config: %w: legacy fields: %v", weights.ErrFormat, err)
	}
	if c.ModelType == "" {
		c.ModelType = ModelType
	}
	if c.ModelType != ModelType {
		return nil, fmt.Errorf("config: model_type %q is not implemented by this model (it implements %s)", c.ModelType, ModelType)
	}
	for _, a := range c.Architectures {
		if !slices.Contains(Architectures, a) {
			return nil, fmt.Errorf("config: architecture %q is not implemented by this model (it implements %s)", a, strings.Join(Architectures, ", "))
		}
	}
	if err := refuseDSpark(c.Raw, lg.CompressRatios, c.NumHiddenLayers, c.VocabSize); err != nil {
		return nil, err
	}
	if err := c.normalise(lg); err != nil {
		return nil, err
	}
	q, err := parseQuantization(c.Raw["quantization_config"])
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	if q != nil {
		if err := q.FoldExpertDType(c.Raw["expert_dtype"]); err != nil {
			return nil, fmt.Errorf("config: %w", err)
		}
	}
	c.Quant = q
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &c, nil
}

// refuseDSpark refuses a DSpark checkpoint (DeepSeek-V4-Flash-0731: dspark_* keys, and
// compress_ratios that go on past the layers and the one MTP layer into the drafter's
// stages, which the checkpoint holds in mtp.0–2). transformers 5.23.0 parses such a config
// and drops what it does not know; this model would then fail on the drafter's tensors, so
// it says what the checkpoint is at config time instead, after checking the dspark_* keys
// (parseDSpark, dspark.go).
func refuseDSpark(raw map[string]json.RawMessage, ratios []int, layers, vocab int) error {
	var keys []string
	for k, v := range raw {
		if strings.HasPrefix(k, "dspark_") && string(v) != "null" {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	const not = "ParseConfig reads the base model's config only: read a DSpark checkpoint's with ParseDSparkConfig (LoadConfig and Load do)"
	if len(keys) > 0 {
		d, err := parseDSpark(raw, ratios, layers, vocab)
		if err != nil {
			return fmt.Errorf("config: a DSpark checkpoint: %w", err)
		}
		return fmt.Errorf("config: %s: a DSpark checkpoint (%s); %s", strings.Join(keys, ", "), d, not)
	}
	if len(ratios) > layers+1 {
		return fmt.Errorf("config: compress_ratios has %d entries for num_hidden_layers %d and one MTP layer: the %d more are drafter stages, as in a DSpark checkpoint; %s",
			len(ratios), layers, len(ratios)-layers-1, not)
	}
	return nil
}

// normalise reproduces DeepseekV4Config.__post_init__.
func (c *Config) normalise(lg legacyFields) error {
	n := c.NumHiddenLayers
	if c.CompressRates == nil {
		c.CompressRates = map[string]int{CompressedSparse: 4, HeavilyCompressed: 128}
	}
	if lg.CompressRateCSA != nil {
		c.CompressRates[CompressedSparse] = *lg.CompressRateCSA
	}
	if lg.CompressRateHCA != nil {
		c.CompressRates[HeavilyCompressed] = *lg.CompressRateHCA
	}
	if c.LayerTypes == nil && lg.CompressRatios != nil {
		for i, r := range lg.CompressRatios {
			t, ok := legacyCompressRatio[r]
			if !ok {
				return fmt.Errorf("config: compress_ratios[%d] = %d: not one of 0 (sliding), 4 (CSA), 128 (HCA)", i, r)
			}
			c.LayerTypes = append(c.LayerTypes, t)
		}
	}
	if c.LayerTypes == nil {
		c.LayerTypes = []string{}
		for i := range n {
			switch {
			case i < 2:
				c.LayerTypes = append(c.LayerTypes, HeavilyCompressed)
			case (i-2)%2 == 1:
				c.LayerTypes = append(c.LayerTypes, CompressedSparse)
			default:
				c.LayerTypes = append(c.LayerTypes, HeavilyCompressed)
			}
		}
	}
	if len(c.LayerTypes) > n {
		c.LayerTypes = c.LayerTypes[:n]
	}
	if c.MLPLayerTypes == nil {
		nHash := 3
		if lg.NumHashLayers != nil {
			nHash = *lg.NumHashLayers
		}
		c.MLPLayerTypes = []string{}
		for i := range n {
			if i < nHash {
				c.MLPLayerTypes = append(c.MLPLayerTypes, HashMoE)
			} else {
				c.MLPLayerTypes = append(c.MLPLayerTypes, MoE)
			}
		}
	}
	if len(c.MLPLayerTypes) > n {
		c.MLPLayerTypes = c.MLPLayerTypes[:n]
	}
	if _, ok := c.Raw["partial_rotary_factor"]; !ok || string(c.Raw["partial_rotary_factor"]) == "null" {
		c.PartialRotaryFactor = 64.0 / 512
		if lg.QKRopeHeadDim != nil {
			c.PartialRotaryFactor = float64(*lg.QKRopeHeadDim) / float64(c.HeadDim)
		}
	}
	c.QKRopeHeadDim = int(float64(c.HeadDim) * c.PartialRotaryFactor)

	// rope_parameters: PreTrainedConfig turns a legacy rope_scaling into rope_parameters
	// first; then V4 keeps an already nested {main, compress} as is, or builds it.
	var rp map[string]any
	src := lg.RopeParameters
	if len(src) == 0 {
		src = lg.RopeScaling
	}
	if len(src) > 0 {
		if err := json.Unmarshal(src, &rp); err != nil {
			return fmt.Errorf("config: rope_parameters: %v", err)
		}
	}
	mainD, okM := rp["main"].(map[string]any)
	compD, okC := rp["compress"].(map[string]any)
	if okM && okC {
		c.Rope = map[string]RopeParams{"main": {Raw: mainD}, "compress": {Raw: compD}}
	} else {
		compress := map[string]any{}
		for k, v := range rp {
			if k != "main" && k != "compress" {
				compress[k] = v
			}
		}
		compress["rope_theta"] = c.CompressRopeTheta
		compress["partial_rotary_factor"] = c.PartialRotaryFactor
		if _, ok := compress["rope_type"]; !ok {
			compress["rope_type"] = "default"
			if t, ok := compress["type"]; ok {
				compress["rope_type"] = t
			}
		}
		if compress["rope_type"] == "yarn" {
			if _, ok := compress["attention_factor"]; !ok {
				compress["attention_factor"] = 1.0
			}
		}
		c.Rope = map[string]RopeParams{
			"main":     {Raw: map[string]any{"rope_type": "default", "rope_theta": c.RopeTheta, "partial_rotary_factor": c.PartialRotaryFactor}},
			"compress": {Raw: compress},
		}
	}
	// validate_rope fills rope_type from "type" in each sub-dict.
	for _, r := range c.Rope {
		if _, ok := r.Raw["rope_type"]; !ok {
			r.Raw["rope_type"] = "default"
			if t, ok := r.Raw["type"]; ok {
				r.Raw["rope_type"] = t
			}
		}
	}
	return nil
}

// Validate checks the per-layer kinds (as DeepseekV4Config.validate_layer_type does) and
// refuses what this model cannot run, naming the field.
func (c *Config) Validate() error {
	n := c.NumHiddenLayers
	if n <= 0 {
		return fmt.Errorf("config: num_hidden_layers must be positive, got %d", n)
	}
	if len(c.LayerTypes) != n {
		return fmt.Errorf("config: num_hidden_layers (%d) must equal len(layer_types) (%d)", n, len(c.LayerTypes))
	}
	if len(c.MLPLayerTypes) != n {
		return fmt.Errorf("config: num_hidden_layers (%d) must equal len(mlp_layer_types) (%d)", n, len(c.MLPLayerTypes))
	}
	for i, t := range c.LayerTypes {
		if t != SlidingAttention && t != CompressedSparse && t != HeavilyCompressed {
			return fmt.Errorf("config: layer_types[%d] = %q is not one of %s, %s, %s", i, t, SlidingAttention, CompressedSparse, HeavilyCompressed)
		}
		if t != SlidingAttention && c.CompressRates[t] <= 0 {
			return fmt.Errorf("config: compress_rates[%q] must be positive, got %d", t, c.CompressRates[t])
		}
	}
	for i, t := range c.MLPLayerTypes {
		if t != HashMoE && t != MoE {
			return fmt.Errorf("config: mlp_layer_types[%d] = %q is not one of %s, %s", i, t, HashMoE, MoE)
		}
	}
	for _, f := range []struct {
		name string
		v    int
	}{
		{"vocab_size", c.VocabSize}, {"hidden_size", c.HiddenSize}, {"moe_intermediate_size", c.MoEIntermediateSize},
		{"num_attention_heads", c.NumAttentionHeads}, {"head_dim", c.HeadDim}, {"q_lora_rank", c.QLoraRank},
		{"num_experts_per_tok", c.NumExpertsPerTok}, {"n_routed_experts", c.NRoutedExperts},
		{"hc_mult", c.HCMult}, {"hc_sinkhorn_iters", c.HCSinkhornIters}, {"sliding_window", c.SlidingWindow},
		{"o_groups", c.OGroups}, {"o_lora_rank", c.OLoraRank}, {"index_n_heads", c.IndexNHeads},
		{"index_head_dim", c.IndexHeadDim}, {"index_topk", c.IndexTopK},
	} {
		if f.v <= 0 {
			return fmt.Errorf("config: %s must be positive, got %d", f.name, f.v)
		}
	}
	if c.NumExpertsPerTok > c.NRoutedExperts {
		return fmt.Errorf("config: num_experts_per_tok (%d) exceeds n_routed_experts (%d)", c.NumExpertsPerTok, c.NRoutedExperts)
	}
	if c.NumAttentionHeads*c.HeadDim%c.OGroups != 0 {
		return fmt.Errorf("config: o_groups (%d) must divide num_attention_heads·head_dim (%d)", c.OGroups, c.NumAttentionHeads*c.HeadDim)
	}
	switch c.ScoringFunc {
	case "sqrtsoftplus", "sigmoid":
	default:
		return fmt.Errorf("config: scoring_func %q is not implemented (sqrtsoftplus, sigmoid; transformers has no %q activation either)", c.ScoringFunc, c.ScoringFunc)
	}
	if c.HiddenAct != "silu" {
		return fmt.Errorf("config: hidden_act %q is not implemented (the experts use silu)", c.HiddenAct)
	}
	if c.MLPBias {
		return fmt.Errorf("config: mlp_bias (biases on the shared expert) is not implemented by this model")
	}
	if c.NumNextNPredictLayers < 0 || c.NumNextNPredictLayers > 1 {
		return fmt.Errorf("config: num_nextn_predict_layers %d: this model runs at most one MTP layer", c.NumNextNPredictLayers)
	}
	for _, k := range []string{"main", "compress"} {
		r, ok := c.Rope[k]
		if !ok {
			return fmt.Errorf("config: rope_parameters lacks %q", k)
		}
		if d := r.RotaryDim(c.HeadDim); d <= 0 || d%2 != 0 || d > c.HeadDim {
			return fmt.Errorf("config: rope_parameters[%q]: rotary dim %d must be even and in (0, head_dim]", k, d)
		}
		if d := r.RotaryDim(c.HeadDim); k == "compress" && d > c.IndexHeadDim {
			return fmt.Errorf("config: rope_parameters[compress]: rotary dim %d does not fit index_head_dim %d", d, c.IndexHeadDim)
		}
		if !(r.Theta() > 0) {
			return fmt.Errorf("config: rope_parameters[%q].rope_theta must be positive", k)
		}
		switch r.Type() {
		case "default":
		case "yarn":
			if f, ok := r.num("factor"); !ok || !(f > 0) {
				return fmt.Errorf("config: rope_parameters[%q] yarn needs a positive factor", k)
			}
			if o, ok := r.num("original_max_position_embeddings"); !ok || !(o > 0) {
				return fmt.Errorf("config: rope_parameters[%q] yarn needs original_max_position_embeddings", k)
			}
		default:
			return fmt.Errorf("config: rope_parameters[%q].rope_type %q is not implemented (default, yarn)", k, r.Type())
		}
	}
	return nil
}

// LayerRatio returns the compression ratio of layer i (0 for a sliding layer).
func (c *Config) LayerRatio(i int) int {
	if c.LayerTypes[i] == SlidingAttention {
		return 0
	}
	return c.CompressRates[c.LayerTypes[i]]
}

// LoadConfig reads dir/config.json.
func LoadConfig(dir string) (*Config, error) {
	data, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return nil, fmt.Errorf("load config: %w", err)
	}
	var c *Config
	if isDSparkConfig(data) {
		c, _, err = ParseDSparkConfig(data)
	} else {
		c, err = ParseConfig(data)
	}
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", filepath.Join(dir, "config.json"), err)
	}
	return c, nil
}

// Rotary is one rotary embedding (the "main" or "compress" one) over the trailing Dim
// channels of a head: inverse frequencies in float32 as transformers computes them, and the
// attention scaling applied to cos and sin.
type Rotary struct {
	InvFreq []float32 // [Dim/2]
	Scale   float32
	Dim     int
}

// NewRotary builds the rotary of rope_parameters[kind] for heads of headDim channels
// (DeepseekV4RotaryEmbedding: default or YaRN inverse frequencies).
func (c *Config) NewRotary(kind string, headDim int) Rotary {
	r := c.Rope[kind]
	// The compute functions size the rotary from config.head_dim, whatever tensor it is
	// applied to (the indexer's heads are narrower): its trailing rope slice is the same.
	dim := r.RotaryDim(c.HeadDim)
	base := r.Theta()
	half := dim / 2
	posFreq := make([]float32, half)
	for i := range posFreq {
		posFreq[i] = float32(math.Pow(base, float64(float32(2*i)/float32(dim))))
	}
	inv := make([]float32, half)
	scale := float32(1)
	switch r.Type() {
	case "yarn":
		factor, _ := r.num("factor")
		orig, _ := r.num("original_max_position_embeddings")
		att, hasAtt := r.num("attention_factor")
		if !hasAtt {
			mscale, _ := r.num("mscale")
			mscaleAll, _ := r.num("mscale_all_dim")
			get := func(s, m float64) float64 {
				if s <= 1 {
					return 1
				}
				return 0.1*m*math.Log(s) + 1
			}
			if mscale != 0 && mscaleAll != 0 {
				att = get(factor, mscale) / get(factor, mscaleAll)
			} else {
				att = get(factor, 1)
			}
		}
		scale = float32(att)
		betaFast, _ := r.num("beta_fast")
		if betaFast == 0 {
			betaFast = 32
		}
		betaSlow, _ := r.num("beta_slow")
		if betaSlow == 0 {
			betaSlow = 1
		}
		corr := func(rot float64) float64 {
			return float64(dim) * math.Log(orig/(rot*2*math.Pi)) / (2 * math.Log(base))
		}
		// truncate is read from the top level of rope_parameters, which V4 nests: always true.
		low, high := math.Floor(corr(betaFast)), math.Ceil(corr(betaSlow))
		low, high = max(low, 0), min(high, float64(dim-1))
		if low == high {
			high += 0.001
		}
		for i := range inv {
			ramp := (float32(i) - float32(low)) / float32(high-low)
			ramp = min(max(ramp, 0), 1)
			ext := 1 - ramp
			extra := 1 / posFreq[i]
			inter := 1 / (float32(factor) * posFreq[i])
			inv[i] = inter*(1-ext) + extra*ext
		}
	default:
		for i := range inv {
			inv[i] = 1 / posFreq[i]
		}
	}
	return Rotary{InvFreq: inv, Scale: scale, Dim: dim}
}

// Apply rotates the trailing Dim channels of each of the rows·heads heads of x (interleaved
// pairs: channels 2i, 2i+1 of the rope slice) at the row's position; inverse applies the
// conjugate rotation (−sin), as V4 does to the attention output.
//
//	x: [rows, heads, headDim]   pos: [rows]
func (r Rotary) Apply(x []float32, pos []int32, rows, heads, headDim int, inverse bool) {
	half := r.Dim / 2
	cos, sin := make([]float32, half), make([]float32, half)
	for t := range rows {
		for i := range half {
			f := float32(pos[t]) * r.InvFreq[i]
			cos[i] = float32(math.Cos(float64(f))) * r.Scale
			sin[i] = float32(math.Sin(float64(f))) * r.Scale
			if inverse {
				sin[i] = -sin[i]
			}
		}
		for h := range heads {
			v := x[(t*heads+h)*headDim+headDim-r.Dim : (t*heads+h+1)*headDim]
			for i := range half {
				a, b := v[2*i], v[2*i+1]
				v[2*i] = a*cos[i] - b*sin[i]
				v[2*i+1] = b*cos[i] + a*sin[i]
			}
		}
	}
}
