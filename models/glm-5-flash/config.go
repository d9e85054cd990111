package glm5flash

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/resin-llm/resin/core/weights"
)

// Architectures lists the HF architectures of glm5_next checkpoints; `--model auto` picks
// this model by them. transformers 5.23.0 defines only the multimodal
// Glm5NextForConditionalGeneration (there is no text-only CausalLM class); the text-only
// name is what flat, text-only exports carry.
var Architectures = []string{"Glm5NextForConditionalGeneration", "Glm5NextForCausalLM"}

// GLM model types: the top-level config (text_config + vision_config, or flat) and the text
// sub-config.
const (
	GLMModelType  = "glm5_next"
	TextModelType = "glm5_next_text"
)

// Attention layer kinds (text_config.layer_types) as transformers 5.23.0 spells them.
// Two other spellings of IndexedAttention are accepted and mapped to it, as 5.23.0 maps
// them: "full_attention" (Glm5NextTextConfig.__post_init__) and DeepSeekSparseAttention
// (configuration_utils' _LEGACY_LAYER_TYPE_REMAP), the name GLM-5.3-Flash's published
// config uses and transformers main's own.
const (
	LinearAttention  = "linear_attention"  // Kimi Delta Attention: recurrent state + short conv
	IndexedAttention = "indexed_attention" // NoPE MLA with DSA (pooled indexer keys, top-k pools)

	DeepSeekSparseAttention = "deepseek_sparse_attention" // the published (and transformers main's) IndexedAttention
)

// MLP layer kinds (mlp_layer_types).
const (
	DenseMLP  = "dense"  // one SwiGLU MLP of intermediate_size
	SparseMLP = "sparse" // routed experts + shared experts
)

// Indexer kinds (indexer_types) of indexed-attention layers.
const (
	IndexerFull   = "full"   // runs its own indexer
	IndexerShared = "shared" // reuses the top-k of the immediately preceding (full) layer
)

// TextConfig is GLM-5.3-Flash's text model configuration after transformers 5.23.0's
// Glm5NextConfig / Glm5NextTextConfig normalisation: the nested text_config (or the flat
// top-level fields), per-layer kinds filled, the legacy linear_attn_config folded in.
type TextConfig struct {
	VocabSize             int              `json:"vocab_size"`
	HiddenSize            int              `json:"hidden_size"`
	IntermediateSize      int              `json:"intermediate_size"`
	MoEIntermediateSize   int              `json:"moe_intermediate_size"`
	NumHiddenLayers       int              `json:"num_hidden_layers"`
	NumAttentionHeads     int              `json:"num_attention_heads"`
	NumKeyValueHeads      int              `json:"num_key_value_heads"` // must equal num_attention_heads
	NSharedExperts        int              `json:"n_shared_experts"`    // one shared MLP of width moe·n_shared
	NRoutedExperts        int              `json:"n_routed_experts"`
	RoutedScalingFactor   float64          `json:"routed_scaling_factor"`
	KVLoraRank            int              `json:"kv_lora_rank"`
	QLoraRank             int              `json:"q_lora_rank"`
	QKRopeHeadDim         int              `json:"qk_rope_head_dim"` // must be 0 (NoPE)
	VHeadDim              int              `json:"v_head_dim"`
	QKNopeHeadDim         int              `json:"qk_nope_head_dim"`
	QKHeadDim             int              `json:"qk_head_dim"` // derived: nope + rope
	HeadDim               int              `json:"head_dim"`    // forced to qk_rope_head_dim
	NGroup                int              `json:"n_group"`
	TopKGroup             int              `json:"topk_group"`
	NumExpertsPerTok      int              `json:"num_experts_per_tok"`
	NormTopKProb          bool             `json:"norm_topk_prob"`
	HiddenAct             string           `json:"hidden_act"`
	MaxPositionEmbeddings int              `json:"max_position_embeddings"`
	RMSNormEps            float64          `json:"rms_norm_eps"`
	PadTokenID            weights.TokenIDs `json:"pad_token_id"`
	BOSTokenID            weights.TokenIDs `json:"bos_token_id"`
	EOSTokenID            weights.TokenIDs `json:"eos_token_id"`
	MLPLayerTypes         []string         `json:"mlp_layer_types"`
	AttentionBias         bool             `json:"attention_bias"`
	IndexTopK             int              `json:"index_topk"`
	IndexHeadDim          int              `json:"index_head_dim"`
	IndexNHeads           int              `json:"index_n_heads"`
	LayerTypes            []string         `json:"layer_types"`
	IndexerTypes          []string         `json:"indexer_types"`
	SwigluLimit           float64          `json:"swiglu_limit"`
	LinearHeadDim         int              `json:"linear_head_dim"`
	LinearNumHeads        int              `json:"linear_num_heads"`
	LinearConvKernelDim   int              `json:"linear_conv_kernel_dim"`
	LinearLowerBound      *float64         `json:"linear_lower_bound"` // nil: g = −exp(A_log)·softplus(...)
	HCMult                int              `json:"hc_mult"`
	HCEps                 float64          `json:"hc_eps"`
	HCSinkhornIters       int              `json:"hc_sinkhorn_iters"`
	IndexKPool            int              `json:"index_kpool"`
	IndexKPoolSelectTail  bool             `json:"index_kpool_always_select_tail"`

	// TieWordEmbeddings is the top-level Glm5NextConfig field (lm_head ties to
	// model.language_model.embed_tokens only when it is true); text_config's own
	// tie_word_embeddings is read by nothing.
	TieWordEmbeddings bool `json:"tie_word_embeddings"`
	// ImageTokenID and VideoTokenID are the top-level multimodal placeholders: prompts
	// holding them need the vision tower, which this text model refuses.
	ImageTokenID, VideoTokenID int `json:"-"`
	// Quant is quantization_config; nil for an unquantized checkpoint.
	Quant *weights.Quant `json:"-"`
	// Notes says what was ignored (vision_config).
	Notes []string `json:"-"`
	// Raw keeps the text fields as given (text_config, or the flat top level).
	Raw map[string]json.RawMessage `json:"-"`
}

// defaultTextConfig is Glm5NextTextConfig's dataclass defaults.
func defaultTextConfig() TextConfig {
	lb := -5.0
	return TextConfig{
		VocabSize: 154880, HiddenSize: 4096, IntermediateSize: 12288, MoEIntermediateSize: 2048,
		NumHiddenLayers: 45, NumAttentionHeads: 64, NumKeyValueHeads: 64, NSharedExperts: 1,
		NRoutedExperts: 288, RoutedScalingFactor: 2.5, KVLoraRank: 512, QLoraRank: 1536,
		VHeadDim: 256, QKNopeHeadDim: 256, NGroup: 1, TopKGroup: 1, NumExpertsPerTok: 8,
		NormTopKProb: true, HiddenAct: "silu", MaxPositionEmbeddings: 1048576, RMSNormEps: 1e-5,
		PadTokenID: weights.TokenIDs{154820}, IndexTopK: 2048, IndexHeadDim: 128,
		IndexNHeads: 32, SwigluLimit: 10, LinearHeadDim: 128, LinearNumHeads: 64,
		LinearConvKernelDim: 4, LinearLowerBound: &lb, HCMult: 4, HCEps: 1e-6,
		HCSinkhornIters: 20, IndexKPool: 16, IndexKPoolSelectTail: true,
		ImageTokenID: 154854, VideoTokenID: 154855,
	}
}

// nullable are the text fields whose dataclass type admits None; a null anywhere else is
// refused as transformers' strict validation does.
var nullable = map[string]bool{
	"pad_token_id": true, "bos_token_id": true, "eos_token_id": true,
	"linear_lower_bound": true, "mlp_layer_types": true, "layer_types": true,
	"indexer_types": true, "linear_attn_config": true, "index_topk_pattern": true,
}

// topLevelOnly are Glm5NextConfig's own fields: in a flat config they stay at the top
// level and do not reach text_config.
var topLevelOnly = []string{"text_config", "vision_config", "image_token_id", "video_token_id",
	"image_start_token_id", "image_end_token_id", "video_start_token_id", "video_end_token_id",
	"tie_word_embeddings", "architectures", "model_type", "quantization_config", "transformers_version"}

// ParseTextConfig parses a glm5_next config.json (nested text_config + vision_config, or
// flat) and normalises the text model's fields as transformers 5.23.0 does, then refuses
// what this model cannot run, naming the field.
func ParseTextConfig(data []byte) (*TextConfig, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(data, &top); err != nil {
		return nil, fmt.Errorf("config: %w: %v", weights.ErrFormat, err)
	}
	var modelType string
	if v, ok := top["model_type"]; ok && string(v) != "null" {
		if err := json.Unmarshal(v, &modelType); err != nil {
			return nil, fmt.Errorf("config: model_type: %w: %v", weights.ErrFormat, err)
		}
	}
	switch modelType {
	case "", GLMModelType, TextModelType:
	default:
		return nil, fmt.Errorf("config: model_type %q is not implemented by this model (it implements %s)", modelType, GLMModelType)
	}
	var archs []string
	if v, ok := top["architectures"]; ok && string(v) != "null" {
		if err := json.Unmarshal(v, &archs); err != nil {
			return nil, fmt.Errorf("config: architectures: %w: %v", weights.ErrFormat, err)
		}
	}
	for _, a := range archs {
		if !slices.Contains(Architectures, a) {
			return nil, fmt.Errorf("config: architecture %q is not implemented by this model (it implements %s)", a, strings.Join(Architectures, ", "))
		}
	}
	c := defaultTextConfig()
	text := map[string]json.RawMessage{}
	if v, ok := top["text_config"]; ok && string(v) != "null" {
		if err := json.Unmarshal(v, &text); err != nil {
			return nil, fmt.Errorf("config: text_config: %w: %v", weights.ErrFormat, err)
		}
	} else {
		for k, v := range top {
			if !slices.Contains(topLevelOnly, k) {
				text[k] = v
			}
		}
	}
	c.Raw = text
	if v, ok := top["vision_config"]; ok && string(v) != "null" {
		c.Notes = append(c.Notes, "vision_config ignored: the vision tower is not implemented (text model only; prompts with image or video tokens are refused)")
	}
	for k, dst := range map[string]any{"tie_word_embeddings": &c.TieWordEmbeddings, "image_token_id": &c.ImageTokenID, "video_token_id": &c.VideoTokenID} {
		if v, ok := top[k]; ok && string(v) != "null" {
			if err := json.Unmarshal(v, dst); err != nil {
				return nil, fmt.Errorf("config: %s: %w: %v", k, weights.ErrFormat, err)
			}
		}
	}
	if modelType == TextModelType {
		// A bare Glm5NextTextConfig: its own tie_word_embeddings is the only one there is.
		c.TieWordEmbeddings = false
		if v, ok := text["tie_word_embeddings"]; ok && string(v) != "null" {
			if err := json.Unmarshal(v, &c.TieWordEmbeddings); err != nil {
				return nil, fmt.Errorf("config: tie_word_embeddings: %w: %v", weights.ErrFormat, err)
			}
		}
	}
	clean := map[string]json.RawMessage{}
	for k, v := range text {
		if string(v) != "null" {
			if k != "tie_word_embeddings" && k != "qk_head_dim" {
				clean[k] = v
			}
			continue
		}
		switch {
		case nullable[k]:
		case k == "head_dim" || k == "qk_head_dim": // overridden whatever its value
		default:
			if _, known := reflectJSONFields[k]; known {
				return nil, fmt.Errorf("config: %s is null; transformers requires a value", k)
			}
		}
	}
	b, _ := json.Marshal(clean)
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, fmt.Errorf("config: %w: %v", weights.ErrFormat, err)
	}
	for _, k := range []string{"pad_token_id", "bos_token_id", "eos_token_id"} {
		if v, ok := text[k]; ok && string(v) == "null" {
			switch k {
			case "pad_token_id":
				c.PadTokenID = nil
			case "bos_token_id":
				c.BOSTokenID = nil
			case "eos_token_id":
				c.EOSTokenID = nil
			}
		}
	}
	if v, ok := text["linear_lower_bound"]; ok && string(v) == "null" {
		c.LinearLowerBound = nil
	}
	if err := c.normalise(text); err != nil {
		return nil, err
	}
	q, err := weights.ParseQuantization(top["quantization_config"])
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	c.Quant = q
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &c, nil
}

// reflectJSONFields are TextConfig's JSON field names (every one of them rejects null
// unless listed in nullable).
var reflectJSONFields = func() map[string]bool {
	b, _ := json.Marshal(defaultTextConfig())
	var m map[string]json.RawMessage
	_ = json.Unmarshal(b, &m)
	out := map[string]bool{}
	for k := range m {
		out[k] = true
	}
	return out
}()

// normalise reproduces Glm5NextTextConfig.__post_init__.
func (c *TextConfig) normalise(text map[string]json.RawMessage) error {
	n := c.NumHiddenLayers
	if c.MLPLayerTypes == nil {
		c.MLPLayerTypes = []string{}
		for i := range n {
			if i < 3 {
				c.MLPLayerTypes = append(c.MLPLayerTypes, DenseMLP)
			} else {
				c.MLPLayerTypes = append(c.MLPLayerTypes, SparseMLP)
			}
		}
	}
	layerTypesGiven := c.LayerTypes != nil
	if c.LayerTypes == nil {
		c.LayerTypes = []string{}
		for i := range n {
			if i%4 == 3 {
				c.LayerTypes = append(c.LayerTypes, IndexedAttention)
			} else {
				c.LayerTypes = append(c.LayerTypes, LinearAttention)
			}
		}
	}
	for i, t := range c.LayerTypes {
		if t == "full_attention" || t == DeepSeekSparseAttention {
			c.LayerTypes[i] = IndexedAttention
		}
	}
	if c.IndexerTypes == nil {
		if v, ok := text["index_topk_pattern"]; ok && string(v) != "null" {
			var s string
			if json.Unmarshal(v, &s) == nil {
				for j, ch := range s {
					switch ch {
					case 'F':
						c.IndexerTypes = append(c.IndexerTypes, IndexerFull)
					case 'S':
						c.IndexerTypes = append(c.IndexerTypes, IndexerShared)
					default:
						return fmt.Errorf("config: index_topk_pattern[%d] = %q: not F (full) or S (shared)", j, ch)
					}
				}
			} else if err := json.Unmarshal(v, &c.IndexerTypes); err != nil {
				return fmt.Errorf("config: index_topk_pattern: %w: %v", weights.ErrFormat, err)
			}
		} else {
			freq, offset := 1, 2
			if v, ok := text["index_topk_freq"]; ok {
				if err := json.Unmarshal(v, &freq); err != nil {
					return fmt.Errorf("config: index_topk_freq: %w: %v", weights.ErrFormat, err)
				}
			}
			if v, ok := text["index_skip_topk_offset"]; ok {
				if err := json.Unmarshal(v, &offset); err != nil {
					return fmt.Errorf("config: index_skip_topk_offset: %w: %v", weights.ErrFormat, err)
				}
			}
			freq = max(freq, 1)
			c.IndexerTypes = []string{}
			for i := range n {
				if max(i-offset+1, 0)%freq == 0 {
					c.IndexerTypes = append(c.IndexerTypes, IndexerFull)
				} else {
					c.IndexerTypes = append(c.IndexerTypes, IndexerShared)
				}
			}
		}
	}
	if v, ok := text["linear_attn_config"]; ok && string(v) != "null" {
		var la map[string]json.RawMessage
		if err := json.Unmarshal(v, &la); err != nil {
			return fmt.Errorf("config: linear_attn_config: %w: %v", weights.ErrFormat, err)
		}
		for k, dst := range map[string]*int{"head_dim": &c.LinearHeadDim, "num_heads": &c.LinearNumHeads, "short_conv_kernel_size": &c.LinearConvKernelDim} {
			if r, ok := la[k]; ok {
				if err := json.Unmarshal(r, dst); err != nil {
					return fmt.Errorf("config: linear_attn_config.%s: %w: %v", k, weights.ErrFormat, err)
				}
			}
		}
		if r, ok := la["gate_lower_bound"]; ok {
			if string(r) == "null" {
				c.LinearLowerBound = nil
			} else {
				var f float64
				if err := json.Unmarshal(r, &f); err != nil {
					return fmt.Errorf("config: linear_attn_config.gate_lower_bound: %w: %v", weights.ErrFormat, err)
				}
				c.LinearLowerBound = &f
			}
		}
		safe := true
		if r, ok := la["safe_gate"]; ok && string(r) != "null" {
			if err := json.Unmarshal(r, &safe); err != nil {
				return fmt.Errorf("config: linear_attn_config.safe_gate: %w: %v", weights.ErrFormat, err)
			}
		}
		if safe && c.LinearLowerBound == nil {
			lb := -5.0
			c.LinearLowerBound = &lb
		}
		if err := c.layersFromLinearAttn(la, layerTypesGiven); err != nil {
			return err
		}
	}
	// Fields of the published config that transformers does not read; another value than
	// GLM-5.3-Flash's would be another model.
	for _, f := range []struct{ key, want string }{
		{"mhc", "true"}, {"mla_use_nope", "true"}, {"index_kpool_compress", "true"}, {"scoring_func", `"sigmoid"`},
	} {
		if v, ok := text[f.key]; ok && string(v) != "null" && strings.TrimSpace(string(v)) != f.want {
			return fmt.Errorf("config: %s = %s is not implemented (GLM-5.3-Flash has %s)", f.key, v, f.want)
		}
	}
	c.HeadDim = c.QKRopeHeadDim
	c.QKHeadDim = c.QKRopeHeadDim + c.QKNopeHeadDim
	return nil
}

// layersFromLinearAttn reads linear_attn_config's kda_layers and full_attn_layers, the
// 0-based indices of the KDA and the DSA layers (SGLang's Glm5NextTextConfig.is_kda_layer;
// transformers reads neither). Together they must name each layer 0..n-1 once; one alone
// leaves the rest to the other kind. They fill layer_types when it was not given, and must
// agree with it when it was.
func (c *TextConfig) layersFromLinearAttn(la map[string]json.RawMessage, layerTypesGiven bool) error {
	n := c.NumHiddenLayers
	lists := []struct {
		key  string
		kind string
	}{{"kda_layers", LinearAttention}, {"full_attn_layers", IndexedAttention}}
	kind := make([]string, n)
	named := make([]string, n) // which list named layer i
	found := false
	for _, l := range lists {
		r, ok := la[l.key]
		if !ok || string(r) == "null" {
			continue
		}
		found = true
		var idx []int
		if err := json.Unmarshal(r, &idx); err != nil {
			return fmt.Errorf("config: linear_attn_config.%s: %w: want a list of layer indices: %v", l.key, weights.ErrFormat, err)
		}
		for _, i := range idx {
			if i < 0 || i >= n {
				return fmt.Errorf("config: linear_attn_config.%s names layer %d of %d: indices are 0-based (0..%d), as GLM publishes them (Kimi-Linear's lists are 1-based)", l.key, i, n, n-1)
			}
			switch named[i] {
			case "":
			case l.key:
				return fmt.Errorf("config: linear_attn_config.%s names layer %d twice", l.key, i)
			default:
				return fmt.Errorf("config: linear_attn_config.kda_layers and full_attn_layers both name layer %d", i)
			}
			named[i], kind[i] = l.key, l.kind
		}
	}
	if !found {
		return nil
	}
	for _, l := range lists {
		if r, ok := la[l.key]; !ok || string(r) == "null" {
			for i := range n { // the other list alone: the rest are this kind
				if kind[i] == "" {
					kind[i] = l.kind
				}
			}
		}
	}
	for i := range n {
		if kind[i] == "" {
			return fmt.Errorf("config: linear_attn_config.kda_layers and full_attn_layers leave layer %d out (together they must name layers 0..%d)", i, n-1)
		}
	}
	if !layerTypesGiven {
		c.LayerTypes = kind
		return nil
	}
	if len(c.LayerTypes) != n {
		return nil // Validate names the length mismatch
	}
	for i, t := range c.LayerTypes {
		if t != kind[i] && (t == LinearAttention || t == IndexedAttention) {
			key := "full_attn_layers"
			if kind[i] == LinearAttention {
				key = "kda_layers"
			}
			if named[i] == "" { // the one list given leaves layer i to the other kind
				key = "full_attn_layers"
				if kind[i] == IndexedAttention {
					key = "kda_layers"
				}
				return fmt.Errorf("config: layer_types[%d] = %s contradicts linear_attn_config.%s, which does not list layer %d", i, t, key, i)
			}
			return fmt.Errorf("config: layer_types[%d] = %s contradicts linear_attn_config.%s, which lists layer %d", i, t, key, i)
		}
	}
	return nil
}

// Validate checks what transformers validates (validate_architecture, validate_layer_type)
// and refuses, naming the field, what this model cannot run.
func (c *TextConfig) Validate() error {
	n := c.NumHiddenLayers
	pos := map[string]int{"vocab_size": c.VocabSize, "hidden_size": c.HiddenSize, "num_hidden_layers": n,
		"num_attention_heads": c.NumAttentionHeads, "kv_lora_rank": c.KVLoraRank, "q_lora_rank": c.QLoraRank,
		"qk_nope_head_dim": c.QKNopeHeadDim, "v_head_dim": c.VHeadDim, "index_n_heads": c.IndexNHeads,
		"index_head_dim": c.IndexHeadDim, "linear_head_dim": c.LinearHeadDim, "linear_num_heads": c.LinearNumHeads,
		"linear_conv_kernel_dim": c.LinearConvKernelDim, "hc_mult": c.HCMult, "hc_sinkhorn_iters": c.HCSinkhornIters,
		"index_topk": c.IndexTopK}
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range pos {
			if !yield(k) {
				return
			}
		}
	}) {
		if pos[k] < 1 {
			return fmt.Errorf("config: %s = %d must be positive", k, pos[k])
		}
	}
	if c.NumAttentionHeads != c.NumKeyValueHeads {
		return fmt.Errorf("config: num_attention_heads (%d) must be the same as num_key_value_heads (%d)", c.NumAttentionHeads, c.NumKeyValueHeads)
	}
	if c.IndexKPool < 1 {
		return fmt.Errorf("config: index_kpool must be positive, got %d", c.IndexKPool)
	}
	if c.IndexTopK%c.IndexKPool != 0 {
		return fmt.Errorf("config: index_topk (%d) must be divisible by index_kpool (%d)", c.IndexTopK, c.IndexKPool)
	}
	if c.QKRopeHeadDim != 0 {
		return fmt.Errorf("config: qk_rope_head_dim = %d: the DSA layers are NoPE (it must be 0)", c.QKRopeHeadDim)
	}
	if len(c.LayerTypes) != n {
		return fmt.Errorf("config: num_hidden_layers (%d) must be equal to the number of layer_types (%d)", n, len(c.LayerTypes))
	}
	for i, t := range c.LayerTypes {
		if t != LinearAttention && t != IndexedAttention {
			return fmt.Errorf("config: layer_types[%d] = %q: this model runs %s and %s (full_attention maps to %s)", i, t, LinearAttention, IndexedAttention, IndexedAttention)
		}
	}
	if len(c.MLPLayerTypes) != n {
		return fmt.Errorf("config: num_hidden_layers (%d) must be equal to the number of mlp_layer_types (%d)", n, len(c.MLPLayerTypes))
	}
	for i, t := range c.MLPLayerTypes {
		if t != DenseMLP && t != SparseMLP {
			return fmt.Errorf("config: mlp_layer_types[%d] = %q: not %s or %s", i, t, DenseMLP, SparseMLP)
		}
	}
	if len(c.IndexerTypes) < n {
		return fmt.Errorf("config: indexer_types has %d entries for %d layers", len(c.IndexerTypes), n)
	}
	for i := range n {
		t := c.IndexerTypes[i]
		if t != IndexerFull && t != IndexerShared {
			return fmt.Errorf("config: indexer_types[%d] = %q: not %s or %s", i, t, IndexerFull, IndexerShared)
		}
		if t == IndexerShared && c.LayerTypes[i] == IndexedAttention {
			// transformers raises at the first forward; refuse it here.
			if i == 0 || c.LayerTypes[i-1] != IndexedAttention || c.IndexerTypes[i-1] != IndexerFull {
				return fmt.Errorf("config: indexer_types[%d] = shared needs layer %d to be a full indexed_attention layer (layer_types, indexer_types)", i, i-1)
			}
		}
	}
	if !c.IndexKPoolSelectTail {
		// Without the tail a query before its first complete pool sees no token, and
		// transformers' eager mask then spreads it uniformly over every key, future ones too.
		return fmt.Errorf("config: index_kpool_always_select_tail = false is not supported (a query before its first complete pool would attend to nothing)")
	}
	if c.HiddenAct != "silu" {
		return fmt.Errorf("config: hidden_act %q: only silu runs here", c.HiddenAct)
	}
	if c.AttentionBias {
		return fmt.Errorf("config: attention_bias = true is not implemented (GLM-5.3-Flash has none)")
	}
	if slices.Contains(c.MLPLayerTypes, SparseMLP) {
		if c.NRoutedExperts < 1 || c.NumExpertsPerTok < 1 || c.NumExpertsPerTok > c.NRoutedExperts {
			return fmt.Errorf("config: num_experts_per_tok = %d of n_routed_experts = %d", c.NumExpertsPerTok, c.NRoutedExperts)
		}
		if c.NGroup < 1 || c.NRoutedExperts%c.NGroup != 0 || c.TopKGroup < 1 || c.TopKGroup > c.NGroup {
			return fmt.Errorf("config: n_group = %d, topk_group = %d for %d experts: groups must divide the experts and topk_group ≤ n_group", c.NGroup, c.TopKGroup, c.NRoutedExperts)
		}
		if c.NGroup > 1 && c.NRoutedExperts/c.NGroup < 2 {
			return fmt.Errorf("config: n_group = %d leaves fewer than 2 experts per group (the group score sums the top 2)", c.NGroup)
		}
		if c.NumExpertsPerTok > c.TopKGroup*(c.NRoutedExperts/c.NGroup) {
			return fmt.Errorf("config: num_experts_per_tok = %d exceeds the experts of topk_group = %d groups", c.NumExpertsPerTok, c.TopKGroup)
		}
		if c.MoEIntermediateSize < 1 {
			return fmt.Errorf("config: moe_intermediate_size = %d must be positive", c.MoEIntermediateSize)
		}
	}
	if slices.Contains(c.MLPLayerTypes, DenseMLP) && c.IntermediateSize < 1 {
		return fmt.Errorf("config: intermediate_size = %d must be positive", c.IntermediateSize)
	}
	if c.NSharedExperts < 0 {
		return fmt.Errorf("config: n_shared_experts = %d", c.NSharedExperts)
	}
	if c.Quant != nil && c.Quant.ExpertDType == weights.ExpertFP4 {
		return fmt.Errorf("config: quantization_config expert_dtype fp4 is a DeepSeek-V4 format; GLM-5.3-Flash ships FP8")
	}
	return nil
}

// IndexPools is the number of pools the indexer selects: index_topk / index_kpool.
func (c *TextConfig) IndexPools() int { return c.IndexTopK / c.IndexKPool }

// LinearDim is the width of one KDA projection (q, k or v): linear_num_heads·linear_head_dim.
func (c *TextConfig) LinearDim() int { return c.LinearNumHeads * c.LinearHeadDim }

// RefuseVisionTokens returns an error when ids hold an image or video placeholder token:
// they need the vision tower, which this text model does not implement.
func (c *TextConfig) RefuseVisionTokens(ids []int32) error {
	for i, id := range ids {
		if int(id) == c.ImageTokenID || int(id) == c.VideoTokenID {
			return fmt.Errorf("glm-5-flash: token %d at position %d is an image/video placeholder: vision inputs are not supported (text model only)", id, i)
		}
	}
	return nil
}

// LoadTextConfig reads dir/config.json (or a config.json path).
func LoadTextConfig(path string) (*TextConfig, error) {
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		path = filepath.Join(path, "config.json")
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	c, err := ParseTextConfig(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}
