package qwen3tiny

import (
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/weights"
)

// strictBase is a tiny dense config; each case below edits it.
const strictBase = `{"architectures": ["LlamaForCausalLM"], "model_type": "llama",
	"vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
	"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "hidden_act": "silu",
	"rms_norm_eps": 1e-6, "rope_theta": 10000, "max_position_embeddings": 128,
	"tie_word_embeddings": false, "attention_bias": false}`

// strictConfig returns strictBase with edits applied; a nil value deletes the key
// (json.RawMessage("null") writes null).
func strictConfig(t *testing.T, edits map[string]any) []byte {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(strictBase), &m); err != nil {
		t.Fatal(err)
	}
	for k, v := range edits {
		if v == nil {
			delete(m, k)
		} else {
			m[k] = v
		}
	}
	out, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestConfigRefusesOtherModels checks that configs of models this one does not implement
// are refused by name, even where their tensor names are the dense ones (Granite's
// multipliers, Olmo2's norm placement, Gemma's scaled embeddings, Qwen2-MoE's experts
// would all run as garbage).
func TestConfigRefusesOtherModels(t *testing.T) {
	for _, c := range []struct {
		name  string
		edits map[string]any
		want  string
	}{
		{"granite", map[string]any{"model_type": "granite", "architectures": []string{"GraniteForCausalLM"},
			"embedding_multiplier": 12, "residual_multiplier": 0.22, "logits_scaling": 8}, `model_type "granite" is not implemented`},
		{"olmo2", map[string]any{"model_type": "olmo2", "architectures": []string{"Olmo2ForCausalLM"}}, `model_type "olmo2"`},
		{"gemma", map[string]any{"model_type": "gemma", "architectures": []string{"GemmaForCausalLM"}}, `model_type "gemma"`},
		{"qwen2-moe", map[string]any{"model_type": "qwen2_moe", "architectures": []string{"Qwen2MoeForCausalLM"},
			"num_experts": 4, "num_experts_per_tok": 2}, `model_type "qwen2_moe"`},
		// Relabelled by architecture alone, or by model_type alone.
		{"granite architecture", map[string]any{"architectures": []string{"GraniteForCausalLM"}}, `architecture "GraniteForCausalLM" is not implemented`},
		{"gemma without model_type", map[string]any{"model_type": nil, "architectures": []string{"GemmaForCausalLM"}}, `"GemmaForCausalLM"`},
		{"olmo2 model_type", map[string]any{"model_type": "olmo2"}, `model_type "olmo2"`},
		{"neither", map[string]any{"model_type": nil, "architectures": nil}, "neither model_type nor architectures"},
	} {
		_, err := ParseConfig(strictConfig(t, c.edits))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one containing %q", c.name, err, c.want)
		}
	}
	if _, err := ParseConfig(strictConfig(t, map[string]any{"model_type": "granite"})); err == nil ||
		!strings.Contains(err.Error(), "it implements "+strings.Join(ModelTypes, ", ")) {
		t.Errorf("the refusal does not list what the model implements: %v", err)
	}
}

// TestConfigInfersModelType checks that a config naming only its architecture gets that
// architecture's variant: a Qwen2 config without model_type keeps its q/k/v biases.
func TestConfigInfersModelType(t *testing.T) {
	for _, c := range []struct {
		arch, modelType string
		qkvBias, qkNorm bool
	}{
		{"LlamaForCausalLM", "llama", false, false},
		{"Qwen2ForCausalLM", "qwen2", true, false},
		{"Qwen3ForCausalLM", "qwen3", false, true},
		{"MistralForCausalLM", "mistral", false, false},
	} {
		got, err := ParseConfig(strictConfig(t, map[string]any{"model_type": nil, "architectures": []string{c.arch}}))
		if err != nil {
			t.Fatalf("%s: %v", c.arch, err)
		}
		if got.ModelType != c.modelType || got.QKVBias != c.qkvBias || got.QKNorm != c.qkNorm {
			t.Errorf("%s: model_type %q, qkv bias %v, qk norm %v; want %q, %v, %v",
				c.arch, got.ModelType, got.QKVBias, got.QKNorm, c.modelType, c.qkvBias, c.qkNorm)
		}
	}
	for _, a := range Architectures {
		if _, err := ParseConfig(strictConfig(t, map[string]any{"model_type": nil, "architectures": []string{a}})); err != nil {
			t.Errorf("architecture %s is in Architectures but refused: %v", a, err)
		}
	}
}

// writeCheckpoint saves seeded random weights of c, edited by edit, to a new directory.
func writeCheckpoint(t *testing.T, c *Config, edit func([]weights.Tensor) []weights.Tensor) string {
	t.Helper()
	ts, err := RandomWeights(c, 3).Tensors(c, weights.F32)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := weights.WriteFile(filepath.Join(dir, "model.safetensors"), edit(ts), nil); err != nil {
		t.Fatal(err)
	}
	return dir
}

func loadFrom(t *testing.T, c *Config, dir string) error {
	t.Helper()
	ck, err := weights.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	_, err = LoadWeights(c, ck)
	return err
}

// TestLoadWeightsRefusesUnexpectedTensors checks that a checkpoint must hold exactly the
// tensors the config uses: extra ones (a bias with attention_bias false) and missing ones
// are refused and listed as transformers' load report lists them, while what transformers
// ignores (rotary_emb.inv_freq, lm_head.weight equal to tied embeddings) loads.
func TestLoadWeightsRefusesUnexpectedTensors(t *testing.T) {
	c, err := ParseConfig(strictConfig(t, nil))
	if err != nil {
		t.Fatal(err)
	}
	extra := func(names ...string) func([]weights.Tensor) []weights.Tensor {
		return func(ts []weights.Tensor) []weights.Tensor {
			for _, n := range names {
				tt, err := weights.NewTensor(n, weights.F32, []int{8}, make([]float32, 8))
				if err != nil {
					t.Fatal(err)
				}
				ts = append(ts, tt)
			}
			return ts
		}
	}
	bias := "model.layers.1.self_attn.q_proj.bias"
	dir := writeCheckpoint(t, c, extra(bias, "model.layers.0.self_attn.k_proj.bias"))
	err = loadFrom(t, c, dir)
	if err == nil || !strings.Contains(err.Error(), "LlamaForCausalLM load report from "+dir) ||
		!strings.Contains(err.Error(), "UNEXPECTED (in the checkpoint, not used by the model) [model.layers.0.self_attn.k_proj.bias, "+bias+"]") {
		t.Errorf("bias tensors with attention_bias false: error %v", err)
	}

	dropped := "model.layers.0.mlp.up_proj.weight"
	err = loadFrom(t, c, writeCheckpoint(t, c, func(ts []weights.Tensor) []weights.Tensor {
		return slices.DeleteFunc(ts, func(x weights.Tensor) bool { return x.Name == dropped })
	}))
	if err == nil || !strings.Contains(err.Error(), "MISSING") || !strings.Contains(err.Error(), "["+dropped+"]") {
		t.Errorf("a missing tensor: error %v", err)
	}

	if err := loadFrom(t, c, writeCheckpoint(t, c, extra("model.layers.0.self_attn.rotary_emb.inv_freq"))); err != nil {
		t.Errorf("rotary_emb.inv_freq is a buffer transformers ignores: %v", err)
	}
	tied, err := ParseConfig(strictConfig(t, map[string]any{"tie_word_embeddings": true}))
	if err != nil {
		t.Fatal(err)
	}
	sameHead := func(ts []weights.Tensor) []weights.Tensor {
		for i := range ts {
			if ts[i].Name == "lm_head.weight" {
				ts[i].Data = ts[0].Data // model.embed_tokens.weight comes first
			}
		}
		return ts
	}
	if err := loadFrom(t, tied, writeCheckpoint(t, c, sameHead)); err != nil {
		t.Errorf("lm_head.weight equal to the tied embeddings: %v", err)
	}
	// transformers unties a different lm_head.weight and uses it: refused, with the fix.
	err = loadFrom(t, tied, writeCheckpoint(t, c, func(ts []weights.Tensor) []weights.Tensor { return ts }))
	if err == nil || !strings.Contains(err.Error(), "set tie_word_embeddings to false") {
		t.Errorf("lm_head.weight different from the tied embeddings: error %v", err)
	}
}

// TestConfigTransformersDefaults checks the variant defaults transformers fills for absent
// keys, and that per-layer attention kinds are refused rather than run as full attention.
func TestConfigTransformersDefaults(t *testing.T) {
	for _, c := range []struct {
		name            string
		edits           map[string]any
		window, headDim int
	}{
		{"mistral without sliding_window", map[string]any{"model_type": "mistral"}, 4096, 8},
		{"mistral with sliding_window null", map[string]any{"model_type": "mistral", "sliding_window": json.RawMessage("null")}, 0, 8},
		{"qwen3 without head_dim", map[string]any{"model_type": "qwen3", "head_dim": nil}, 0, 128},
		{"qwen2 with full layer_types", map[string]any{"model_type": "qwen2", "layer_types": []string{"full_attention", "full_attention"}}, 0, 8},
	} {
		got, err := ParseConfig(strictConfig(t, c.edits))
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if got.Window != c.window || got.HeadDim != c.headDim {
			t.Errorf("%s: window %d, head_dim %d; want %d, %d", c.name, got.Window, got.HeadDim, c.window, c.headDim)
		}
	}
	_, err := ParseConfig(strictConfig(t, map[string]any{"model_type": "qwen2", "layer_types": []string{"full_attention", "sliding_attention"}}))
	if err == nil || !strings.Contains(err.Error(), `"sliding_attention"`) {
		t.Errorf("qwen2 with a sliding layer: error %v", err)
	}
}
