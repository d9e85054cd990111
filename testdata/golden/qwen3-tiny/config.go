package qwen3tiny

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/resin-llm/resin/core/kernels/ref"
	"github.com/resin-llm/resin/core/weights"
)

// Architectures lists the HF architectures this model loads: the dense variants whose math
// forward.go implements. `--model auto` picks the model by them.
var Architectures = []string{"Qwen3ForCausalLM", "LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM"}

// ModelTypes lists the config.json model_types this model implements; ParseConfig refuses
// any other, as transformers would build a different model for it.
var ModelTypes = []string{"llama", "qwen2", "qwen3", "mistral"}

// modelTypeOf gives the model_type of each architecture, for configs that name only the
// architecture.
var modelTypeOf = map[string]string{
	"LlamaForCausalLM":   "llama",
	"Qwen2ForCausalLM":   "qwen2",
	"Qwen3ForCausalLM":   "qwen3",
	"MistralForCausalLM": "mistral",
}

// Config is the model's configuration: the HF config.json fields and the options of the
// dense variants (Llama: biases on q/k/v/o when attention_bias; Qwen2: q/k/v biases;
// Qwen3: per-head q/k RMSNorm; Mistral: a sliding window).
type Config struct {
	weights.Config
	QKVBias bool // q, k and v projections carry biases
	OBias   bool // the output projection carries a bias
	QKNorm  bool // RMSNorm over each head of q and k before RoPE (Qwen3)
	Window  int  // sliding-window attention span in tokens; 0 = full attention
}

// ParseConfig parses config.json, checks it names a variant this model implements and
// derives the variant's options from model_type.
func ParseConfig(data []byte) (*Config, error) {
	wc, err := weights.ParseConfig(data)
	if err != nil {
		return nil, err
	}
	c := &Config{Config: *wc}
	if err := c.checkVariant(); err != nil {
		return nil, err
	}
	// Each variant as transformers' modeling and configuration files define it, defaults of
	// absent keys included.
	switch c.ModelType {
	case "qwen2":
		c.QKVBias = true
	case "qwen3":
		c.QKNorm = true
		c.QKVBias, c.OBias = c.AttentionBias, c.AttentionBias
		if _, ok := c.Raw["head_dim"]; !ok {
			c.HeadDim = 128 // Qwen3Config's default, not hidden_size / heads
		}
	case "mistral":
		c.Window = c.SlidingWindow
		if _, ok := c.Raw["sliding_window"]; !ok {
			c.Window = 4096 // MistralConfig's default; null means full attention
		}
	default:
		c.QKVBias, c.OBias = c.AttentionBias, c.AttentionBias
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if c.ModelType == "qwen2" || c.ModelType == "qwen3" {
		if v, ok := c.Raw["layer_types"]; ok && string(v) != "null" {
			var types []string
			if err := json.Unmarshal(v, &types); err != nil {
				return nil, fmt.Errorf("config: layer_types: %w", err)
			}
			for _, lt := range types {
				if lt != "full_attention" {
					return nil, fmt.Errorf("config: layer_types entry %q (per-layer attention kinds) is not implemented by this model", lt)
				}
			}
		}
	}
	if c.UseSlidingWindow {
		return nil, fmt.Errorf("config: use_sliding_window (per-layer windows) is not implemented by this model")
	}
	if v, ok := c.Raw["partial_rotary_factor"]; ok && string(v) != "null" {
		if f, err := strconv.ParseFloat(string(v), 64); err != nil || f != 1 {
			return nil, fmt.Errorf("config: partial_rotary_factor %s (rotating part of each head) is not implemented by this model", v)
		}
	}
	if c.MLPBias {
		return nil, fmt.Errorf("config: mlp_bias (biases on gate/up/down) is not implemented by this model")
	}
	if c.HiddenAct != "silu" {
		return nil, fmt.Errorf("config: hidden_act %q is not implemented (SwiGLU uses silu)", c.HiddenAct)
	}
	if _, err := c.RopeTable(1); err != nil { // refuse bad or unknown rope_scaling now, not at load
		return nil, err
	}
	return c, nil
}

// checkVariant refuses a config whose model_type or architectures name a model this one
// does not implement (transformers would build that other model, with its own math, from
// the same tensor names) and fills a missing model_type from the architecture.
func (c *Config) checkVariant() error {
	if c.ModelType != "" && !slices.Contains(ModelTypes, c.ModelType) {
		return fmt.Errorf("config: model_type %q is not implemented by this model (it implements %s)", c.ModelType, strings.Join(ModelTypes, ", "))
	}
	for _, a := range c.Architectures {
		if _, ok := modelTypeOf[a]; !ok {
			return fmt.Errorf("config: architecture %q is not implemented by this model (it implements %s)", a, strings.Join(Architectures, ", "))
		}
	}
	if c.ModelType == "" {
		if len(c.Architectures) == 0 {
			return fmt.Errorf("config: neither model_type nor architectures says which model this is (this model implements %s)", strings.Join(ModelTypes, ", "))
		}
		c.ModelType = modelTypeOf[c.Architectures[0]]
	}
	return nil
}

// LoadConfig reads dir/config.json.
func LoadConfig(dir string) (*Config, error) {
	data, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return nil, fmt.Errorf("load config: %w", err)
	}
	c, err := ParseConfig(data)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", filepath.Join(dir, "config.json"), err)
	}
	return c, nil
}

// RopeTable builds the rotary table for positions [0, maxPos) with the config's scaling
// (default, linear or llama3).
func (c *Config) RopeTable(maxPos int) (*ref.RopeTable, error) {
	d := c.HeadDim
	inv := make([]float64, d/2)
	for i := range inv {
		inv[i] = math.Pow(c.RopeTheta, -float64(2*i)/float64(d))
	}
	rs := c.RopeScaling
	switch rs.Kind() {
	case "default":
	case "linear":
		if !(rs.Factor > 0) {
			return nil, fmt.Errorf("config: rope_scaling linear needs a positive factor, got %g", rs.Factor)
		}
		for i := range inv {
			inv[i] /= rs.Factor
		}
	case "llama3":
		// transformers requires all four keys; a missing one must not read as 0.
		if !(rs.Factor > 0) || !(rs.LowFreqFactor > 0) || !(rs.HighFreqFactor > rs.LowFreqFactor) || rs.OriginalMaxPositionEmbeddings <= 0 {
			return nil, fmt.Errorf("config: rope_scaling llama3 needs factor > 0, 0 < low_freq_factor < high_freq_factor and original_max_position_embeddings > 0, got %g, %g, %g, %d",
				rs.Factor, rs.LowFreqFactor, rs.HighFreqFactor, rs.OriginalMaxPositionEmbeddings)
		}
		old := float64(rs.OriginalMaxPositionEmbeddings)
		lowWave, highWave := old/rs.LowFreqFactor, old/rs.HighFreqFactor
		for i, f := range inv {
			wave := 2 * math.Pi / f
			switch {
			case wave < highWave:
			case wave > lowWave:
				inv[i] = f / rs.Factor
			default:
				s := (old/wave - rs.LowFreqFactor) / (rs.HighFreqFactor - rs.LowFreqFactor)
				inv[i] = (1-s)*f/rs.Factor + s*f
			}
		}
	default:
		return nil, fmt.Errorf("config: rope_scaling type %q is not implemented", rs.Kind())
	}
	return ref.NewRopeTableFreqs(inv, maxPos, 1)
}
