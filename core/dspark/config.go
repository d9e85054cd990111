package dspark

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/resin-llm/resin/core/weights"
)

// Architecture is the architectures entry DeepSpec's Qwen3 drafters carry.
const Architecture = "Qwen3DSparkModel"

// Markov head types (markov_head_type); "" when markov_rank is 0.
const (
	MarkovVanilla = "vanilla"
	MarkovGated   = "gated"
	MarkovRNN     = "rnn"
)

// Config is a DeepSpec drafter's config.json: the target's Qwen3 config (copied by
// deepspec/modeling/dspark/qwen3/config.py build_draft_config) with the draft's depth and
// the DSpark keys.
type Config struct {
	Base *weights.Config // vocab, hidden, heads, head_dim, draft layers, rope, eps

	TargetLayerIDs   []int // taps into the target; −1 the embeddings, l decoder layer l's output
	NumTargetLayers  int   // num_target_layers; 0 when the config does not say
	BlockSize        int   // B: slots per block, drafts per block
	MaskTokenID      int32 // the id of slots 1..B−1
	MarkovRank       int   // 0: no Markov head
	MarkovHead       string
	Confidence       bool // enable_confidence_head
	ConfidenceMarkov bool // confidence_head_with_markov: the head also reads the Markov embedding
}

// ParseConfig parses a drafter's config.json and refuses what this package does not
// implement, naming the key.
func ParseConfig(data []byte) (*Config, error) {
	base, err := weights.ParseConfig(data)
	if err != nil {
		return nil, fmt.Errorf("dspark config: %w", err)
	}
	c := &Config{Base: base}
	if a := base.Architecture(); a != Architecture {
		return nil, fmt.Errorf("dspark config: architectures is %q, want %q", a, Architecture)
	}
	raw := base.Raw
	need := func(key string, dst any) error {
		v, ok := raw[key]
		if !ok || string(v) == "null" {
			return fmt.Errorf("dspark config: %s is missing", key)
		}
		if err := json.Unmarshal(v, dst); err != nil {
			return fmt.Errorf("dspark config: %s: %v", key, err)
		}
		return nil
	}
	var mask int64
	for _, f := range []struct {
		key string
		dst any
	}{
		{"target_layer_ids", &c.TargetLayerIDs}, {"block_size", &c.BlockSize},
		{"mask_token_id", &mask}, {"markov_rank", &c.MarkovRank},
		{"enable_confidence_head", &c.Confidence},
	} {
		if err := need(f.key, f.dst); err != nil {
			return nil, err
		}
	}
	if v, ok := raw["num_target_layers"]; ok && string(v) != "null" {
		if err := json.Unmarshal(v, &c.NumTargetLayers); err != nil {
			return nil, fmt.Errorf("dspark config: num_target_layers: %v", err)
		}
	}
	if c.MarkovRank < 0 {
		return nil, fmt.Errorf("dspark config: markov_rank must be >= 0, got %d", c.MarkovRank)
	}
	if c.MarkovRank > 0 {
		if err := need("markov_head_type", &c.MarkovHead); err != nil {
			return nil, fmt.Errorf("%w (required when markov_rank > 0)", err)
		}
		switch c.MarkovHead {
		case MarkovVanilla, MarkovGated, MarkovRNN:
		default:
			return nil, fmt.Errorf("dspark config: markov_head_type %q is not one of vanilla, gated, rnn", c.MarkovHead)
		}
	}
	if c.Confidence {
		if err := need("confidence_head_with_markov", &c.ConfidenceMarkov); err != nil {
			return nil, fmt.Errorf("%w (required when enable_confidence_head is true)", err)
		}
		if c.ConfidenceMarkov && c.MarkovRank == 0 {
			return nil, fmt.Errorf("dspark config: confidence_head_with_markov needs a Markov head (markov_rank is 0)")
		}
	}
	if c.BlockSize < 1 {
		return nil, fmt.Errorf("dspark config: block_size must be positive, got %d", c.BlockSize)
	}
	if mask < 0 || mask >= int64(base.VocabSize) {
		return nil, fmt.Errorf("dspark config: mask_token_id %d outside the vocabulary of %d", mask, base.VocabSize)
	}
	c.MaskTokenID = int32(mask)
	if len(c.TargetLayerIDs) == 0 {
		return nil, fmt.Errorf("dspark config: target_layer_ids is empty")
	}
	for i, l := range c.TargetLayerIDs {
		if l < -1 || (c.NumTargetLayers > 0 && l >= c.NumTargetLayers-1) {
			return nil, fmt.Errorf("dspark config: target_layer_ids[%d] = %d outside {-1} ∪ [0, %d) (the last target layer cannot be tapped)", i, l, c.NumTargetLayers-1)
		}
		if i > 0 && l <= c.TargetLayerIDs[i-1] {
			return nil, fmt.Errorf("dspark config: target_layer_ids %v must be strictly increasing", c.TargetLayerIDs)
		}
	}
	if k := base.RopeScaling.Kind(); k != "default" {
		return nil, fmt.Errorf("dspark config: rope type %q is not implemented (only the default rotary embedding)", k)
	}
	if v, ok := raw["layer_types"]; ok && string(v) != "null" {
		var types []string
		if err := json.Unmarshal(v, &types); err != nil {
			return nil, fmt.Errorf("dspark config: layer_types: %v", err)
		}
		for i, t := range types {
			if t != "full_attention" {
				return nil, fmt.Errorf("dspark config: layer_types[%d] is %q; only full_attention draft layers are implemented", i, t)
			}
		}
	}
	if v, ok := raw["draft_vocab_size"]; ok && string(v) != "null" {
		var dv int
		if err := json.Unmarshal(v, &dv); err != nil || (dv != 0 && dv != base.VocabSize) {
			return nil, fmt.Errorf("dspark config: draft_vocab_size %s differs from vocab_size %d: a pruned draft vocabulary is not implemented", v, base.VocabSize)
		}
	}
	if base.TieWordEmbeddings {
		return nil, fmt.Errorf("dspark config: tie_word_embeddings is true; DeepSpec drafters keep their own lm_head (build_draft_config sets it false)")
	}
	if base.MLPBias {
		return nil, fmt.Errorf("dspark config: mlp_bias is not implemented (Qwen3 has none)")
	}
	if base.HiddenAct != "silu" {
		return nil, fmt.Errorf("dspark config: hidden_act %q is not implemented (only silu)", base.HiddenAct)
	}
	return c, nil
}

// LoadConfig reads dir/config.json.
func LoadConfig(dir string) (*Config, error) {
	path := filepath.Join(dir, "config.json")
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("dspark: %w", err)
	}
	c, err := ParseConfig(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// FeatureDim is the width of one row of target features: len(TargetLayerIDs) × hidden.
func (c *Config) FeatureDim() int { return len(c.TargetLayerIDs) * c.Base.HiddenSize }

// CheckTarget refuses a target the drafter was not built for: another vocabulary or hidden
// size, a tap on or past the target's last layer (transformers' last hidden state is the
// normed one, which DeepSpec refuses: assert_no_final_target_layer), or a num_target_layers
// that differs from the target's depth.
func (c *Config) CheckTarget(vocab, hidden, layers int) error {
	if vocab != c.Base.VocabSize {
		return fmt.Errorf("dspark: the drafter's vocab_size %d differs from the target's %d", c.Base.VocabSize, vocab)
	}
	if hidden != c.Base.HiddenSize {
		return fmt.Errorf("dspark: the drafter's hidden_size %d differs from the target's %d", c.Base.HiddenSize, hidden)
	}
	if c.NumTargetLayers > 0 && c.NumTargetLayers != layers {
		return fmt.Errorf("dspark: the drafter was built for %d target layers, the target has %d", c.NumTargetLayers, layers)
	}
	for _, l := range c.TargetLayerIDs {
		if l >= layers-1 {
			return fmt.Errorf("dspark: target layer id %d is not tappable in a target of %d layers (the last is %d, and it cannot be tapped)", l, layers, layers-1)
		}
	}
	return nil
}
