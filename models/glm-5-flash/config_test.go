package glm5flash

import (
	"encoding/json"
	"math"
	"os"
	"reflect"
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
