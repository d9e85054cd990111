package deepseekv4flash

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/resin-llm/resin/core/weights"
)

// DSparkConfig is what a DeepSeek-V4-Flash-DSpark config.json (V4-Flash-0731) says about
// its block drafter, whose stages the checkpoint holds in mtp.0, mtp.1, ... (vLLM's reader:
// vllm/models/deepseek_v4/nvidia/dspark.py): the dspark_* keys and the stage count that
// compress_ratios implies (its entries past the main layers).
//
// ParseDSparkConfig reads it (ParseConfig refuses such a config, naming it),
// LoadDSparkStages the stages' tensors, and DSpark (dspark_forward.go) runs them; Load
// with Options.DSpark drafts with them.
type DSparkConfig struct {
	BlockSize      int   // dspark_block_size: slots per block
	NoiseTokenID   int   // dspark_noise_token_id: the id of the block's non-anchor slots
	TargetLayerIDs []int // dspark_target_layer_ids: the main layers whose hiddens the drafter reads
	MarkovRank     int   // dspark_markov_rank: the Markov head's rank
	Stages         int   // drafter stages (mtp.0..Stages-1): compress_ratios' entries past the layers, else 3 (vLLM's default)
}

// dsparkKeys are the config keys DSpark adds, in the order they are reported.
var dsparkKeys = []string{"dspark_block_size", "dspark_markov_rank", "dspark_noise_token_id", "dspark_target_layer_ids"}

// parseDSpark reads the dspark_* keys of raw (nil, nil when none is set) and checks them
// against the model: a missing or malformed key, a block size below 1, a noise token
// outside the vocabulary, a tap outside the main layers or twice, a negative rank, or
// compress_ratios leaving no entry for a stage are errors naming the key.
func parseDSpark(raw map[string]json.RawMessage, ratios []int, layers, vocab int) (*DSparkConfig, error) {
	var set, unknown []string
	for k, v := range raw {
		if !strings.HasPrefix(k, "dspark_") || string(v) == "null" {
			continue
		}
		set = append(set, k)
		if !slices.Contains(dsparkKeys, k) {
			unknown = append(unknown, k)
		}
	}
	if len(set) == 0 {
		return nil, nil
	}
	if len(unknown) > 0 {
		slices.Sort(unknown)
		return nil, fmt.Errorf("%s: not a DSpark key this model knows (%s)", strings.Join(unknown, ", "), strings.Join(dsparkKeys, ", "))
	}
	d := &DSparkConfig{}
	for _, f := range []struct {
		key string
		dst any
	}{
		{"dspark_block_size", &d.BlockSize}, {"dspark_noise_token_id", &d.NoiseTokenID},
		{"dspark_target_layer_ids", &d.TargetLayerIDs}, {"dspark_markov_rank", &d.MarkovRank},
	} {
		v, ok := raw[f.key]
		if !ok || string(v) == "null" {
			return nil, fmt.Errorf("%s is missing (a DSpark config sets %s)", f.key, strings.Join(dsparkKeys, ", "))
		}
		if err := json.Unmarshal(v, f.dst); err != nil {
			return nil, fmt.Errorf("%s: %v", f.key, err)
		}
	}
	switch {
	case d.BlockSize < 1:
		return nil, fmt.Errorf("dspark_block_size %d: want 1 or more", d.BlockSize)
	case vocab > 0 && (d.NoiseTokenID < 0 || d.NoiseTokenID >= vocab):
		return nil, fmt.Errorf("dspark_noise_token_id %d is outside the vocabulary [0, %d)", d.NoiseTokenID, vocab)
	case len(d.TargetLayerIDs) == 0:
		return nil, fmt.Errorf("dspark_target_layer_ids is empty")
	case d.MarkovRank < 0:
		return nil, fmt.Errorf("dspark_markov_rank %d is negative", d.MarkovRank)
	}
	for i, l := range d.TargetLayerIDs {
		if l < 0 || l >= layers {
			return nil, fmt.Errorf("dspark_target_layer_ids: %d is not one of the %d main layers", l, layers)
		}
		if slices.Contains(d.TargetLayerIDs[:i], l) {
			return nil, fmt.Errorf("dspark_target_layer_ids: layer %d is tapped twice", l)
		}
	}
	d.Stages = 3
	if len(ratios) > 0 {
		if d.Stages = len(ratios) - layers; d.Stages < 1 {
			return nil, fmt.Errorf("compress_ratios has %d entries for num_hidden_layers %d: none left for the DSpark drafter's stages", len(ratios), layers)
		}
	}
	return d, nil
}

// String describes the drafter in a line.
func (d *DSparkConfig) String() string {
	return fmt.Sprintf("block %d, noise token %d, taps %v, Markov rank %d, %d stages in mtp.0-%d", d.BlockSize, d.NoiseTokenID, d.TargetLayerIDs, d.MarkovRank, d.Stages, d.Stages-1)
}

// DSparkStages are a V4-DSpark checkpoint's drafter stages as read from mtp.0..S-1 (vLLM's
// names: stage i's decoder block under mtp.i., main_proj/main_norm on mtp.0, the heads on
// the last stage); DSpark runs them.
type DSparkStages struct {
	Blocks             []Layer   // per stage, a sliding-attention, learned-routing MoE decoder block
	MainProj, MainNorm []float32 // [hidden, hidden·taps], [hidden]
	// The last stage's heads: norm, the hc head, the Markov head (markov_w1 [vocab, rank],
	// markov_w2 [vocab, rank]) and the confidence head ([1, hidden+rank]; nil when absent).
	Norm, HCFn, HCBase, HCScale []float32
	MarkovW1, MarkovW2          []float32
	Confidence                  []float32
}

// LoadDSparkStages reads dir's config.json as a DeepSeek-V4-Flash-DSpark config (the base
// config without its dspark_* keys and drafter entries of compress_ratios, and the
// DSparkConfig) and the drafter stages' tensors from its checkpoint, each checked against
// its shape (and dequantized as the main model's are). A missing or mis-shaped stage
// tensor, or an mtp.* tensor no stage has, is an error naming it.
func LoadDSparkStages(dir string) (*Config, *DSparkConfig, *DSparkStages, error) {
	path := filepath.Join(dir, "config.json")
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("dspark: %w", err)
	}
	c, d, err := ParseDSparkConfig(data)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	ck, err := weights.Open(dir)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("dspark: %w", err)
	}
	defer ck.Close()
	st := &DSparkStages{Blocks: make([]Layer, d.Stages)}
	used := map[string]bool{}
	var missing []string
	for _, p := range dsparkParams(c, d, st) {
		if p.dst == &st.Confidence && !ck.Has(p.names[UpstreamNames]) {
			continue // no confidence head: full blocks
		}
		name, err := loadParam(ck, c.Quant, p, used)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("dspark: %w", err)
		}
		if name != "" {
			missing = append(missing, name)
		}
	}
	var unexpected []string
	for _, n := range ck.Names() {
		if strings.HasPrefix(n, "mtp.") && !used[n] {
			unexpected = append(unexpected, n)
		}
	}
	if len(missing) > 0 || len(unexpected) > 0 {
		return nil, nil, nil, fmt.Errorf("dspark: %s: drafter stages: MISSING %v; UNEXPECTED %v", dir, missing, unexpected)
	}
	return c, d, st, nil
}

// ParseDSparkConfig parses a DeepSeek-V4-Flash-DSpark config.json: the DSpark keys, and
// the base model's config as ParseConfig reads it once they and compress_ratios' drafter
// entries are set aside.
func ParseDSparkConfig(data []byte) (*Config, *DSparkConfig, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, nil, fmt.Errorf("config: %w: %v", weights.ErrFormat, err)
	}
	var dims struct {
		Layers int   `json:"num_hidden_layers"`
		Vocab  int   `json:"vocab_size"`
		Ratios []int `json:"compress_ratios"`
	}
	dims.Layers, dims.Vocab = defaultConfig().NumHiddenLayers, defaultConfig().VocabSize
	if err := json.Unmarshal(data, &dims); err != nil {
		return nil, nil, fmt.Errorf("config: %w: %v", weights.ErrFormat, err)
	}
	d, err := parseDSpark(raw, dims.Ratios, dims.Layers, dims.Vocab)
	if err != nil {
		return nil, nil, fmt.Errorf("config: %w", err)
	}
	if d == nil {
		return nil, nil, fmt.Errorf("config: no dspark_* keys: not a DSpark checkpoint (%s)", strings.Join(dsparkKeys, ", "))
	}
	for _, k := range dsparkKeys {
		delete(raw, k)
	}
	if len(dims.Ratios) > 0 { // the main layers' and the MTP layer's entries
		b, _ := json.Marshal(dims.Ratios[:min(len(dims.Ratios), dims.Layers+1)])
		raw["compress_ratios"] = b
	}
	base, _ := json.Marshal(raw)
	c, err := ParseConfig(base)
	if err != nil {
		return nil, nil, err
	}
	// The mtp.* namespace holds the drafter's stages, not an MTP head.
	c.NumNextNPredictLayers, c.dspark = 0, d
	return c, d, nil
}

// dsparkParams lists the stages' tensors in vLLM's (upstream) names.
func dsparkParams(c *Config, d *DSparkConfig, st *DSparkStages) []param {
	h, hc := c.HiddenSize, c.HCMult
	one := func(name string) [3]string { return [3]string{name, name, name} }
	ps := []param{
		{names: one("mtp.0.main_proj.weight"), shape: []int{h, h * len(d.TargetLayerIDs)}, dst: &st.MainProj},
		{names: one("mtp.0.main_norm.weight"), shape: []int{h}, dst: &st.MainNorm, kind: initNorm},
	}
	for i := range st.Blocks {
		pre := fmt.Sprintf("mtp.%d.", i)
		for _, p := range layerParams(c, &st.Blocks[i], SlidingAttention, MoE, pre, pre, pre) {
			p.names[ModuleNames] = p.names[UpstreamNames]
			p.names[HybridNames] = p.names[UpstreamNames]
			ps = append(ps, p)
		}
	}
	last := fmt.Sprintf("mtp.%d.", d.Stages-1)
	ps = append(ps,
		param{names: one(last + "norm.weight"), shape: []int{h}, dst: &st.Norm, kind: initNorm},
		param{names: one(last + "hc_head_fn"), shape: []int{hc, hc * h}, dst: &st.HCFn},
		param{names: one(last + "hc_head_base"), shape: []int{hc}, dst: &st.HCBase, kind: initBias},
		param{names: one(last + "hc_head_scale"), shape: []int{1}, dst: &st.HCScale, kind: initScale},
		param{names: one(last + "confidence_head.proj.weight"), shape: []int{1, h + d.MarkovRank}, dst: &st.Confidence},
	)
	if d.MarkovRank > 0 {
		ps = append(ps,
			param{names: one(last + "markov_head.markov_w1.weight"), shape: []int{c.VocabSize, d.MarkovRank}, dst: &st.MarkovW1},
			param{names: one(last + "markov_head.markov_w2.weight"), shape: []int{c.VocabSize, d.MarkovRank}, dst: &st.MarkovW2},
		)
	}
	return ps
}

// isDSparkConfig reports whether config.json data sets any dspark_* key.
func isDSparkConfig(data []byte) bool {
	var raw map[string]json.RawMessage
	if json.Unmarshal(data, &raw) != nil {
		return false
	}
	for k, v := range raw {
		if strings.HasPrefix(k, "dspark_") && string(v) != "null" {
			return true
		}
	}
	return false
}
