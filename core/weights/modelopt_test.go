package weights

import (
	"encoding/json"
	"errors"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestParseModelOpt(t *testing.T) {
	for _, c := range []struct {
		name string
		raw  string
		want *Quant
	}{
		// config.json's form, as ModelOpt >= 0.39 writes it.
		{"fp8", `{"quant_method":"modelopt","quant_algo":"FP8","ignore":["lm_head","*.mlp.gate"],"kv_cache_scheme":null,"producer":{"name":"modelopt","version":"0.39.0"}}`,
			&Quant{Method: "modelopt", Algo: AlgoFP8, Group: 16, NotConverted: []string{"lm_head", "*.mlp.gate"}}},
		// hf_quant_config.json's form nested under "quantization", lower-case algo.
		{"nvfp4 nested", `{"quant_method":"modelopt","producer":{"name":"modelopt"},"quantization":{"quant_algo":"nvfp4","group_size":16,"exclude_modules":["lm_head"],"kv_cache_quant_algo":"FP8"}}`,
			&Quant{Method: "modelopt", Algo: AlgoNVFP4, Group: 16, NotConverted: []string{"lm_head"}, KVCache: `"FP8"`}},
		{"w4a16", `{"quant_method":"modelopt","quant_algo":"W4A16_NVFP4"}`, &Quant{Method: "modelopt", Algo: AlgoNVFP4, Group: 16}},
		// SGLang's "Hybrid FP8+NVFP4" form: FP8 attention, NVFP4 experts.
		{"mixed", `{"quant_method":"modelopt","quant_algo":"MIXED_PRECISION","ignore":["lm_head"],"quantized_layers":{` +
			`"model.layers.0.self_attn.o_proj":{"quant_algo":"FP8"},"model.layers.0.mlp.experts":{"quant_algo":"NVFP4","group_size":16}}}`,
			&Quant{Method: "modelopt", Algo: AlgoMixed, Group: 16, NotConverted: []string{"lm_head"},
				Layers: map[string]string{"model.layers.0.self_attn.o_proj": AlgoFP8, "model.layers.0.mlp.experts": AlgoNVFP4}}},
		// Fine-grained FP8 with compressed-tensors' and SGLang's name for the list.
		{"fp8 ignore", `{"quant_method":"fp8","ignore":["lm_head","re:.*\\.indexer\\..*"]}`,
			&Quant{Method: "fp8", Format: "e4m3", ActivationScheme: "dynamic", BlockSize: [2]int{128, 128}, ScaleFormat: ScaleFloat, ExpertDType: ExpertFP8,
				NotConverted: []string{"lm_head", `re:.*\.indexer\..*`}}},
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

func TestParseModelOptRefuses(t *testing.T) {
	for _, c := range []struct{ raw, field, value string }{
		{`{"quant_method":"modelopt","quant_algo":"MXFP8"}`, "quant_algo", "MXFP8"},
		{`{"quant_method":"modelopt","quant_algo":"FP8_PB_WO"}`, "quant_algo", "FP8_PB_WO"},
		{`{"quant_method":"modelopt","quant_algo":"W4A8_AWQ"}`, "quant_algo", "W4A8_AWQ"},
		{`{"quant_method":"modelopt","quantization":{"quant_algo":"INT8_SQ"}}`, "quant_algo", "INT8_SQ"},
		{`{"quant_method":"modelopt"}`, "quant_algo", "missing"},
		{`{"quant_method":"modelopt","quant_algo":"MIXED_PRECISION"}`, "quantized_layers", "MIXED_PRECISION"},
		{`{"quant_method":"modelopt","quant_algo":"MIXED_PRECISION","quantized_layers":{"a.b":{"quant_algo":"INT4_AWQ"}}}`, `quantized_layers["a.b"].quant_algo`, "INT4_AWQ"},
		{`{"quant_method":"modelopt","quant_algo":"MIXED_PRECISION","quantized_layers":{"a.b":{"quant_algo":"NVFP4","group_size":32}}}`, `quantized_layers["a.b"].group_size`, "32"},
		{`{"quant_method":"modelopt","quant_algo":"FP8","quantized_layers":{"a.b":{"quant_algo":"NVFP4"}}}`, `quantized_layers["a.b"].quant_algo`, "FP8"},
		{`{"quant_method":"modelopt","quant_algo":"NVFP4","group_size":0}`, "group_size", "0"},
		{`{"quant_method":"modelopt","quant_algo":"FP8","ignore":"lm_head"}`, "ignore", "lm_head"},
		{`{"quant_method":"modelopt","quant_algo":"FP8","ignore":["re:("]}`, "ignore", "re:("},
		{`{"quant_method":"modelopt","quant_algo":"FP8","awq_block_size":128}`, "awq_block_size", "unknown"},
		{`{"quant_method":"fp8","ignore":[""]}`, "ignore", "empty"},
	} {
		_, err := ParseQuantization(json.RawMessage(c.raw))
		if !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), "quantization_config."+c.field) || !strings.Contains(err.Error(), c.value) {
			t.Errorf("%s: err = %v, want ErrFormat naming quantization_config.%s and %s", c.raw, err, c.field, c.value)
		}
	}
}

// nvfp4Case is a [2, 32] NVFP4 matrix in groups of 16 whose values are worked out by hand:
// e2m1 codes 1 = 0.5, 2 = 1, 3 = 1.5, 4 = 2, 5 = 3, 7 = 6, 9 = -0.5, 0xC = -2, 0xF = -6;
// e4m3 scales 0x38 = 1, 0x40 = 2, 0x30 = 0.5, 0x3C = 1.5; weight_scale_2 0.25.
func nvfp4Case() (w, scale []byte, global float32, want []float32) {
	w = make([]byte, 2*16)
	w[0], w[1], w[8] = 0x21, 0x9F, 0x77 // row 0: (0.5, 1), (-6, -0.5); elements 16, 17: (6, 6)
	w[16], w[31] = 0x3C, 0x45           // row 1: (-2, 1.5); elements 30, 31: (3, 2)
	scale = []byte{0x38, 0x40, 0x30, 0x3C}
	want = make([]float32, 64)
	// row 0, group 0 scale 1, group 1 scale 2; all times 0.25
	want[0], want[1], want[2], want[3] = 0.125, 0.25, -1.5, -0.125
	want[16], want[17] = 3, 3
	// row 1, group 0 scale 0.5, group 1 scale 1.5
	want[32], want[33] = -0.25, 0.1875
	want[62], want[63] = 1.125, 0.75
	return w, scale, 0.25, want
}

func TestDequantNVFP4(t *testing.T) {
	w, scale, global, want := nvfp4Case()
	got := make([]float32, 64)
	if err := DequantNVFP4(got, w, scale, global, 2, 32, 16); err != nil {
		t.Fatal(err)
	}
	sameFloats(t, "nvfp4", got, want)
	if err := DequantNVFP4(got, w, scale, global, 2, 24, 16); !errors.Is(err, ErrShape) {
		t.Errorf("24 columns in groups of 16: err = %v", err)
	}
}

// modelOptCheckpoint writes the stored forms of a ModelOpt checkpoint: FP8 (F8_E4M3 and a
// scalar weight_scale, an input_scale beside), NVFP4, BF16 modules left out, and broken ones.
func modelOptCheckpoint(t *testing.T) *Checkpoint {
	t.Helper()
	nvw, nvs, nvg, _ := nvfp4Case()
	fp8 := []byte{0x38, 0x40, 0xB8, 0x30, 0x3C, 0x00} // 1, 2, -1, 0.5, 1.5, 0
	scalar := func(name string, v float32) Tensor { return f32Tensor(t, name, []int{}, []float32{v}) }
	ts := []Tensor{
		{Name: "model.language_model.layers.0.self_attn.o_proj.weight", DType: F8E4M3, Shape: []int{2, 3}, Data: fp8},
		scalar("model.language_model.layers.0.self_attn.o_proj.weight_scale", 0.5),
		scalar("model.language_model.layers.0.self_attn.o_proj.input_scale", 3),
		{Name: "model.layers.0.mlp.experts.0.down_proj.weight", DType: U8, Shape: []int{2, 16}, Data: nvw},
		{Name: "model.layers.0.mlp.experts.0.down_proj.weight_scale", DType: F8E4M3, Shape: []int{2, 2}, Data: nvs},
		scalar("model.layers.0.mlp.experts.0.down_proj.weight_scale_2", nvg),
		mustTensor(t, "lm_head.weight", BF16, []int{1, 2}, []float32{1.5, -2}),
		f32Tensor(t, "model.norm.weight", []int{2}, []float32{1, 2}),
		// Listed in ignore, stored quantized.
		{Name: "model.layers.0.mlp.gate.weight", DType: F8E4M3, Shape: []int{2, 3}, Data: fp8},
		scalar("model.layers.0.mlp.gate.weight_scale", 1),
		// FP8 with a per-channel scale (FP8_PER_CHANNEL_PER_TOKEN's), and with none.
		{Name: "perchannel.weight", DType: F8E4M3, Shape: []int{2, 3}, Data: fp8},
		f32Tensor(t, "perchannel.weight_scale", []int{2}, []float32{1, 1}),
		{Name: "noscale.weight", DType: F8E4M3, Shape: []int{2, 3}, Data: fp8},
		// A fused tensor of transformers' module form: not a module's .weight.
		{Name: "model.layers.0.mlp.experts.gate_up_proj", DType: F8E4M3, Shape: []int{1, 2, 3}, Data: fp8},
	}
	dir := t.TempDir()
	if err := WriteFile(filepath.Join(dir, "model.safetensors"), ts, nil); err != nil {
		t.Fatal(err)
	}
	ck, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	ck.SetProgress(nil)
	t.Cleanup(func() { ck.Close() })
	return ck
}

func TestCheckpointDequantizeModelOpt(t *testing.T) {
	ck := modelOptCheckpoint(t)
	parse := func(raw string) *Quant {
		q, err := ParseQuantization(json.RawMessage(raw))
		if err != nil {
			t.Fatal(err)
		}
		return q
	}
	fp8 := parse(`{"quant_method":"modelopt","quant_algo":"FP8","ignore":["lm_head","*.mlp.gate"]}`)
	nvfp4 := parse(`{"quant_method":"modelopt","quantization":{"quant_algo":"NVFP4","group_size":16,"exclude_modules":["lm_head"]}}`)
	mixed := parse(`{"quant_method":"modelopt","quant_algo":"MIXED_PRECISION","ignore":["lm_head"],"quantized_layers":{` +
		`"language_model.model.layers.0.self_attn.o_proj":{"quant_algo":"FP8"},"model.layers.0.mlp.experts":{"quant_algo":"NVFP4"}}}`)
	_, _, _, nvWant := nvfp4Case()
	fp8Want := []float32{0.5, 1, -0.5, 0.25, 0.75, 0}
	const (
		oProj = "model.language_model.layers.0.self_attn.o_proj.weight"
		down  = "model.layers.0.mlp.experts.0.down_proj.weight"
	)
	for _, c := range []struct {
		what  string
		q     *Quant
		name  string
		shape []int
		want  []float32
	}{
		{"fp8", fp8, oProj, []int{2, 3}, fp8Want},
		{"fp8: ignored bf16", fp8, "lm_head.weight", []int{1, 2}, []float32{1.5, -2}},
		{"fp8: a norm", fp8, "model.norm.weight", []int{2}, []float32{1, 2}},
		{"nvfp4", nvfp4, down, []int{2, 32}, nvWant},
		{"mixed: fp8 (the other name form)", mixed, oProj, []int{2, 3}, fp8Want},
		{"mixed: nvfp4 (its parent listed)", mixed, down, []int{2, 32}, nvWant},
		{"mixed: ignored bf16", mixed, "lm_head.weight", []int{1, 2}, []float32{1.5, -2}},
	} {
		got, err := ck.Dequantize(c.name, c.q, c.shape...)
		if err != nil {
			t.Errorf("%s: %v", c.what, err)
			continue
		}
		sameFloats(t, c.what, got, c.want)
	}
	for _, c := range []struct {
		what  string
		q     *Quant
		name  string
		shape []int
		want  string
	}{
		{"ignored but quantized", fp8, "model.layers.0.mlp.gate.weight", []int{2, 3}, `ignore keeps it unquantized ("*.mlp.gate")`},
		{"nvfp4 weight under FP8", fp8, down, []int{2, 32}, "quant_algo is FP8"},
		{"fp8 weight under NVFP4", nvfp4, oProj, []int{2, 3}, "quant_algo is NVFP4"},
		{"fp8 weight not in quantized_layers", mixed, "model.layers.0.mlp.gate.weight", []int{2, 3}, "quantized_layers does not list model.layers.0.mlp.gate"},
		{"per-channel scale", fp8, "perchannel.weight", []int{2, 3}, "one per matrix"},
		{"no scale", fp8, "noscale.weight", []int{2, 3}, "noscale.weight_scale is missing"},
		{"wrong shape", nvfp4, down, []int{2, 48}, "model expects [2 48]"},
		{"fused module-form tensor", fp8, "model.layers.0.mlp.experts.gate_up_proj", []int{1, 2, 3}, "only modules' .weight tensors"},
	} {
		_, err := ck.Dequantize(c.name, c.q, c.shape...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want one saying %q", c.what, err, c.want)
		}
	}
	for name, want := range map[string]bool{
		"a.weight_scale": true, "a.weight_scale_2": true, "a.input_scale": true, "attn.k_scale": true,
		"a.weight": false, "a.weight_scale_inv": false,
	} {
		if got := fp8.ScaleTensor(name); got != want {
			t.Errorf("ScaleTensor(%q) = %v under modelopt", name, got)
		}
	}
}

// TestDequantizeHonoursIgnore checks fine-grained FP8's not-converted list (ignore,
// modules_to_not_convert): a BF16 module it lists loads, a quantized one it lists is refused.
func TestDequantizeHonoursIgnore(t *testing.T) {
	ck := quantCheckpoint(t)
	q, err := ParseQuantization([]byte(`{"quant_method":"fp8","weight_block_size":[2,2],"ignore":["comp","a"]}`))
	if err != nil {
		t.Fatal(err)
	}
	got, err := ck.Dequantize("comp.weight", q, 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	sameFloats(t, "ignored bf16", got, []float32{1.5, -2})
	if _, err := ck.Dequantize("a.weight", q, 3, 5); !errors.Is(err, ErrDType) || !strings.Contains(err.Error(), `"a" in modules_to_not_convert or ignore`) {
		t.Errorf("quantized module in ignore: err = %v", err)
	}
	if _, err := ck.Dequantize("b.weight", q, 3, 5); err != nil {
		t.Errorf("module not listed: %v", err)
	}
}
