package weights

import (
	"encoding/json"
	"fmt"
	"os"
)

// Config is the part of a Hugging Face config.json that decoder-only text models share
// (Llama, Qwen2, Qwen3, Mistral and their relatives). Defaults are those of transformers;
// Raw keeps every field so a model can read its own extras.
type Config struct {
	Architectures         []string     `json:"architectures"`
	ModelType             string       `json:"model_type"`
	VocabSize             int          `json:"vocab_size"`
	HiddenSize            int          `json:"hidden_size"`
	IntermediateSize      int          `json:"intermediate_size"`
	NumHiddenLayers       int          `json:"num_hidden_layers"`
	NumAttentionHeads     int          `json:"num_attention_heads"`
	NumKeyValueHeads      int          `json:"num_key_value_heads"`
	HeadDim               int          `json:"head_dim"`
	HiddenAct             string       `json:"hidden_act"`
	RMSNormEps            float64      `json:"rms_norm_eps"`
	RopeTheta             float64      `json:"rope_theta"`
	RopeScaling           *RopeScaling `json:"rope_scaling"`
	MaxPositionEmbeddings int          `json:"max_position_embeddings"`
	TieWordEmbeddings     bool         `json:"tie_word_embeddings"`
	AttentionBias         bool         `json:"attention_bias"`
	MLPBias               bool         `json:"mlp_bias"`
	SlidingWindow         int          `json:"sliding_window"`
	UseSlidingWindow      bool         `json:"use_sliding_window"`
	BOSTokenID            TokenIDs     `json:"bos_token_id"`
	EOSTokenID            TokenIDs     `json:"eos_token_id"`
	TorchDType            string       `json:"torch_dtype"`

	Raw map[string]json.RawMessage `json:"-"`
}

// RopeScaling is config.json's rope_scaling (or transformers v5's rope_parameters).
type RopeScaling struct {
	RopeType                      string  `json:"rope_type"`
	Type                          string  `json:"type"`
	Factor                        float64 `json:"factor"`
	LowFreqFactor                 float64 `json:"low_freq_factor"`
	HighFreqFactor                float64 `json:"high_freq_factor"`
	OriginalMaxPositionEmbeddings int     `json:"original_max_position_embeddings"`
	RopeTheta                     float64 `json:"rope_theta"`
}

// Kind returns the scaling type ("default", "linear", "llama3", "yarn", ...).
func (r *RopeScaling) Kind() string {
	if r == nil {
		return "default"
	}
	if r.RopeType != "" {
		return r.RopeType
	}
	if r.Type != "" {
		return r.Type
	}
	return "default"
}

// TokenIDs is a token id field that config.json writes either as one number or a list.
type TokenIDs []int32

// UnmarshalJSON accepts null, a number or a list of numbers.
func (t *TokenIDs) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*t = nil
		return nil
	}
	var one int32
	if err := json.Unmarshal(b, &one); err == nil {
		*t = TokenIDs{one}
		return nil
	}
	var many []int32
	if err := json.Unmarshal(b, &many); err != nil {
		return fmt.Errorf("token id must be a number or a list of numbers, got %s", b)
	}
	*t = many
	return nil
}

// ParseConfig parses config.json, fills transformers' defaults (key/value heads = heads,
// head_dim = hidden/heads, rope_theta 10000, rms_norm_eps 1e-6) and validates the
// dimensions.
func ParseConfig(data []byte) (*Config, error) {
	var c Config
	if err := json.Unmarshal(data, &c.Raw); err != nil {
		return nil, fmt.Errorf("parse config.json: %w: %v", ErrFormat, err)
	}
	// null numbers (head_dim: null, sliding_window: null) mean "unset": drop them before
	// decoding into plain fields.
	clean := map[string]json.RawMessage{}
	for k, v := range c.Raw {
		if string(v) != "null" {
			clean[k] = v
		}
	}
	b, _ := json.Marshal(clean)
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, fmt.Errorf("parse config.json: %w: %v", ErrFormat, err)
	}
	if rp, ok := clean["rope_parameters"]; ok && c.RopeScaling == nil {
		var r RopeScaling
		if err := json.Unmarshal(rp, &r); err != nil {
			return nil, fmt.Errorf("parse config.json: %w: rope_parameters: %v", ErrFormat, err)
		}
		c.RopeScaling = &r
	}
	// transformers takes rope_theta from the rope dict first, then from the top level.
	if c.RopeScaling != nil && c.RopeScaling.RopeTheta > 0 {
		c.RopeTheta = c.RopeScaling.RopeTheta
	}
	if c.NumKeyValueHeads == 0 {
		c.NumKeyValueHeads = c.NumAttentionHeads
	}
	if c.HeadDim == 0 && c.NumAttentionHeads > 0 {
		c.HeadDim = c.HiddenSize / c.NumAttentionHeads
	}
	if c.RopeTheta == 0 {
		c.RopeTheta = 10000
	}
	if c.RMSNormEps == 0 {
		c.RMSNormEps = 1e-6
	}
	if c.HiddenAct == "" {
		c.HiddenAct = "silu"
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &c, nil
}

// LoadConfig reads and parses a config.json file.
func LoadConfig(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load config: %w", err)
	}
	c, err := ParseConfig(data)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", path, err)
	}
	return c, nil
}

// Validate checks that the dimensions are positive and consistent.
func (c *Config) Validate() error {
	pos := []struct {
		name string
		v    int
	}{
		{"vocab_size", c.VocabSize}, {"hidden_size", c.HiddenSize},
		{"intermediate_size", c.IntermediateSize}, {"num_hidden_layers", c.NumHiddenLayers},
		{"num_attention_heads", c.NumAttentionHeads}, {"num_key_value_heads", c.NumKeyValueHeads},
		{"head_dim", c.HeadDim},
	}
	for _, p := range pos {
		if p.v <= 0 {
			return fmt.Errorf("config: %w: %s must be positive, got %d", ErrFormat, p.name, p.v)
		}
	}
	if c.NumAttentionHeads%c.NumKeyValueHeads != 0 {
		return fmt.Errorf("config: %w: num_attention_heads %d is not a multiple of num_key_value_heads %d", ErrFormat, c.NumAttentionHeads, c.NumKeyValueHeads)
	}
	if c.HeadDim%2 != 0 {
		return fmt.Errorf("config: %w: head_dim %d must be even for rotary embeddings", ErrFormat, c.HeadDim)
	}
	if c.RMSNormEps < 0 || c.RopeTheta < 0 {
		return fmt.Errorf("config: %w: rms_norm_eps and rope_theta must not be negative", ErrFormat)
	}
	return nil
}

// Architecture returns the first entry of architectures, or "" when there is none.
func (c *Config) Architecture() string {
	if len(c.Architectures) == 0 {
		return ""
	}
	return c.Architectures[0]
}
