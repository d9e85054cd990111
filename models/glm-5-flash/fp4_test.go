package glm5flash

import (
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/weights"
)

// TestLoadFP4Experts: a routed expert stored as the official checkpoint stores them (FP4
// e2m1 packed two per byte, low nibble first, one ue8m0 scale per row per 32 inputs, under
// the upstream per-expert name) loads to exactly the values it encodes.
func TestLoadFP4Experts(t *testing.T) {
	cfgJSON := strings.Replace(tinyConfigJSON, `"model_type": "deepseek_v4",`,
		`"model_type": "deepseek_v4", "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128], "scale_fmt": "ue8m0", "expert_dtype": "fp4"},`, 1)
	c, err := ParseConfig([]byte(cfgJSON))
	if err != nil {
		t.Fatal(err)
	}
	w := RandomWeights(c, 5, false)
	in, h := c.MoEIntermediateSize, c.HiddenSize
	// Expert 0's gate rows of layer 1: values e2m1 represents, times the scale 2^-3.
	e2m1 := []float32{0, 0.5, 1, 1.5, 2, 3, 4, 6}
	rng := rand.New(rand.NewPCG(1, 2))
	want := make([]float32, in*h)
	packed := make([]byte, in*h/2)
	for i := range want {
		code := uint8(rng.IntN(16))
		v := e2m1[code&7] / 8
		if code&8 != 0 {
			v = -v
		}
		want[i] = v
		packed[i/2] |= code << (4 * uint(i%2))
	}
	copy(w.Layers[1].GateUp[:in*h], want)
	ts, err := w.Tensors(c, weights.F32, UpstreamNames)
	if err != nil {
		t.Fatal(err)
	}
	const name = "layers.1.ffn.experts.0.w1.weight"
	found := false
	for i := range ts {
		if ts[i].Name == name {
			ts[i] = weights.Tensor{Name: name, DType: weights.I8, Shape: []int{in, h / 2}, Data: packed}
			found = true
		}
	}
	if !found {
		t.Fatalf("no tensor %s among the upstream names", name)
	}
	scale := make([]byte, in*(h/weights.FP4Group))
	for i := range scale {
		scale[i] = 127 - 3 // ue8m0: 2^(byte-127)
	}
	ts = append(ts, weights.Tensor{Name: "layers.1.ffn.experts.0.w1.scale", DType: weights.F8E8M0, Shape: []int{in, h / weights.FP4Group}, Data: scale})
	dir := t.TempDir()
	if err := weights.WriteFile(filepath.Join(dir, "model.safetensors"), ts, nil); err != nil {
		t.Fatal(err)
	}
	got, err := loadDir(t, c, dir)
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range want {
		if got.Layers[1].GateUp[i] != v {
			t.Fatalf("dequantized %s[%d] = %g, want %g", name, i, got.Layers[1].GateUp[i], v)
		}
	}
	// The same expert with its scale of the wrong shape is an error naming both tensors.
	ts[len(ts)-1].Shape, ts[len(ts)-1].Data = []int{in}, scale[:in]
	if err := weights.WriteFile(filepath.Join(dir, "model.safetensors"), ts, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := loadDir(t, c, dir); err == nil || !strings.Contains(err.Error(), "w1.scale") {
		t.Fatalf("wrong FP4 scale shape: err = %v", err)
	}
}
