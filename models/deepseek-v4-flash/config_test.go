package deepseekv4flash

import (
	"encoding/json"
	"math"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// configCase is one entry of testdata/config_cases.json: a config.json input and what
// transformers 5.23.0's DeepseekV4Config made of it (or the error it raised).
type configCase struct {
	Input  map[string]any `json:"input"`
	Want   map[string]any `json:"want"`
	Error  string         `json:"error"`
	Rotary map[string]struct {
		InvFreq []float64 `json:"inv_freq"`
		Scaling float64   `json:"scaling"`
	} `json:"rotary"`
}

// refusedByDesign lists inputs transformers accepts that this model refuses on purpose,
// with the field the error must name.
var refusedByDesign = map[string]string{
	"unknown-rope-type": "rope_type", // llama3 on the compress rotary: only default and yarn run here
}

// TestConfigCases checks ParseConfig's normalisation against DeepseekV4Config's for legacy
// (compress_ratios, compress_rate_csa/hca, num_hash_layers, qk_rope_head_dim,
// rope_scaling) and current inputs (scripts/deepseek-v4-goldens.sh writes the table).
func TestConfigCases(t *testing.T) {
	data, err := os.ReadFile("testdata/config_cases.json")
	if err != nil {
		t.Skipf("no config goldens: make them with `%s --only-config`", parityCommand)
	}
	var cases map[string]configCase
	if err := json.Unmarshal(data, &cases); err != nil {
		t.Fatal(err)
	}
	for name, cc := range cases {
		t.Run(name, func(t *testing.T) {
			in, _ := json.Marshal(cc.Input)
			c, err := ParseConfig(in)
			if field, ok := refusedByDesign[name]; ok {
				if err == nil || !strings.Contains(err.Error(), field) {
					t.Fatalf("want an error naming %s, got %v", field, err)
				}
				return
			}
			if cc.Error != "" {
				if err == nil {
					t.Fatalf("transformers refuses this config (%s), ParseConfig accepted it", cc.Error)
				}
				t.Logf("refused: %v (transformers: %s)", err, firstLine(cc.Error))
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for kind, want := range cc.Rotary {
				r := c.NewRotary(kind, c.HeadDim)
				if len(r.InvFreq) != len(want.InvFreq) || math.Abs(float64(r.Scale)-want.Scaling) > 1e-6 {
					t.Fatalf("%s rotary: %d frequencies scaled %g, transformers has %d scaled %g", kind, len(r.InvFreq), r.Scale, len(want.InvFreq), want.Scaling)
				}
				for i, f := range want.InvFreq {
					if d := math.Abs(float64(r.InvFreq[i]) - f); d > 2e-7*math.Abs(f) { // one or two float32 ulps
						t.Errorf("%s rotary: inv_freq[%d] = %g, transformers has %g", kind, i, r.InvFreq[i], f)
					}
				}
			}
			got := configFields(c)
			for k, want := range cc.Want {
				g, ok := got[k]
				if !ok {
					continue // a field the model does not read (attention_bias, pad_token_id, ...)
				}
				if !sameJSON(g, want) {
					t.Errorf("%s = %v, transformers has %v", k, jsonString(g), jsonString(want))
				}
			}
		})
	}
}

// configFields renders c as transformers names its attributes.
func configFields(c *Config) map[string]any {
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
	m["bos_token_id"], m["eos_token_id"] = tok(c.BOSTokenID), tok(c.EOSTokenID)
	delete(m, "pad_token_id")
	delete(m, "architectures")
	delete(m, "model_type")
	delete(m, "torch_dtype")
	m["qk_rope_head_dim"] = c.QKRopeHeadDim
	rp := map[string]any{}
	for k, r := range c.Rope {
		rp[k] = r.Raw
	}
	m["rope_parameters"] = rp
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

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// TestConfigRefusals checks that what the model cannot run is refused with the field named.
func TestConfigRefusals(t *testing.T) {
	for _, tc := range []struct{ edit, field string }{
		{`"model_type": "deepseek_v3"`, "model_type"},
		{`"architectures": ["DeepseekV3ForCausalLM"]`, "architecture"},
		{`"scoring_func": "softmax"`, "scoring_func"},
		{`"hidden_act": "gelu"`, "hidden_act"},
		{`"layer_types": ["sliding_attention", "full_attention"]`, "layer_types"},
		{`"mlp_layer_types": ["moe", "dense"]`, "mlp_layer_types"},
		{`"compress_ratios": [0, 8]`, "compress_ratios"},
		{`"o_groups": 3`, "o_groups"},
		{`"mlp_bias": true`, "mlp_bias"},
		{`"num_nextn_predict_layers": 2`, "num_nextn_predict_layers"},
		{`"partial_rotary_factor": 0.3`, "rotary dim"},
		{`"rope_scaling": {"type": "yarn", "factor": 4}`, "original_max_position_embeddings"},
	} {
		in := `{"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "head_dim": 32, ` + tc.edit + `}`
		_, err := ParseConfig([]byte(in))
		if err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s: want an error naming %s, got %v", tc.edit, tc.field, err)
		}
	}
}

// TestConfigRefusesDSpark: a DSpark checkpoint's config (DeepSeek-V4-Flash-0731: dspark_*
// keys, 46 compress_ratios for 43 layers, the drafter's stages after the MTP layer's entry)
// is refused at config time with an error naming DSpark and what gave it away; the
// published V4-Flash's 44 compress_ratios (43 layers and the MTP layer) still parse.
func TestConfigRefusesDSpark(t *testing.T) {
	ratios := func(n int) string {
		r := []string{"0", "0"}
		for len(r) < n-1 {
			r = append(r, "4", "128")
		}
		return "[" + strings.Join(append(r[:n-1], "0"), ", ") + "]"
	}
	base := `"num_hidden_layers": 43, "num_nextn_predict_layers": 1, "compress_ratios": `
	for _, tc := range []struct{ what, cfg, want string }{
		{"dspark keys", base + ratios(44) + `, "dspark_block_size": 5, "dspark_noise_token_id": 128799, "dspark_target_layer_ids": [40, 41, 42], "dspark_markov_rank": 256`, "dspark_block_size, dspark_markov_rank, dspark_noise_token_id, dspark_target_layer_ids"},
		{"46 compress_ratios", base + ratios(46), "compress_ratios has 46 entries"},
		{"0731 as published", base + ratios(46) + `, "dspark_block_size": 5`, "dspark_block_size"},
	} {
		_, err := ParseConfig([]byte("{" + tc.cfg + "}"))
		if err == nil || !strings.Contains(err.Error(), "DSpark") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want one naming DSpark and %s", tc.what, err, tc.want)
		}
	}
	c, err := ParseConfig([]byte("{" + base + ratios(44) + `, "dspark_block_size": null}`))
	if err != nil {
		t.Fatalf("V4-Flash's 44 compress_ratios: %v", err)
	}
	if len(c.LayerTypes) != 43 || c.LayerTypes[42] != CompressedSparse {
		t.Errorf("layer types %v", c.LayerTypes)
	}
}

// TestConfigQuantization: quantization_config's not-converted lists (ignore,
// modules_to_not_convert, ignored_layers) are read into Quant.NotConverted with every
// pattern checked; a ModelOpt config, a bad list and an unknown field are refused naming
// the field.
func TestConfigQuantization(t *testing.T) {
	parse := func(q string) (*Config, error) {
		return ParseConfig([]byte(`{"num_hidden_layers": 2, "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128], ` + q + `}}`))
	}
	c, err := parse(`"ignore": ["head", "re:layers\\.\\d+\\.attn\\.wo_a"], "modules_to_not_convert": ["embed"]`)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := c.Quant.NotConverted, []string{"head", `re:layers\.\d+\.attn\.wo_a`, "embed"}; !slices.Equal(got, want) {
		t.Errorf("NotConverted = %q, want %q", got, want)
	}
	for _, tc := range []struct{ q, want string }{
		{`"ignore": "head"`, "quantization_config.ignore"},
		{`"ignore": ["re:layers.(0"]`, "quantization_config.ignore"},
		{`"modules_to_not_convert": [""]`, "quantization_config.modules_to_not_convert"},
		{`"ignored_layers": ["re:"]`, "quantization_config.ignored_layers"},
		{`"kv_cache_scheme": {"num_bits": 8}`, "quantization_config.kv_cache_scheme"},
	} {
		if _, err := parse(tc.q); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want one naming %s", tc.q, err, tc.want)
		}
	}
	_, err = ParseConfig([]byte(`{"num_hidden_layers": 2, "quantization_config": {"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION"}}`))
	if err == nil || !strings.Contains(err.Error(), "quantization_config.quant_method") || !strings.Contains(err.Error(), "ModelOpt") {
		t.Errorf("a ModelOpt config: err = %v, want one naming quant_method and ModelOpt", err)
	}
}
