package deepseekv4flash

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// DSparkConfig is what a DeepSeek-V4-Flash-DSpark config.json (V4-Flash-0731) says about
// its block drafter, whose stages the checkpoint holds in mtp.0, mtp.1, ... (vLLM's reader:
// vllm/models/deepseek_v4/nvidia/dspark.py): the dspark_* keys and the stage count that
// compress_ratios implies (its entries past the main layers).
//
// Only the config is read: the stages' tensors are not loaded or checked, and the V4
// DSpark forward (main_proj/main_norm over the tapped hiddens, the stages' sliding-window
// draft cache, the last stage's norm, hc head, Markov and confidence heads) is not
// implemented, so ParseConfig still refuses such a checkpoint, after checking these keys.
type DSparkConfig struct {
	BlockSize      int   // dspark_block_size: slots per block
	NoiseTokenID   int   // dspark_noise_token_id: the id of the block's non-anchor slots
	TargetLayerIDs []int // dspark_target_layer_ids: the main layers whose hiddens the drafter reads
	MarkovRank     int   // dspark_markov_rank: the Markov head's rank
	Stages         int   // drafter stages (mtp.0..Stages-1); 0 when compress_ratios does not say
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
	if len(ratios) > 0 {
		if d.Stages = len(ratios) - layers; d.Stages < 1 {
			return nil, fmt.Errorf("compress_ratios has %d entries for num_hidden_layers %d: none left for the DSpark drafter's stages", len(ratios), layers)
		}
	}
	return d, nil
}

// String describes the drafter in a line.
func (d *DSparkConfig) String() string {
	stages := "stages unknown"
	if d.Stages > 0 {
		stages = fmt.Sprintf("%d stages in mtp.0-%d", d.Stages, d.Stages-1)
	}
	return fmt.Sprintf("block %d, noise token %d, taps %v, Markov rank %d, %s", d.BlockSize, d.NoiseTokenID, d.TargetLayerIDs, d.MarkovRank, stages)
}
