package glm5flash

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// configCommand makes testdata/config_cases.json, run from the repository root.
const configCommand = "scripts/glm5-goldens.sh --only-config"

// configCase is one entry of testdata/config_cases.json: a config.json input and what
// transformers 5.23.0's Glm5NextConfig made of its text model (or the error it raised).
type configCase struct {
	Input map[string]any `json:"input"`
	Want  map[string]any `json:"want"`
	Error string         `json:"error"`
}

// refusedByDesign lists inputs transformers accepts that this model refuses on purpose,
// with the field the error must name.
var refusedByDesign = map[string]string{
	"bad-layer-type":        "layer_types",                         // sliding_attention is in transformers' global list; GLM has no such layer
	"shared-after-linear":   "indexer_types",                       // transformers raises only at the first forward
	"unknown-indexer-type":  "indexer_types",                       // transformers runs any non-"shared" value as full
	"kda-layers-contradict": "linear_attn_config.full_attn_layers", // transformers does not read the lists
}

// differsByDesign lists inputs whose normalisation here differs from transformers 5.23.0's
// on purpose, with the fields as this model makes them: GLM-5.3-Flash's published config
// lists each kind's layers in linear_attn_config, which 5.23.0 does not read (its default
// layer_types stands when layer_types is absent).
var differsByDesign = map[string]map[string]any{
	"kda-layers-only": {"layer_types": []string{LinearAttention, IndexedAttention, LinearAttention, LinearAttention}},
}

// TestConfigCases checks ParseTextConfig against Glm5NextConfig for nested, flat and
// legacy inputs (scripts/glm5-goldens.sh writes the table).
func TestConfigCases(t *testing.T) {
	data, err := os.ReadFile("testdata/config_cases.json")
	if err != nil {
		t.Skipf("no config goldens: make them with `%s`", configCommand)
	}
	var cases map[string]configCase
	if err := json.Unmarshal(data, &cases); err != nil {
		t.Fatal(err)
	}
	if len(cases) < 20 {
		t.Fatalf("%d config cases: the table is truncated", len(cases))
	}
	for name, cc := range cases {
		t.Run(name, func(t *testing.T) {
			in, _ := json.Marshal(cc.Input)
			c, err := ParseTextConfig(in)
			if field, ok := refusedByDesign[name]; ok {
				if err == nil || !strings.Contains(err.Error(), field) {
					t.Fatalf("want an error naming %s, got %v", field, err)
				}
				return
			}
			if fields, ok := differsByDesign[name]; ok {
				if err != nil {
					t.Fatal(err)
				}
				got := textConfigFields(c)
				for k, want := range fields {
					if !sameJSON(got[k], want) {
						t.Errorf("%s = %v, want %v", k, jsonString(got[k]), jsonString(want))
					}
					if cc.Error == "" && sameJSON(cc.Want[k], want) {
						t.Errorf("%s: transformers agrees now (%v): drop the case from differsByDesign", k, jsonString(cc.Want[k]))
					}
				}
				if cc.Error != "" {
					t.Logf("transformers 5.23.0 refuses it: %s", lastLine(cc.Error))
				} else {
					t.Logf("transformers 5.23.0 makes layer_types %v", jsonString(cc.Want["layer_types"]))
				}
				return
			}
			if cc.Error != "" {
				if err == nil {
					t.Fatalf("transformers refuses this config (%s), ParseTextConfig accepted it", cc.Error)
				}
				t.Logf("refused: %v (transformers: %s)", err, lastLine(cc.Error))
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := textConfigFields(c)
			for k, want := range cc.Want {
				g, ok := got[k]
				if !ok {
					t.Errorf("%s: not a TextConfig field", k)
					continue
				}
				if !sameJSON(g, want) {
					t.Errorf("%s = %v, transformers has %v", k, jsonString(g), jsonString(want))
				}
			}
			if _, ok := cc.Input["vision_config"]; ok && len(c.Notes) == 0 {
				t.Errorf("vision_config ignored without a note")
			}
		})
	}
}

// textConfigFields renders c as transformers names its attributes.
func textConfigFields(c *TextConfig) map[string]any {
	b, _ := json.Marshal(c)
	var m map[string]any
	_ = json.Unmarshal(b, &m)
	tok := func(ids []int32) any {
		switch len(ids) {
		case 0:
			return nil
		case 1:
			return ids[0]
		}
		return ids
	}
	m["bos_token_id"], m["eos_token_id"], m["pad_token_id"] = tok(c.BOSTokenID), tok(c.EOSTokenID), tok(c.PadTokenID)
	return m
}

func sameJSON(a, b any) bool {
	var x, y any
	_ = json.Unmarshal([]byte(jsonString(a)), &x)
	_ = json.Unmarshal([]byte(jsonString(b)), &y)
	return reflect.DeepEqual(x, y)
}

func jsonString(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return strings.TrimSpace(s[i+1:])
	}
	return s
}

// TestConfigRefusals checks that what the model cannot run is refused with the field named.
func TestConfigRefusals(t *testing.T) {
	for _, tc := range []struct{ edit, field string }{
		{`"model_type": "deepseek_v4"`, "model_type"},
		{`"architectures": ["DeepseekV4ForCausalLM"]`, "architecture"},
		{`"hidden_act": "gelu"`, "hidden_act"},
		{`"attention_bias": true`, "attention_bias"},
		{`"index_kpool_always_select_tail": false`, "index_kpool_always_select_tail"},
		{`"layer_types": ["linear_attention", "sliding_attention"]`, "layer_types"},
		{`"layer_types": ["linear_attention"]`, "layer_types"},
		{`"mlp_layer_types": ["dense", "moe"]`, "mlp_layer_types"},
		{`"indexer_types": ["full"]`, "indexer_types"},
		{`"layer_types": ["indexed_attention", "indexed_attention"], "indexer_types": ["shared", "full"]`, "indexer_types"},
		{`"index_topk_pattern": "FX"`, "index_topk_pattern"},
		{`"num_key_value_heads": 2`, "num_key_value_heads"},
		{`"qk_rope_head_dim": 64`, "qk_rope_head_dim"},
		{`"index_topk": 20`, "index_kpool"},
		{`"q_lora_rank": null`, "q_lora_rank"},
		{`"mlp_layer_types": ["sparse", "sparse"], "n_group": 5`, "n_group"},
		{`"mlp_layer_types": ["sparse", "sparse"], "num_experts_per_tok": 300`, "num_experts_per_tok"},
		{`"quantization_config": {"quant_method": "fp8", "expert_dtype": "fp4"}`, "expert_dtype"},
		{`"mhc": false`, "mhc"},
		{`"mla_use_nope": false`, "mla_use_nope"},
		{`"index_kpool_compress": false`, "index_kpool_compress"},
		{`"scoring_func": "softmax"`, "scoring_func"},
	} {
		in := `{"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 4, "index_topk": 32, "index_kpool": 8, ` + tc.edit + `}`
		_, err := ParseTextConfig([]byte(in))
		if err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s: want an error naming %s, got %v", tc.edit, tc.field, err)
		}
	}
}

// TestConfigNested checks that text_config wins over top-level fields, that the
// top-level tie_word_embeddings decides tying and that vision tokens are refused.
func TestConfigNested(t *testing.T) {
	c, err := ParseTextConfig([]byte(`{"model_type": "glm5_next", "architectures": ["Glm5NextForConditionalGeneration"],
		"hidden_size": 8, "tie_word_embeddings": true,
		"text_config": {"num_hidden_layers": 4, "tie_word_embeddings": false},
		"vision_config": {"depth": 1}}`))
	if err != nil {
		t.Fatal(err)
	}
	if c.HiddenSize != 4096 || !c.TieWordEmbeddings || c.NumHiddenLayers != 4 {
		t.Fatalf("hidden %d tie %v layers %d", c.HiddenSize, c.TieWordEmbeddings, c.NumHiddenLayers)
	}
	if len(c.Notes) != 1 || !strings.Contains(c.Notes[0], "vision_config") {
		t.Fatalf("notes %q", c.Notes)
	}
	if err := c.RefuseVisionTokens([]int32{1, 154854}); err == nil || !strings.Contains(err.Error(), "vision") {
		t.Fatalf("image token: %v", err)
	}
	if err := c.RefuseVisionTokens([]int32{1, 2}); err != nil {
		t.Fatal(err)
	}
}

// TestPublishedConfig parses GLM-5.3-Flash's text config in the form its published copies
// share (testdata/hf-configs/glm-5.3-flash.json): layer_types spelled
// "deepseek_sparse_attention", as on transformers main, beside linear_attn_config's
// 0-based kda_layers / full_attn_layers, a KDA:DSA 3:1 interleave over 45 layers.
func TestPublishedConfig(t *testing.T) {
	c, err := LoadTextConfig("../../testdata/hf-configs/glm-5.3-flash.json")
	if err != nil {
		t.Fatal(err)
	}
	if c.NumHiddenLayers != 45 || c.IndexKPool != 4 || c.NRoutedExperts != 288 || c.LinearNumHeads != 64 || *c.LinearLowerBound != -5 {
		t.Fatalf("layers %d kpool %d experts %d KDA heads %d lower bound %v", c.NumHiddenLayers, c.IndexKPool, c.NRoutedExperts, c.LinearNumHeads, *c.LinearLowerBound)
	}
	indexed := 0
	for i, lt := range c.LayerTypes {
		want := LinearAttention
		if i%4 == 3 {
			want = IndexedAttention
			indexed++
		}
		if lt != want {
			t.Fatalf("layer_types[%d] = %q, want %q", i, lt, want)
		}
	}
	if indexed != 11 {
		t.Fatalf("%d indexed layers, want 11", indexed)
	}
}

// TestLinearAttnLayers checks that linear_attn_config's kda_layers / full_attn_layers
// fill layer_types when it is absent, agree with it when both are given, and are refused,
// naming both fields, when they contradict it or do not split the layers 0..n-1.
func TestLinearAttnLayers(t *testing.T) {
	base := `{"num_hidden_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 4, "index_topk": 32, "index_kpool": 8, `
	parse := func(edit string) (*TextConfig, error) { return ParseTextConfig([]byte(base + edit + `}`)) }
	for _, edit := range []string{
		`"linear_attn_config": {"kda_layers": [0, 2, 3], "full_attn_layers": [1]}`,
		`"linear_attn_config": {"kda_layers": [0, 2, 3]}`,
		`"linear_attn_config": {"full_attn_layers": [1]}`,
		`"layer_types": ["linear_attention", "deepseek_sparse_attention", "linear_attention", "linear_attention"], "linear_attn_config": {"kda_layers": [0, 2, 3], "full_attn_layers": [1]}`,
		`"layer_types": ["linear_attention", "full_attention", "linear_attention", "linear_attention"], "linear_attn_config": {"full_attn_layers": [1]}`,
	} {
		c, err := parse(edit)
		if err != nil {
			t.Errorf("%s: %v", edit, err)
			continue
		}
		if want := []string{LinearAttention, IndexedAttention, LinearAttention, LinearAttention}; !reflect.DeepEqual(c.LayerTypes, want) {
			t.Errorf("%s: layer_types %q, want %q", edit, c.LayerTypes, want)
		}
	}
	for _, tc := range []struct{ edit, want string }{
		{`"layer_types": ["linear_attention", "linear_attention", "linear_attention", "deepseek_sparse_attention"], "linear_attn_config": {"kda_layers": [0, 2, 3], "full_attn_layers": [1]}`, "layer_types[1]"},
		{`"layer_types": ["linear_attention", "linear_attention", "linear_attention", "deepseek_sparse_attention"], "linear_attn_config": {"kda_layers": [0, 2, 3], "full_attn_layers": [1]}`, "linear_attn_config.full_attn_layers"},
		{`"linear_attn_config": {"kda_layers": [0, 1, 2], "full_attn_layers": [2, 3]}`, "both"},
		{`"linear_attn_config": {"kda_layers": [0, 1], "full_attn_layers": [3]}`, "layer 2"},
		{`"linear_attn_config": {"kda_layers": [1, 2, 3], "full_attn_layers": [4]}`, "0-based"},
		{`"linear_attn_config": {"kda_layers": [0, 0, 2], "full_attn_layers": [1, 3]}`, "twice"},
		{`"linear_attn_config": {"kda_layers": "0,1"}`, "linear_attn_config.kda_layers"},
		{`"layer_types": ["linear_attention", "linear_attention", "linear_attention", "linear_attention"], "linear_attn_config": {"kda_layers": [0, 2, 3]}`, "does not list layer 1"},
	} {
		_, err := parse(tc.edit)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: want an error naming %q, got %v", tc.edit, tc.want, err)
		}
	}
}

// TestGPUCheckConfig: scripts/gpu-check.sh --glm's model (testdata/gpu-check/config.json)
// is GLM-5.3-Flash's published text config (testdata/hf-configs/glm-5.3-flash.json) cut
// to its first 4 layers, 3 KDA and 1 DSA with the MoE: every other field normalised the
// same (the real dimensions; it caught index_kpool 16 where the model has 4), but for
// what the check's random fp32 weights and short requests choose: no quantization_config,
// max_position_embeddings 4096 (the device slots' context), an EOS id, the raw fields.
func TestGPUCheckConfig(t *testing.T) {
	pub, err := LoadTextConfig("../../testdata/hf-configs/glm-5.3-flash.json")
	if err != nil {
		t.Fatal(err)
	}
	got, err := LoadTextConfig(filepath.Join("testdata", "gpu-check"))
	if err != nil {
		t.Fatal(err)
	}
	const n = 4
	want := *pub
	want.NumHiddenLayers = n
	want.LayerTypes, want.MLPLayerTypes, want.IndexerTypes = pub.LayerTypes[:n], pub.MLPLayerTypes[:n], pub.IndexerTypes[:n]
	want.Quant, want.Notes, want.Raw = nil, nil, nil
	g := *got
	g.Quant, g.Notes, g.Raw = nil, nil, nil
	if g.MaxPositionEmbeddings != 4096 || len(g.EOSTokenID) != 1 {
		t.Errorf("max_position_embeddings %d, eos %v: want 4096 and one id", g.MaxPositionEmbeddings, g.EOSTokenID)
	}
	g.MaxPositionEmbeddings, g.EOSTokenID = want.MaxPositionEmbeddings, want.EOSTokenID
	if !slices.Equal(g.LayerTypes, []string{LinearAttention, LinearAttention, LinearAttention, IndexedAttention}) || g.MLPLayerTypes[n-1] != "sparse" {
		t.Errorf("layers %v, MLPs %v: want 3 KDA then 1 DSA with the MoE", g.LayerTypes, g.MLPLayerTypes)
	}
	wv, gv := reflect.ValueOf(want), reflect.ValueOf(g)
	for i := range wv.NumField() {
		if f := wv.Type().Field(i); f.IsExported() && !reflect.DeepEqual(wv.Field(i).Interface(), gv.Field(i).Interface()) {
			t.Errorf("%s: gpu-check %v, the published config's first %d layers %v", f.Name, gv.Field(i).Interface(), n, wv.Field(i).Interface())
		}
	}
}
