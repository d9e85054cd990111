package weights

import (
	"errors"
	"math"
	"path/filepath"
	"strings"
	"testing"
)

var negZero = float32(math.Copysign(0, -1))

// fp8Case is a [3, 5] F8_E4M3 matrix in [2, 2] blocks (scale [2, 3]: the last block row and
// column are partial) with its dequantised values worked out by hand.
var fp8Case = struct {
	w     []byte
	scale []float32
	want  []float32
}{
	w: []byte{
		0x38, 0x3c, 0x40, 0xb8, 0x01, // 1, 1.5, 2, -1, 2^-9
		0x7e, 0x00, 0x80, 0x44, 0x30, // 448, 0, -0, 3, 0.5
		0x38, 0x38, 0x38, 0x38, 0x38, // 1 ...
	},
	scale: []float32{
		0.5, 2, 4,
		8, 0.25, 1,
	},
	want: []float32{
		0.5, 0.75, 4, -2, 0.0078125,
		224, 0, negZero, 6, 2,
		8, 8, 0.25, 0.25, 1,
	},
}

func sameFloats(t *testing.T, what string, got, want []float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Errorf("%s[%d] = %g, want %g", what, i, got[i], want[i])
		}
	}
}

func TestDequantFP8(t *testing.T) {
	got := make([]float32, 15)
	if err := DequantFP8(got, fp8Case.w, fp8Case.scale, 3, 5, 2, 2); err != nil {
		t.Fatal(err)
	}
	sameFloats(t, "fp8 [3,5]/[2,2]", got, fp8Case.want)
	if v := got[0]; v != 0.5 {
		t.Fatal(v)
	}
	// A NaN byte or a NaN scale gives NaN.
	nan := make([]float32, 2)
	if err := DequantFP8(nan, []byte{0x7f, 0x38}, []float32{1, float32(math.NaN())}, 1, 2, 1, 1); err != nil || nan[0] == nan[0] || nan[1] == nan[1] {
		t.Errorf("NaN byte and NaN scale: %v, %v", nan, err)
	}
	for name, err := range map[string]error{
		"short scale": DequantFP8(got, fp8Case.w, fp8Case.scale[:5], 3, 5, 2, 2),
		"short w":     DequantFP8(got, fp8Case.w[:14], fp8Case.scale, 3, 5, 2, 2),
		"short dst":   DequantFP8(got[:14], fp8Case.w, fp8Case.scale, 3, 5, 2, 2),
		"zero block":  DequantFP8(got, fp8Case.w, fp8Case.scale, 3, 5, 0, 2),
	} {
		if !errors.Is(err, ErrShape) {
			t.Errorf("%s: err = %v, want ErrShape", name, err)
		}
	}
}

// TestDequantFP8Blocks checks the 128×128 blocks of a shape that is not a multiple of 128
// on either side, large enough to run on several goroutines, against the formula.
func TestDequantFP8Blocks(t *testing.T) {
	rows, cols := 700, 389 // scale [6, 4]: last block row 60 rows, last block column 5
	w := make([]byte, rows*cols)
	for i := range w {
		w[i] = byte(i*7) &^ 0x80 // positive, some NaN codes (0x7f) included
	}
	scale := make([]float32, 6*4)
	for i := range scale {
		scale[i] = float32(i + 1)
	}
	got := make([]float32, rows*cols)
	if err := DequantFP8(got, w, scale, rows, cols, 128, 128); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < rows; i++ {
		for j := 0; j < cols; j++ {
			want := F8E4M3ToFloat32(w[i*cols+j]) * scale[(i/128)*4+j/128]
			if g := got[i*cols+j]; math.Float32bits(g) != math.Float32bits(want) {
				t.Fatalf("[%d,%d] = %g, want %g", i, j, g, want)
			}
		}
	}
	// Corners by hand: 0x38 is 1, so each value is its block's scale.
	for i := range w {
		w[i] = 0x38
	}
	DequantFP8(got, w, scale, rows, cols, 128, 128)
	for _, c := range []struct{ i, j int }{{0, 0}, {127, 127}, {128, 0}, {0, 128}, {699, 388}, {640, 384}, {639, 383}} {
		if want := scale[(c.i/128)*4+c.j/128]; got[c.i*cols+c.j] != want {
			t.Errorf("[%d,%d] = %g, want %g", c.i, c.j, got[c.i*cols+c.j], want)
		}
	}
	if got[699*cols+388] != 24 || got[0] != 1 || got[639*cols+383] != 19 { // blocks [5,3], [0,0], [4,2]
		t.Errorf("corners %g %g %g, want 24 1 19", got[699*cols+388], got[0], got[639*cols+383])
	}
}

// fp4Case is a [2, 68] FP4 matrix (groups of 32: 32, 32 and a partial 4) packed into
// [2, 34] bytes, low nibble first, with the values worked out by hand.
func fp4Case() (w []byte, scale []float32, want map[int]float32) {
	w = make([]byte, 2*34)
	w[0] = 0x21  // e0 = 0.5 (1), e1 = 1 (2)
	w[1] = 0xf7  // e2 = 6 (7), e3 = -6 (f)
	w[15] = 0x9a // e30 = -1 (a), e31 = -0.5 (9)
	w[16] = 0x53 // e32 = 1.5 (3), e33 = 3 (5): second group
	w[33] = 0xc4 // e66 = 2 (4), e67 = -2 (c): the partial third group
	w[34] = 0x08 // row 1: e0 = -0 (8), e1 = 0
	w[50] = 0x66 // row 1: e32 = e33 = 4
	scale = []float32{2, 0.5, 4, 0.25, 0.125, 1}
	want = map[int]float32{
		0: 1, 1: 2, 2: 12, 3: -12, 30: -2, 31: -1, 32: 0.75, 33: 1.5, 66: 8, 67: -8,
		68 + 0: negZero, 68 + 1: 0, 68 + 32: 0.5, 68 + 33: 0.5,
	}
	return w, scale, want
}

func TestDequantFP4(t *testing.T) {
	w, scale, want := fp4Case()
	got := make([]float32, 2*68)
	if err := DequantFP4(got, w, scale, 2, 68, 32); err != nil {
		t.Fatal(err)
	}
	full := make([]float32, len(got))
	for i, v := range want {
		full[i] = v
	}
	sameFloats(t, "fp4 [2,68]/32", got, full)
	for name, err := range map[string]error{
		"odd columns":  DequantFP4(got[:2*67], w, scale, 2, 67, 32),
		"odd group":    DequantFP4(got, w, scale, 2, 68, 31),
		"short scale":  DequantFP4(got, w, scale[:5], 2, 68, 32),
		"short packed": DequantFP4(got, w[:67], scale, 2, 68, 32),
	} {
		if !errors.Is(err, ErrShape) {
			t.Errorf("%s: err = %v, want ErrShape", name, err)
		}
	}
}

// TestDequantFP4Parallel checks a matrix large enough to be split across goroutines
// (more than parallelMin values, rows in chunks of one) against the formula.
func TestDequantFP4Parallel(t *testing.T) {
	rows, cols := 515, 520 // 17 groups of 32 per row, the last one partial
	sc := (cols + FP4Group - 1) / FP4Group
	w := make([]byte, rows*cols/2)
	for i := range w {
		w[i] = byte(i * 131)
	}
	scale := make([]float32, rows*sc)
	for i := range scale {
		scale[i] = float32(i%7) - 3
	}
	got := make([]float32, rows*cols)
	if err := DequantFP4(got, w, scale, rows, cols, FP4Group); err != nil {
		t.Fatal(err)
	}
	for i := range rows {
		for j := range cols {
			b := w[(i*cols+j)/2]
			if j%2 == 1 {
				b >>= 4
			}
			if want := E2M1ToFloat32(b) * scale[i*sc+j/FP4Group]; math.Float32bits(got[i*cols+j]) != math.Float32bits(want) {
				t.Fatalf("[%d,%d] = %g, want %g", i, j, got[i*cols+j], want)
			}
		}
	}
}

func e8m0Bytes(v ...float32) []byte {
	out := make([]byte, len(v))
	for i, f := range v {
		out[i] = byte(math.Float32bits(f) >> 23)
	}
	return out
}

func f32Tensor(t *testing.T, name string, shape []int, v []float32) Tensor {
	return mustTensor(t, name, F32, shape, v)
}

// quantCheckpoint writes a checkpoint with every stored form of quantized weight.
func quantCheckpoint(t *testing.T) *Checkpoint {
	t.Helper()
	fp4w, fp4s, _ := fp4Case()
	doubled := make([]float32, 6)
	for i, s := range fp8Case.scale {
		doubled[i] = 2 * s
	}
	ts := []Tensor{
		// V3 / transformers naming, F32 scales.
		{Name: "a.weight", DType: F8E4M3, Shape: []int{3, 5}, Data: fp8Case.w},
		f32Tensor(t, "a.weight_scale_inv", []int{2, 3}, fp8Case.scale),
		// V4 upstream naming, F8_E8M0 scales.
		{Name: "b.weight", DType: F8E4M3, Shape: []int{3, 5}, Data: fp8Case.w},
		{Name: "b.scale", DType: F8E8M0, Shape: []int{2, 3}, Data: e8m0Bytes(fp8Case.scale...)},
		// ue8m0 scales saved as bytes.
		{Name: "c.weight", DType: F8E4M3, Shape: []int{3, 5}, Data: fp8Case.w},
		{Name: "c.weight_scale_inv", DType: U8, Shape: []int{2, 3}, Data: e8m0Bytes(fp8Case.scale...)},
		// BF16 scales.
		{Name: "d.weight", DType: F8E4M3, Shape: []int{3, 5}, Data: fp8Case.w},
		mustTensor(t, "d.weight_scale_inv", BF16, []int{2, 3}, fp8Case.scale),
		// Merged experts [2, 3, 5], the second with doubled scales.
		{Name: "experts.gate_up_proj", DType: F8E4M3, Shape: []int{2, 3, 5}, Data: append(append([]byte{}, fp8Case.w...), fp8Case.w...)},
		f32Tensor(t, "experts.gate_up_proj_scale_inv", []int{2, 2, 3}, append(append([]float32{}, fp8Case.scale...), doubled...)),
		// An FP4 routed expert, V4 upstream naming.
		{Name: "layers.0.ffn.experts.0.w1.weight", DType: I8, Shape: []int{2, 34}, Data: fp4w},
		{Name: "layers.0.ffn.experts.0.w1.scale", DType: F8E8M0, Shape: []int{2, 3}, Data: e8m0Bytes(fp4s...)},
		// An unquantized linear (V4's compressor projections ship BF16 without scales).
		mustTensor(t, "comp.weight", BF16, []int{1, 2}, []float32{1.5, -2}),
		// Broken ones.
		{Name: "badscale.weight", DType: F8E4M3, Shape: []int{3, 5}, Data: fp8Case.w},
		f32Tensor(t, "badscale.weight_scale_inv", []int{2, 2}, []float32{1, 1, 1, 1}),
		{Name: "noscale.weight", DType: F8E4M3, Shape: []int{3, 5}, Data: fp8Case.w},
		mustTensor(t, "odd.weight", BF16, []int{1, 2}, []float32{1, 2}),
		f32Tensor(t, "odd.weight_scale_inv", []int{1, 1}, []float32{1}),
		{Name: "u8scale.weight", DType: F8E4M3, Shape: []int{1, 1}, Data: []byte{0x38}},
		{Name: "u8scale.weight_scale_inv", DType: U8, Shape: []int{1, 1}, Data: []byte{127}},
		{Name: "i32scale.weight", DType: F8E4M3, Shape: []int{1, 1}, Data: []byte{0x38}},
		{Name: "i32scale.weight_scale_inv", DType: I32, Shape: []int{1, 1}, Data: []byte{1, 0, 0, 0}},
		{Name: "badfp4.weight", DType: I8, Shape: []int{2, 34}, Data: fp4w},
		{Name: "badfp4.scale", DType: F8E8M0, Shape: []int{2, 2}, Data: []byte{127, 127, 127, 127}},
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

func TestCheckpointDequantize(t *testing.T) {
	ck := quantCheckpoint(t)
	fp8, err := ParseQuantization([]byte(`{"quant_method":"fp8","fmt":"e4m3","weight_block_size":[2,2]}`))
	if err != nil {
		t.Fatal(err)
	}
	ue8m0 := *fp8
	ue8m0.ScaleFormat = ScaleUE8M0
	fp4, err := ParseQuantization([]byte(`{"quant_method":"fp8","scale_fmt":"ue8m0","weight_block_size":[2,2],"expert_dtype":"fp4"}`))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		q     *Quant
		shape []int
		want  []float32
	}{
		{"a.weight", fp8, []int{3, 5}, fp8Case.want},
		{"b.weight", fp8, []int{3, 5}, fp8Case.want},
		{"c.weight", &ue8m0, []int{3, 5}, fp8Case.want},
		{"d.weight", fp8, []int{3, 5}, fp8Case.want}, // the scales are exact in bf16
		{"comp.weight", fp8, []int{1, 2}, []float32{1.5, -2}},
		{"comp.weight", nil, []int{1, 2}, []float32{1.5, -2}},
	} {
		got, err := ck.Dequantize(c.name, c.q, c.shape...)
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		sameFloats(t, c.name, got, c.want)
	}

	got, err := ck.Dequantize("experts.gate_up_proj", fp8, 2, 3, 5)
	if err != nil {
		t.Fatal(err)
	}
	sameFloats(t, "experts[0]", got[:15], fp8Case.want)
	for i, v := range fp8Case.want {
		if got[15+i] != 2*v {
			t.Errorf("experts[1][%d] = %g, want %g", i, got[15+i], 2*v)
		}
	}

	got, err = ck.Dequantize("layers.0.ffn.experts.0.w1.weight", fp4, 2, 68)
	if err != nil {
		t.Fatal(err)
	}
	_, _, want := fp4Case()
	full := make([]float32, 2*68)
	for i, v := range want {
		full[i] = v
	}
	sameFloats(t, "fp4 expert", got, full)

	if s, ok := ck.ScaleName("b.weight"); !ok || s != "b.scale" {
		t.Errorf("ScaleName(b.weight) = %q, %v", s, ok)
	}
	if s, ok := ck.ScaleName("experts.gate_up_proj"); !ok || s != "experts.gate_up_proj_scale_inv" {
		t.Errorf("ScaleName(experts.gate_up_proj) = %q, %v", s, ok)
	}
}

func TestCheckpointDequantizeErrors(t *testing.T) {
	ck := quantCheckpoint(t)
	fp8 := &Quant{Method: "fp8", BlockSize: [2]int{2, 2}, ScaleFormat: ScaleFloat, ExpertDType: ExpertFP8}
	fp4 := &Quant{Method: "fp8", BlockSize: [2]int{2, 2}, ScaleFormat: ScaleUE8M0, ExpertDType: ExpertFP4}
	for _, c := range []struct {
		name  string
		q     *Quant
		shape []int
		is    error
		says  []string // the message names these
	}{
		{"badscale.weight", fp8, []int{3, 5}, ErrShape, []string{`"badscale.weight"`, `"badscale.weight_scale_inv"`, "[2 2]", "want [2 3]"}},
		{"badfp4.weight", fp4, []int{2, 68}, ErrShape, []string{`"badfp4.weight"`, `"badfp4.scale"`, "[2 2]", "want [2 3]"}},
		{"noscale.weight", fp8, []int{3, 5}, ErrNotFound, []string{`"noscale.weight"`, "noscale.weight_scale_inv or noscale.scale"}},
		{"a.weight", fp8, []int{5, 3}, ErrShape, []string{`"a.weight"`, "[3 5]", "[5 3]"}},
		{"a.weight", fp8, []int{15}, ErrShape, []string{`"a.weight"`}},
		{"layers.0.ffn.experts.0.w1.weight", fp8, []int{2, 68}, ErrDType, []string{"expert_dtype"}},
		{"layers.0.ffn.experts.0.w1.weight", fp4, []int{2, 67}, ErrShape, []string{"even"}},
		{"layers.0.ffn.experts.0.w1.weight", fp4, []int{2, 34}, ErrShape, []string{"[2 34]", "stored as [2 17]"}},
		{"odd.weight", fp8, []int{1, 2}, ErrDType, []string{`"odd.weight_scale_inv"`}},
		{"u8scale.weight", fp8, []int{1, 1}, ErrDType, []string{`"u8scale.weight_scale_inv"`, "U8"}},
		{"i32scale.weight", fp8, []int{1, 1}, ErrDType, []string{"I32"}},
		{"missing.weight", fp8, []int{1, 1}, ErrNotFound, []string{`"missing.weight"`}},
	} {
		_, err := ck.Dequantize(c.name, c.q, c.shape...)
		if !errors.Is(err, c.is) {
			t.Errorf("%s %v: err = %v, want %v", c.name, c.shape, err, c.is)
			continue
		}
		for _, s := range c.says {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("%s: %q does not say %s", c.name, err, s)
			}
		}
	}
	if _, err := ck.Dequantize("a.weight", nil, 3, 5); err == nil || !strings.Contains(err.Error(), "quantization_config") {
		t.Errorf("F8 weight without quantization_config: err = %v", err)
	}
}

// BenchmarkDequantFP8 measures a 7168×2048 block-scaled FP8 weight (a DeepSeek-V3
// projection, 14 MiB stored); MB/s counts the stored bytes.
func BenchmarkDequantFP8(b *testing.B) {
	rows, cols := 7168, 2048
	w := make([]byte, rows*cols)
	for i := range w {
		w[i] = byte(i)
	}
	scale := make([]float32, (rows/128)*(cols/128))
	for i := range scale {
		scale[i] = 1 / float32(i+1)
	}
	dst := make([]float32, rows*cols)
	b.SetBytes(int64(len(w)))
	b.ReportAllocs()
	for b.Loop() {
		if err := DequantFP8(dst, w, scale, rows, cols, 128, 128); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDequantFP4 measures a 4096×7168 FP4 expert weight (14 MiB stored, two values
// a byte, one scale per 32); MB/s counts the stored bytes.
func BenchmarkDequantFP4(b *testing.B) {
	rows, cols := 4096, 7168
	w := make([]byte, rows*cols/2)
	for i := range w {
		w[i] = byte(i * 13)
	}
	scale := make([]float32, rows*cols/32)
	for i := range scale {
		scale[i] = E8M0ToFloat32(byte(120 + i%16))
	}
	dst := make([]float32, rows*cols)
	b.SetBytes(int64(len(w)))
	b.ReportAllocs()
	for b.Loop() {
		if err := DequantFP4(dst, w, scale, rows, cols, 32); err != nil {
			b.Fatal(err)
		}
	}
}
