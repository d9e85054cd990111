package weights

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestParseQuantization(t *testing.T) {
	for _, c := range []struct {
		name string
		raw  string
		want *Quant
	}{
		{"absent", ``, nil},
		{"null", `null`, nil},
		// DeepSeek-V3's config.json.
		{"v3", `{"activation_scheme":"dynamic","fmt":"e4m3","quant_method":"fp8","weight_block_size":[128,128]}`,
			&Quant{Method: "fp8", Format: "e4m3", ActivationScheme: "dynamic", BlockSize: [2]int{128, 128}, ScaleFormat: ScaleFloat, ExpertDType: ExpertFP8}},
		// DeepSeek-V4-Flash's (expert_dtype sits at the top level of config.json).
		{"v4", `{"activation_scheme":"dynamic","fmt":"e4m3","quant_method":"fp8","scale_fmt":"ue8m0","weight_block_size":[128,128]}`,
			&Quant{Method: "fp8", Format: "e4m3", ActivationScheme: "dynamic", BlockSize: [2]int{128, 128}, ScaleFormat: ScaleUE8M0, ExpertDType: ExpertFP8}},
		// V4.1's, and what transformers' save_pretrained writes for FineGrainedFP8Config.
		{"v4.1 saved", `{"quant_method":"fp8","modules_to_not_convert":["lm_head"],"modules_to_convert":null,"activation_scheme":"Dynamic",` +
			`"weight_block_size":[64,32],"dequantize":false,"scale_fmt":"ue8m0","expert_dtype":"fp4"}`,
			&Quant{Method: "fp8", Format: "e4m3", ActivationScheme: "dynamic", BlockSize: [2]int{64, 32}, ScaleFormat: ScaleUE8M0, ExpertDType: ExpertFP4,
				NotConverted: []string{"lm_head"}, expertSet: true}},
		{"minimal", `{"quant_method":"fp8","ignored_layers":["a","b"]}`,
			&Quant{Method: "fp8", Format: "e4m3", ActivationScheme: "dynamic", BlockSize: [2]int{128, 128}, ScaleFormat: ScaleFloat, ExpertDType: ExpertFP8,
				NotConverted: []string{"a", "b"}}},
	} {
		got, err := ParseQuantization(json.RawMessage(c.raw))
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s:\n got %+v\nwant %+v", c.name, got, c.want)
		}
	}
}

func TestParseQuantizationRefuses(t *testing.T) {
	for _, c := range []struct {
		raw   string
		field string // the error names quantization_config.<field>
	}{
		{`{"quant_method":"awq"}`, "quant_method"},
		{`{"quant_method":"fp8","fmt":"e5m2"}`, "fmt"},
		{`{"quant_method":"fp8","scale_fmt":"e8m0"}`, "scale_fmt"},
		{`{"quant_method":"fp8","scale_fmt":null}`, "scale_fmt"},
		{`{"quant_method":"fp8","expert_dtype":"nvfp4"}`, "expert_dtype"},
		{`{"quant_method":"fp8","activation_scheme":"per_token"}`, "activation_scheme"},
		{`{"quant_method":"fp8","activation_scheme":1}`, "activation_scheme"},
		{`{"quant_method":"fp8","weight_block_size":[128]}`, "weight_block_size"},
		{`{"quant_method":"fp8","weight_block_size":[0,128]}`, "weight_block_size"},
		{`{"quant_method":"fp8","weight_block_size":null}`, "weight_block_size"},
		{`{"quant_method":"fp8","weight_block_size":"128"}`, "weight_block_size"},
		{`{"quant_method":"fp8","dequantize":"yes"}`, "dequantize"},
		{`{"quant_method":"fp8","modules_to_not_convert":"lm_head"}`, "modules_to_not_convert"},
		{`{"quant_method":"fp8","group_size":32}`, "group_size"},
		{`{"fmt":"e4m3"}`, "quant_method"},
		// A GPTQ or AWQ config's own keys sort before quant_method: the method is named.
		{`{"bits":4,"group_size":128,"quant_method":"gptq"}`, "quant_method"},
		{`{"quant_method":"awq","bits":4,"version":"gemm","zero_point":true}`, "quant_method"},
		{`[1,2]`, ""},
	} {
		_, err := ParseQuantization(json.RawMessage(c.raw))
		if !errors.Is(err, ErrFormat) {
			t.Errorf("%s: err = %v, want ErrFormat", c.raw, err)
			continue
		}
		if want := "quantization_config." + c.field; c.field != "" && !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %q does not name %s", c.raw, err, want)
		}
	}
}

func TestFoldExpertDType(t *testing.T) {
	v4 := `{"quant_method":"fp8","scale_fmt":"ue8m0"}`
	q, _ := ParseQuantization(json.RawMessage(v4))
	if err := q.FoldExpertDType(json.RawMessage(`"fp4"`)); err != nil || q.ExpertDType != ExpertFP4 {
		t.Errorf("top-level fp4 into a config without one: %v, %v", q.ExpertDType, err)
	}
	q, _ = ParseQuantization(json.RawMessage(v4))
	if err := q.FoldExpertDType(nil); err != nil || q.ExpertDType != ExpertFP8 {
		t.Errorf("no top-level expert_dtype: %v, %v", q.ExpertDType, err)
	}
	// quantization_config's own value wins, as in transformers.
	q, _ = ParseQuantization(json.RawMessage(`{"quant_method":"fp8","expert_dtype":"fp8"}`))
	if err := q.FoldExpertDType(json.RawMessage(`"fp4"`)); err != nil || q.ExpertDType != ExpertFP8 {
		t.Errorf("quantization_config's expert_dtype overridden: %v, %v", q.ExpertDType, err)
	}
	q, _ = ParseQuantization(json.RawMessage(v4))
	if err := q.FoldExpertDType(json.RawMessage(`"int4"`)); !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), "expert_dtype") {
		t.Errorf("top-level int4: err = %v", err)
	}
}
