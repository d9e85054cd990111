package glm5flash

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/runnertest"
	"github.com/resin-llm/resin/core/weights"
)

// goldenTensors reads a parity case's checkpoint as F32 tensors, by name.
func goldenTensors(t *testing.T, dir string) (map[string]weights.Tensor, []byte) {
	t.Helper()
	if _, err := os.Stat(dir); err != nil {
		t.Skipf("no golden %s: make it with `%s`", dir, glmParityCommand)
	}
	f, err := weights.OpenFile(filepath.Join(dir, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]weights.Tensor{}
	for _, n := range f.Names() {
		v, shape, err := f.Float32(n)
		if err != nil {
			t.Fatal(err)
		}
		x, err := weights.NewTensor(n, weights.F32, shape, v)
		if err != nil {
			t.Fatal(err)
		}
		out[n] = x
	}
	cfg, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	return out, cfg
}

// writeCheckpoint writes tensors and config.json into a new directory, split over two
// shards with an index (the sharded layout from_pretrained reads).
func writeCheckpoint(t *testing.T, ts map[string]weights.Tensor, cfg []byte) string {
	t.Helper()
	dir := t.TempDir()
	var shards [2][]weights.Tensor
	index := map[string]string{}
	i := 0
	for n, x := range ts {
		shards[i%2] = append(shards[i%2], x)
		index[n] = []string{"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}[i%2]
		i++
	}
	for s, name := range []string{"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"} {
		if err := weights.WriteFile(filepath.Join(dir, name), shards[s], nil); err != nil {
			t.Fatal(err)
		}
	}
	idx := `{"metadata": {}, "weight_map": {`
	first := true
	for n, f := range index {
		if !first {
			idx += ","
		}
		idx += `"` + n + `": "` + f + `"`
		first = false
	}
	idx += "}}"
	if err := os.WriteFile(filepath.Join(dir, "model.safetensors.index.json"), []byte(idx), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func goldenLogits(t *testing.T, dir string) []float32 {
	m, err := LoadTextModel(dir)
	if err != nil {
		t.Fatal(err)
	}
	toks, _ := readGLMGolden(t, filepath.Join("testdata", "parity", "module"), m.Config.VocabSize)
	return runSplits(t, m, toks, len(toks))
}

// TestTextLoadForms checks that a sharded checkpoint, bf16 weights, and the vision tower,
// an embed_tokens copy and an hc_head under the MTP layer beside the text weights all load
// (the latter three ignored with a note).
func TestTextLoadForms(t *testing.T) {
	src := filepath.Join("testdata", "parity", "module")
	ts, cfg := goldenTensors(t, src)
	want := goldenLogits(t, src)
	extra := map[string]weights.Tensor{}
	for n, x := range ts {
		extra[n] = x
	}
	for _, n := range []string{"model.visual.blocks.0.attn.qkv.weight", "model.language_model.layers.6.embed_tokens.weight",
		"model.language_model.layers.6.hc_head_fn"} {
		x, _ := weights.NewTensor(n, weights.F32, []int{2, 2}, []float32{1, 2, 3, 4})
		extra[n] = x
	}
	dir := writeCheckpoint(t, extra, cfg)
	m, err := LoadTextModel(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(m.Config.Notes, "; "), "3 tensors ignored by the text model") {
		t.Errorf("notes %q", m.Config.Notes)
	}
	if d, _ := runnertest.MaxAbsDiff(goldenLogits(t, dir), want); d != 0 {
		t.Errorf("sharded: logits differ by %g", d)
	}
	if !m.HasMTP() {
		t.Error("the MTP layer was not loaded")
	}
	// bf16: the loader widens; logits equal those of the bf16-rounded fp32 weights.
	bf, rounded := map[string]weights.Tensor{}, map[string]weights.Tensor{}
	for n, x := range ts {
		v, err := decodeF32(x)
		if err != nil {
			t.Fatal(err)
		}
		for i := range v {
			v[i] = weights.Round(v[i], weights.BF16)
		}
		b, _ := weights.NewTensor(n, weights.BF16, x.Shape, v)
		r, _ := weights.NewTensor(n, weights.F32, x.Shape, v)
		bf[n], rounded[n] = b, r
	}
	if d, _ := runnertest.MaxAbsDiff(goldenLogits(t, writeCheckpoint(t, bf, cfg)), goldenLogits(t, writeCheckpoint(t, rounded, cfg))); d != 0 {
		t.Errorf("bf16: logits differ from the rounded fp32 weights' by %g", d)
	}
}

func decodeF32(x weights.Tensor) ([]float32, error) {
	n := 1
	for _, d := range x.Shape {
		n *= d
	}
	v := make([]float32, n)
	return v, weights.DecodeFloat32(v, x.Data, x.DType)
}

// TestTextLoadRefusals checks that a missing, mis-shaped or unexpected tensor is an error
// naming it.
func TestTextLoadRefusals(t *testing.T) {
	ts, cfg := goldenTensors(t, filepath.Join("testdata", "parity", "module"))
	const victim = "model.language_model.layers.1.self_attn.indexer.wk.weight"
	const mtpVictim = "model.language_model.layers.6.self_attn.indexer.index_kpool_compress_gate"
	const mtpEH = "model.language_model.layers.6.eh_proj.weight"
	for _, tc := range []struct {
		name string
		edit func(map[string]weights.Tensor)
		is   error
	}{
		{"missing", func(m map[string]weights.Tensor) { delete(m, victim) }, weights.ErrNotFound},
		{"mis-shaped", func(m map[string]weights.Tensor) {
			x := m[victim]
			x.Shape = []int{x.Shape[1], x.Shape[0]}
			m[victim] = x
		}, weights.ErrShape},
		{"unexpected", func(m map[string]weights.Tensor) {
			x := m[victim]
			x.Name = "model.language_model.layers.2.self_attn.indexer.wk.weight" // layer 2 shares its indexer
			m[x.Name] = x
		}, nil},
		{"mtp missing", func(m map[string]weights.Tensor) { delete(m, mtpVictim) }, weights.ErrNotFound},
		{"mtp without eh_proj", func(m map[string]weights.Tensor) { delete(m, mtpEH) }, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := map[string]weights.Tensor{}
			for n, x := range ts {
				m[n] = x
			}
			tc.edit(m)
			_, err := LoadTextModel(writeCheckpoint(t, m, cfg))
			want := victim
			switch tc.name {
			case "unexpected":
				want = "layers.2.self_attn.indexer.wk.weight"
			case "mtp missing":
				want = mtpVictim
			case "mtp without eh_proj":
				want = "has no " + mtpEH
			}
			if err == nil || !strings.Contains(err.Error(), want) || (tc.is != nil && !errors.Is(err, tc.is)) {
				t.Fatalf("want an error naming %s, got %v", want, err)
			}
		})
	}
}

// TestTextLoadFP8 checks a block-quantized float8 linear (scale per 128×128 block, as
// GLM-5.3-Flash's FP8 checkpoint stores it) dequantizes through core/weights.
func TestTextLoadFP8(t *testing.T) {
	src := filepath.Join("testdata", "parity", "module")
	ts, cfg := goldenTensors(t, src)
	const name = "model.language_model.layers.1.self_attn.q_b_proj.weight"
	x := ts[name]
	v, _ := decodeF32(x)
	var amax float32
	for _, f := range v {
		amax = max(amax, float32(math.Abs(float64(f))))
	}
	scale := amax / 448
	q := make([]byte, len(v))
	want := make([]float32, len(v))
	for j, f := range v {
		q[j] = nearestE4M3(f / scale)
		want[j] = weights.F8E4M3ToFloat32(q[j]) * scale
	}
	ts[name] = weights.Tensor{Name: name, DType: weights.F8E4M3, Shape: x.Shape, Data: q}
	s, _ := weights.NewTensor(name+"_scale_inv", weights.F32, []int{1, 1}, []float32{scale})
	ts[s.Name] = s
	qcfg := strings.Replace(string(cfg), `"architectures"`, `"quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}, "architectures"`, 1)
	m, err := LoadTextModel(writeCheckpoint(t, ts, []byte(qcfg)))
	if err != nil {
		t.Fatal(err)
	}
	if m.Config.Quant == nil {
		t.Fatal("quantization_config not parsed")
	}
	if d, at := runnertest.MaxAbsDiff(m.W.layers[1].mla.qb, want); d > 1e-6 {
		t.Errorf("dequantized %s differs by %g at %d", name, d, at)
	}
}

// TestEveryWeightMovesLogits perturbs one tensor of each kind and checks the logits move by more than the parity tolerance: a port that ignored
// it would not pass the parity test.
func TestEveryWeightMovesLogits(t *testing.T) {
	for _, c := range []string{"module", "checkpoint"} {
		src := filepath.Join("testdata", "parity", c)
		ts, cfg := goldenTensors(t, src)
		base := goldenLogits(t, src)
		seen := map[string]bool{}
		for n, x := range ts {
			if strings.Contains(n, fmt.Sprintf(".layers.%d.", map[string]int{"module": 6, "checkpoint": 5}[c])) {
				continue // the MTP layer: TestMTPWeightsMoveMTPLogits
			}
			kind := n
			if i := strings.Index(n, ".layers."); i >= 0 {
				rest := n[i+len(".layers."):]
				kind = rest[strings.IndexByte(rest, '.')+1:] + "@" + c
			}
			if seen[kind] {
				continue
			}
			seen[kind] = true
			v, _ := decodeF32(x)
			// Shift the values by one place: scaling would hide weights behind a norm
			// (q_a_proj, kv_a_proj, the indexer's wk) or a ranking (weights_proj).
			v = append(v[1:], v[0])
			y, _ := weights.NewTensor(n, weights.F32, x.Shape, v)
			m := map[string]weights.Tensor{}
			for k, z := range ts {
				m[k] = z
			}
			m[n] = y
			got := goldenLogits(t, writeCheckpoint(t, m, cfg))
			if d, _ := runnertest.MaxAbsDiff(got, base); d < 10*glmParityTol {
				t.Errorf("%s: shifting it moves the logits by only %g", n, d)
			}
		}
	}
}

// TestTextWeightBytes checks that TextWeightBytes counts every float the random model
// holds, and that LoadText refuses, naming both figures, random weights of a config larger
// than the machine's memory (GLM-5.3-Flash's own dimensions) instead of building them until
// the out-of-memory killer comes.
func TestTextWeightBytes(t *testing.T) {
	m := tinyTextModel(t)
	floats := heldFloats(reflect.ValueOf(m.W), map[uintptr]bool{})
	if got := TextWeightBytes(m.Config); got != 4*floats {
		t.Errorf("TextWeightBytes = %d, the random model holds %d bytes", got, 4*floats)
	}
	if _, ok := weights.AvailableMemory(); !ok {
		t.Skip("available memory unknown here: CheckMemory allows anything")
	}
	dir := t.TempDir()
	cfg := `{"model_type": "glm5_next", "text_config": {"num_hidden_layers": 45}}`
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := LoadText(dir, 0, 0)
	if !errors.Is(err, weights.ErrTooLarge) || !strings.Contains(err.Error(), "GiB") {
		t.Fatalf("random weights of the full-size config: %v, want ErrTooLarge with the figures", err)
	}
}

// heldFloats counts the float32s held in the []float32 slices reachable from v, each
// backing array once (the MTP layer's head is lm_head's).
func heldFloats(v reflect.Value, seen map[uintptr]bool) int64 {
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if v.IsNil() {
			return 0
		}
		return heldFloats(v.Elem(), seen)
	case reflect.Struct:
		var n int64
		for i := range v.NumField() {
			n += heldFloats(v.Field(i), seen)
		}
		return n
	case reflect.Slice:
		if v.Type().Elem().Kind() == reflect.Float32 {
			if v.Len() == 0 || seen[v.Pointer()] {
				return 0
			}
			seen[v.Pointer()] = true
			return int64(v.Len())
		}
		var n int64
		for i := range v.Len() {
			n += heldFloats(v.Index(i), seen)
		}
		return n
	}
	return 0
}

// nearestE2M1 is the FP4 e2m1 code nearest v.
func nearestE2M1(v float32) byte {
	best, bestD := byte(0), math.Inf(1)
	for c := range 16 {
		if d := math.Abs(float64(weights.E2M1ToFloat32(uint8(c)) - v)); d < bestD {
			best, bestD = byte(c), d
		}
	}
	return best
}

// quantizeNVFP4 stores the [rows, cols] weight x as ModelOpt does (U8 e2m1 pairs, an
// F8_E4M3 scale per 16 inputs, a float32 weight_scale_2) and returns the tensors and the
// values they dequantize to, computed here from the codes.
func quantizeNVFP4(t *testing.T, x weights.Tensor, rows, cols int) ([]weights.Tensor, []float32) {
	t.Helper()
	v, _ := decodeF32(x)
	const global = 0.125
	w, sc := make([]byte, rows*cols/2), make([]byte, rows*cols/16)
	want := make([]float32, rows*cols)
	for i := range rows {
		for g := range cols / 16 {
			var amax float32
			for j := g * 16; j < (g+1)*16; j++ {
				amax = max(amax, float32(math.Abs(float64(v[i*cols+j]))))
			}
			s := nearestE4M3(amax / 6 / global)
			sc[i*cols/16+g] = s
			bs := weights.F8E4M3ToFloat32(s) * global
			for j := g * 16; j < (g+1)*16; j++ {
				code := nearestE2M1(v[i*cols+j] / bs)
				w[(i*cols+j)/2] |= code << (4 * (j % 2))
				want[i*cols+j] = weights.E2M1ToFloat32(code) * bs
			}
		}
	}
	g, _ := weights.NewTensor(x.Name+"_scale_2", weights.F32, []int{}, []float32{global})
	return []weights.Tensor{
		{Name: x.Name, DType: weights.U8, Shape: []int{rows, cols / 2}, Data: w},
		{Name: x.Name + "_scale", DType: weights.F8E4M3, Shape: []int{rows, cols / 16}, Data: sc}, g,
	}, want
}

// quantizeFP8PerTensor stores x as ModelOpt FP8 (F8_E4M3, one float32 weight_scale, an
// input_scale beside) and returns what it dequantizes to.
func quantizeFP8PerTensor(t *testing.T, x weights.Tensor) ([]weights.Tensor, []float32) {
	t.Helper()
	v, _ := decodeF32(x)
	var amax float32
	for _, f := range v {
		amax = max(amax, float32(math.Abs(float64(f))))
	}
	scale := amax / 448
	q, want := make([]byte, len(v)), make([]float32, len(v))
	for j, f := range v {
		q[j] = nearestE4M3(f / scale)
		want[j] = weights.F8E4M3ToFloat32(q[j]) * scale
	}
	base := strings.TrimSuffix(x.Name, ".weight")
	s, _ := weights.NewTensor(base+".weight_scale", weights.F32, []int{}, []float32{scale})
	in, _ := weights.NewTensor(base+".input_scale", weights.F32, []int{}, []float32{0.01})
	return []weights.Tensor{{Name: x.Name, DType: weights.F8E4M3, Shape: x.Shape, Data: q}, s, in}, want
}

// TestTextLoadModelOpt checks a ModelOpt "Hybrid FP8+NVFP4" checkpoint (SGLang's GLM-5
// form: quant_algo MIXED_PRECISION, FP8 attention and NVFP4 routed experts in
// quantized_layers, lm_head in ignore) loads with each tensor dequantized as its codes
// say, and that an NVFP4-only config and an FP8 one load their kind.
func TestTextLoadModelOpt(t *testing.T) {
	src := filepath.Join("testdata", "parity", "checkpoint")
	const (
		qb   = "model.language_model.layers.0.self_attn.q_b_proj.weight"
		down = "model.language_model.layers.0.mlp.experts.1.down_proj.weight"
	)
	for _, tc := range []struct{ name, quant string }{
		{"mixed", `{"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION", "ignore": ["lm_head"], "producer": {"name": "modelopt", "version": "0.39.0"}, "quantized_layers": {` +
			`"model.language_model.layers.0.self_attn.q_b_proj": {"quant_algo": "FP8"}, "model.language_model.layers.0.mlp.experts.1.down_proj": {"quant_algo": "NVFP4", "group_size": 16}}}`},
		{"nvfp4", `{"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16, "ignore": ["lm_head"]}`},
		{"fp8", `{"quant_method": "modelopt", "quant_algo": "FP8", "ignore": ["lm_head"]}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts, cfg := goldenTensors(t, src)
			var wantQB, wantDown []float32
			if tc.name != "nvfp4" {
				var qs []weights.Tensor
				qs, wantQB = quantizeFP8PerTensor(t, ts[qb])
				for _, x := range qs {
					ts[x.Name] = x
				}
			}
			if tc.name != "fp8" {
				var qs []weights.Tensor
				qs, wantDown = quantizeNVFP4(t, ts[down], 32, 16)
				for _, x := range qs {
					ts[x.Name] = x
				}
			}
			lm, _ := decodeF32(ts["lm_head.weight"])
			bf, _ := weights.NewTensor("lm_head.weight", weights.BF16, ts["lm_head.weight"].Shape, lm)
			ts["lm_head.weight"] = bf
			qcfg := strings.Replace(string(cfg), `"architectures"`, `"quantization_config": `+tc.quant+`, "architectures"`, 1)
			m, err := LoadTextModel(writeCheckpoint(t, ts, []byte(qcfg)))
			if err != nil {
				t.Fatal(err)
			}
			if m.Config.Quant == nil || m.Config.Quant.Method != "modelopt" {
				t.Fatalf("quantization_config parsed as %+v", m.Config.Quant)
			}
			if wantQB != nil {
				if d, at := runnertest.MaxAbsDiff(m.W.layers[0].mla.qb, wantQB); d > 0 {
					t.Errorf("FP8 %s differs by %g at %d", qb, d, at)
				}
			}
			if wantDown != nil {
				D, F := 32, 16
				if d, at := runnertest.MaxAbsDiff(m.W.layers[0].moe.down[D*F:2*D*F], wantDown); d > 0 {
					t.Errorf("NVFP4 %s differs by %g at %d", down, d, at)
				}
			}
			want, _ := decodeF32(bf)
			if d, _ := runnertest.MaxAbsDiff(m.W.lmHead, want); d > 0 {
				t.Errorf("ignored BF16 lm_head differs by %g", d)
			}
		})
	}
}

// TestTextLoadQuantRefusals checks that a module the ignore list keeps unquantized but the
// file stores quantized is refused naming the list, and that a ModelOpt algorithm the CPU
// path cannot dequantise is refused at config time naming quant_algo and its value.
func TestTextLoadQuantRefusals(t *testing.T) {
	src := filepath.Join("testdata", "parity", "checkpoint")
	ts, cfg := goldenTensors(t, src)
	const qb = "model.language_model.layers.0.self_attn.q_b_proj.weight"
	qs, _ := quantizeFP8PerTensor(t, ts[qb])
	for _, x := range qs {
		ts[x.Name] = x
	}
	qcfg := strings.Replace(string(cfg), `"architectures"`, `"quantization_config": {"quant_method": "modelopt", "quant_algo": "FP8", "ignore": ["*.self_attn.q_b_proj"]}, "architectures"`, 1)
	_, err := LoadTextModel(writeCheckpoint(t, ts, []byte(qcfg)))
	if err == nil || !strings.Contains(err.Error(), `quantization_config.ignore keeps it unquantized ("*.self_attn.q_b_proj")`) {
		t.Errorf("ignored module stored FP8: err = %v", err)
	}
	for _, algo := range []string{"MXFP8", "FP8_PB_WO", "INT4_AWQ"} {
		q := `"quantization_config": {"quant_method": "modelopt", "quant_algo": "` + algo + `"}, "architectures"`
		_, err := ParseTextConfig([]byte(strings.Replace(string(cfg), `"architectures"`, q, 1)))
		if err == nil || !strings.Contains(err.Error(), "quantization_config.quant_algo") || !strings.Contains(err.Error(), algo) {
			t.Errorf("quant_algo %s: err = %v", algo, err)
		}
	}
}

// TestTextLoadFP8Ignore checks a fine-grained FP8 checkpoint whose quantization_config
// keeps modules BF16 through an ignore list (HF's modules_to_not_convert): the listed
// module loads as stored beside a block-quantized one.
func TestTextLoadFP8Ignore(t *testing.T) {
	src := filepath.Join("testdata", "parity", "module")
	ts, cfg := goldenTensors(t, src)
	const name = "model.language_model.layers.1.self_attn.q_b_proj.weight"
	x := ts[name]
	v, _ := decodeF32(x)
	var amax float32
	for _, f := range v {
		amax = max(amax, float32(math.Abs(float64(f))))
	}
	scale := amax / 448
	q, want := make([]byte, len(v)), make([]float32, len(v))
	for j, f := range v {
		q[j] = nearestE4M3(f / scale)
		want[j] = weights.F8E4M3ToFloat32(q[j]) * scale
	}
	ts[name] = weights.Tensor{Name: name, DType: weights.F8E4M3, Shape: x.Shape, Data: q}
	s, _ := weights.NewTensor(name+"_scale_inv", weights.F32, []int{1, 1}, []float32{scale})
	ts[s.Name] = s
	const kept = "model.language_model.layers.1.self_attn.o_proj.weight"
	ov, _ := decodeF32(ts[kept])
	bf, _ := weights.NewTensor(kept, weights.BF16, ts[kept].Shape, ov)
	ts[kept] = bf
	wantKept, _ := decodeF32(bf)
	qcfg := strings.Replace(string(cfg), `"architectures"`, `"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128], "ignore": ["lm_head", "o_proj"]}, "architectures"`, 1)
	m, err := LoadTextModel(writeCheckpoint(t, ts, []byte(qcfg)))
	if err != nil {
		t.Fatal(err)
	}
	if d, at := runnertest.MaxAbsDiff(m.W.layers[1].mla.qb, want); d > 1e-6 {
		t.Errorf("dequantized %s differs by %g at %d", name, d, at)
	}
	if d, _ := runnertest.MaxAbsDiff(m.W.layers[1].mla.o, wantKept); d > 0 {
		t.Errorf("ignored %s differs by %g", kept, d)
	}
}
