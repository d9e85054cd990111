package deepseekv4flash

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/runnertest"
	"github.com/resin-llm/resin/core/weights"
)

func loadDir(t *testing.T, c *Config, dir string) (*Weights, error) {
	t.Helper()
	ck, err := weights.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	return LoadWeights(c, ck)
}

// TestSafetensorsRoundTrip saves random weights (with an MTP head) in each name form and
// loads them back through the real loader: the logits and MTP logits must be identical.
func TestSafetensorsRoundTrip(t *testing.T) {
	m := tinyModel(t)
	toks := []int32{3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6, 2, 6, 4}
	want, streams := runChunks(t, m, toks, []int{len(toks)})
	row := m.Config.HCMult * m.Config.HiddenSize
	wantMTP, err := m.MTPForward(m.NewSeqState(), streams[:(len(toks)-1)*row], toks[1:])
	if err != nil {
		t.Fatal(err)
	}
	for _, form := range []NameForm{ModuleNames, UpstreamNames, HybridNames} {
		dir := t.TempDir()
		if err := m.W.Save(m.Config, dir, weights.F32, form); err != nil {
			t.Fatal(err)
		}
		w, err := loadDir(t, m.Config, dir)
		if err != nil {
			t.Fatalf("%s names: %v", form, err)
		}
		m2, _ := NewModel(m.Config, w, 512)
		got, _ := runChunks(t, m2, toks, []int{len(toks)})
		gotMTP, err := m2.MTPForward(m2.NewSeqState(), streams[:(len(toks)-1)*row], toks[1:])
		if err != nil {
			t.Fatal(err)
		}
		if d, _ := runnertest.MaxAbsDiff(got, want); d != 0 {
			t.Errorf("%s names: logits moved by %g after save and load", form, d)
		}
		if d, _ := runnertest.MaxAbsDiff(gotMTP, wantMTP); d != 0 {
			t.Errorf("%s names: MTP logits moved by %g after save and load", form, d)
		}
	}
}

// TestTensorNames pins a few names of each form to transformers 5.23.0's.
func TestTensorNames(t *testing.T) {
	c := tinyConfig(t)
	for _, tc := range []struct {
		form NameForm
		want []string
	}{
		{ModuleNames, []string{"model.embed_tokens.weight", "lm_head.weight", "model.hc_head.hc_fn",
			"model.layers.0.attn_hc.fn", "model.layers.0.mlp.gate.tid2eid", "model.layers.1.mlp.gate.e_score_correction_bias",
			"model.layers.1.self_attn.compressor.indexer.scorer.weights_proj.weight", "model.layers.2.self_attn.compressor.position_bias",
			"model.layers.1.mlp.experts.gate_up_proj", "model.layers.3.self_attn.sinks", "mtp.0.e_proj.weight", "mtp.0.attn.wq_a.weight"}},
		{UpstreamNames, []string{"embed.weight", "head.weight", "hc_head_fn", "norm.weight", "layers.0.hc_attn_fn",
			"layers.0.ffn.gate.tid2eid", "layers.1.ffn.gate.bias", "layers.1.attn.indexer.weights_proj.weight",
			"layers.1.attn.indexer.compressor.ape", "layers.2.attn.compressor.wkv.weight", "layers.1.ffn.experts.3.w3.weight",
			"layers.3.attn.attn_sink", "layers.0.attn.kv_norm.weight", "mtp.0.attn.kv_norm.weight", "mtp.0.ffn.experts.0.w1.weight"}},
		{HybridNames, []string{"model.embed_tokens.weight", "head.weight", "model.hc_head.hc_base", "model.norm.weight",
			"model.layers.0.hc_ffn_scale", "model.layers.1.attn.indexer.wq_b.weight", "model.layers.0.ffn.experts.0.w2.weight",
			"model.layers.0.attn_norm.weight", "model.layers.0.attn.norm.weight", "mtp.0.hc_head_scale"}},
	} {
		got := TensorNames(c, tc.form, true)
		for _, n := range tc.want {
			if !slices.Contains(got, n) {
				t.Errorf("%s names lack %s", tc.form, n)
			}
		}
	}
}

// TestLoadRefusals checks that a missing, unexpected or mis-shaped tensor is an error
// naming it.
func TestLoadRefusals(t *testing.T) {
	m := tinyModel(t)
	c := m.Config
	ts, err := m.W.Tensors(c, weights.F32, UpstreamNames)
	if err != nil {
		t.Fatal(err)
	}
	write := func(edit func([]weights.Tensor) []weights.Tensor) string {
		dir := t.TempDir()
		out := edit(slices.Clone(ts))
		if err := weights.WriteFile(filepath.Join(dir, "model.safetensors"), out, nil); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	drop := func(name string) func([]weights.Tensor) []weights.Tensor {
		return func(ts []weights.Tensor) []weights.Tensor {
			return slices.DeleteFunc(ts, func(x weights.Tensor) bool { return x.Name == name })
		}
	}
	for _, tc := range []struct {
		what, want string
		edit       func([]weights.Tensor) []weights.Tensor
	}{
		{"missing", "layers.1.attn.indexer.compressor.ape", drop("layers.1.attn.indexer.compressor.ape")},
		{"missing expert", "layers.2.ffn.experts.3.w2.weight", drop("layers.2.ffn.experts.3.w2.weight")},
		{"unexpected", "layers.0.attn.compressor.wkv.weight", func(ts []weights.Tensor) []weights.Tensor {
			x, _ := weights.NewTensor("layers.0.attn.compressor.wkv.weight", weights.F32, []int{2}, []float32{1, 2})
			return append(ts, x)
		}},
		{"mis-shaped", "layers.3.attn.attn_sink", func(ts []weights.Tensor) []weights.Tensor {
			for i, x := range ts {
				if x.Name == "layers.3.attn.attn_sink" {
					ts[i], _ = weights.NewTensor(x.Name, weights.F32, []int{5}, make([]float32, 5))
				}
			}
			return ts
		}},
		{"tid2eid out of range", "tid2eid", func(ts []weights.Tensor) []weights.Tensor {
			for i, x := range ts {
				if x.Name == "layers.0.ffn.gate.tid2eid" {
					d := slices.Clone(x.Data)
					d[0] = 99
					ts[i].Data = d
				}
			}
			return ts
		}},
		{"tid2eid repeating an expert", "routes the token to expert", func(ts []weights.Tensor) []weights.Tensor {
			for i, x := range ts {
				if x.Name == "layers.0.ffn.gate.tid2eid" {
					if x.DType != weights.I32 && x.DType != weights.I64 {
						t.Fatalf("tid2eid stored as %v", x.DType)
					}
					w := len(x.Data) / (c.VocabSize * c.NumExpertsPerTok) // bytes an id
					d := slices.Clone(x.Data)
					copy(d[w:2*w], d[:w]) // token 0's second expert is its first
					ts[i].Data = d
				}
			}
			return ts
		}},
	} {
		_, err := loadDir(t, c, write(tc.edit))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: want an error naming %s, got %v", tc.what, tc.want, err)
		}
	}
}

// nearestE4M3 returns the float8 e4m3fn byte nearest v (brute force over the 256 codes).
func nearestE4M3(v float32) byte {
	best, bestD := byte(0), math.Inf(1)
	for c := range 256 {
		f := weights.F8E4M3ToFloat32(uint8(c))
		if f != f {
			continue
		}
		if d := math.Abs(float64(f - v)); d < bestD {
			best, bestD = byte(c), d
		}
	}
	return best
}

// TestLoadFP8 stores one dense linear as float8 e4m3 with its block scale (upstream
// "X.scale" name) under a quantization_config: the loader dequantizes it through
// core/weights and marks the scale used.
func TestLoadFP8(t *testing.T) {
	cfgJSON := strings.Replace(tinyConfigJSON, `"model_type": "deepseek_v4",`,
		`"model_type": "deepseek_v4", "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]},`, 1)
	c, err := ParseConfig([]byte(cfgJSON))
	if err != nil {
		t.Fatal(err)
	}
	if c.Quant == nil {
		t.Fatal("quantization_config not parsed")
	}
	w := RandomWeights(c, 3, false)
	ts, err := w.Tensors(c, weights.F32, UpstreamNames)
	if err != nil {
		t.Fatal(err)
	}
	const name = "layers.1.attn.wq_b.weight"
	var want []float32
	for i, x := range ts {
		if x.Name != name {
			continue
		}
		v := w.Layers[1].QB
		var amax float32
		for _, f := range v {
			amax = max(amax, float32(math.Abs(float64(f))))
		}
		scale := amax / 448
		q := make([]byte, len(v))
		want = make([]float32, len(v))
		for j, f := range v {
			q[j] = nearestE4M3(f / scale)
			want[j] = weights.F8E4M3ToFloat32(q[j]) * scale
		}
		ts[i] = weights.Tensor{Name: name, DType: weights.F8E4M3, Shape: x.Shape, Data: q}
		s, _ := weights.NewTensor("layers.1.attn.wq_b.scale", weights.F32, []int{1, 1}, []float32{scale})
		ts = append(ts, s)
		break
	}
	dir := t.TempDir()
	if err := weights.WriteFile(filepath.Join(dir, "model.safetensors"), ts, nil); err != nil {
		t.Fatal(err)
	}
	got, err := loadDir(t, c, dir)
	if err != nil {
		t.Fatal(err)
	}
	if d, at := runnertest.MaxAbsDiff(got.Layers[1].QB, want); d > 1e-6 {
		t.Errorf("dequantized %s differs by %g at %d", name, d, at)
	}
}

// TestWeightBytes checks that WeightBytes counts every value random weights hold (with
// and without the MTP head, tied and untied), and that Load refuses, naming both figures,
// random weights of a config larger than the machine's memory (DeepSeek-V4-Flash's own
// dimensions, the config defaults) instead of building them until the out-of-memory
// killer comes.
func TestWeightBytes(t *testing.T) {
	for _, tied := range []bool{false, true} {
		c := tinyConfig(t)
		c.TieWordEmbeddings = tied
		for _, mtp := range []bool{false, true} {
			held := 4 * heldValues(reflect.ValueOf(RandomWeights(c, 3, mtp)), map[uintptr]bool{})
			if got := WeightBytes(c, mtp); got != held {
				t.Errorf("tied %v, MTP %v: WeightBytes = %d, the random weights hold %d bytes", tied, mtp, got, held)
			}
		}
	}
	full, err := ParseConfig([]byte(`{"model_type": "deepseek_v4"}`))
	if err != nil {
		t.Fatal(err)
	}
	// DeepSeek-V4-Flash has 284B parameters: over a TB in fp32.
	if n := WeightBytes(full, true); n < 1<<40 {
		t.Errorf("the full-size config's weights come to %d bytes, want over 1 TiB", n)
	}
	if _, ok := weights.AvailableMemory(); !ok {
		t.Skip("available memory unknown here: CheckMemory allows anything")
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(`{"model_type": "deepseek_v4"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = Load(dir, Options{})
	if !errors.Is(err, weights.ErrTooLarge) || strings.Count(err.Error(), "GiB") != 2 {
		t.Fatalf("random weights of the full-size config: %v, want ErrTooLarge naming both figures", err)
	}
	t.Log(err)
}

// heldValues counts the float32s and int32s held in the slices reachable from v, each
// backing array once (a tied lm_head is the embedding's).
func heldValues(v reflect.Value, seen map[uintptr]bool) int64 {
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if v.IsNil() {
			return 0
		}
		return heldValues(v.Elem(), seen)
	case reflect.Struct:
		var n int64
		for i := range v.NumField() {
			n += heldValues(v.Field(i), seen)
		}
		return n
	case reflect.Slice:
		if k := v.Type().Elem().Kind(); k == reflect.Float32 || k == reflect.Int32 {
			if v.Len() == 0 || seen[v.Pointer()] {
				return 0
			}
			seen[v.Pointer()] = true
			return int64(v.Len())
		}
		var n int64
		for i := range v.Len() {
			n += heldValues(v.Index(i), seen)
		}
		return n
	}
	return 0
}
