package weights

import (
	"bytes"
	"errors"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
)

// countingReader counts the bytes read through it.
type countingReader struct {
	r *bytes.Reader
	n atomic.Int64
}

func (c *countingReader) ReadAt(p []byte, off int64) (int, error) {
	n, err := c.r.ReadAt(p, off)
	c.n.Add(int64(n))
	return n, err
}

// TestReadRowsCols: rows and columns read alone equal the whole tensor's slices, for
// bf16 and f32 matrices and a 3-D tensor's rows; the reader sees only their bytes (rows
// in one read) and File.BytesRead counts the same; ranges outside the tensor, columns of
// a tensor that is not 2-D and rows of a scalar are refused with ErrShape.
func TestReadRowsCols(t *testing.T) {
	vals := make([]float32, 4*7*3)
	for i := range vals {
		vals[i] = float32(i)*0.25 - 3
	}
	img, err := Encode([]Tensor{
		mustTensor(t, "m.bf16", BF16, []int{5, 7}, vals[:35]),
		mustTensor(t, "m.f32", F32, []int{5, 7}, vals[:35]),
		mustTensor(t, "t3", F32, []int{4, 7, 3}, vals),
		mustTensor(t, "s", F32, []int{}, vals[:1]),
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	cr := &countingReader{r: bytes.NewReader(img)}
	f, err := Parse(cr, int64(len(img)))
	if err != nil {
		t.Fatal(err)
	}
	header := cr.n.Load()
	decode := func(name string, raw []byte) []float32 {
		info, _ := f.Info(name)
		out := make([]float32, len(raw)/info.DType.Size())
		if err := DecodeFloat32(out, raw, info.DType); err != nil {
			t.Fatal(err)
		}
		return out
	}
	for _, name := range []string{"m.bf16", "m.f32"} {
		whole, _, err := f.Float32(name)
		if err != nil {
			t.Fatal(err)
		}
		info, _ := f.Info(name)
		es := int64(info.DType.Size())
		before, counted := cr.n.Load(), f.BytesRead()
		_, raw, err := f.ReadRows(name, 1, 4)
		if err != nil {
			t.Fatal(err)
		}
		if got := decode(name, raw); !slices.Equal(got, whole[7:28]) {
			t.Fatalf("%s rows [1, 4) = %v, want %v", name, got, whole[7:28])
		}
		if n := cr.n.Load() - before; n != 3*7*es || f.BytesRead()-counted != n {
			t.Fatalf("%s rows [1, 4): %d bytes through the reader (%d counted), want %d", name, n, f.BytesRead()-counted, 3*7*es)
		}
		before = cr.n.Load()
		_, raw, err = f.ReadCols(name, 2, 5)
		if err != nil {
			t.Fatal(err)
		}
		var want []float32
		for r := range 5 {
			want = append(want, whole[r*7+2:r*7+5]...)
		}
		if got := decode(name, raw); !slices.Equal(got, want) {
			t.Fatalf("%s columns [2, 5) = %v, want %v", name, got, want)
		}
		if n := cr.n.Load() - before; n != 5*3*es {
			t.Fatalf("%s columns [2, 5): %d bytes through the reader, want %d", name, n, 5*3*es)
		}
		if _, raw, err := f.ReadCols(name, 4, 4); err != nil || len(raw) != 0 {
			t.Fatalf("%s empty columns: %d bytes, %v", name, len(raw), err)
		}
	}
	_, raw, err := f.ReadRows("t3", 3, 4)
	if err != nil || !slices.Equal(decode("t3", raw), vals[63:84]) {
		t.Fatalf("t3 row 3: %v %v", raw, err)
	}
	for _, c := range []struct {
		what string
		err  error
	}{
		{"rows past the end", second(f.ReadRows("m.f32", 3, 6))},
		{"negative rows", second(f.ReadRows("m.f32", -1, 2))},
		{"reversed rows", second(f.ReadRows("m.f32", 3, 2))},
		{"columns past the end", second(f.ReadCols("m.f32", 0, 8))},
		{"columns of a 3-D tensor", second(f.ReadCols("t3", 0, 1))},
		{"columns of a scalar", second(f.ReadCols("s", 0, 1))},
		{"rows of a scalar", second(f.ReadRows("s", 0, 1))},
	} {
		if !errors.Is(c.err, ErrShape) {
			t.Errorf("%s: err = %v, want ErrShape", c.what, c.err)
		}
	}
	if _, _, err := f.ReadRows("missing", 0, 1); !errors.Is(err, ErrNotFound) {
		t.Errorf("missing tensor: %v", err)
	}
	if header == 0 {
		t.Fatal("the header was not read through the reader")
	}
}

func second(_ TensorInfo, _ []byte, err error) error { return err }

// TestCheckpointRanges: Checkpoint's Float32Rows and Float32Cols equal the whole tensor's
// slices, check the whole shape, and BytesRead counts only the bytes read.
func TestCheckpointRanges(t *testing.T) {
	vals := make([]float32, 6*4)
	for i := range vals {
		vals[i] = float32(i) - 7.5
	}
	dir := t.TempDir()
	if err := WriteFile(filepath.Join(dir, "model.safetensors"), []Tensor{mustTensor(t, "w", BF16, []int{6, 4}, vals)}, nil); err != nil {
		t.Fatal(err)
	}
	ck, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	ck.SetProgress(nil)
	rows, err := ck.Float32Rows("w", 4, 6, 6, 4)
	if err != nil || !slices.Equal(rows, vals[16:24]) {
		t.Fatalf("rows [4, 6) = %v, %v", rows, err)
	}
	if ck.BytesRead() != 2*4*2 {
		t.Fatalf("BytesRead %d after two bf16 rows of 4, want 16", ck.BytesRead())
	}
	cols, err := ck.Float32Cols("w", 3, 4, 6, 4)
	if err != nil || !slices.Equal(cols, []float32{vals[3], vals[7], vals[11], vals[15], vals[19], vals[23]}) {
		t.Fatalf("column 3 = %v, %v", cols, err)
	}
	if _, err := ck.Float32Rows("w", 0, 1, 4, 6); !errors.Is(err, ErrShape) {
		t.Fatalf("wrong shape: %v", err)
	}
	if _, err := ck.Float32Cols("x", 0, 1, 6, 4); !errors.Is(err, ErrNotFound) {
		t.Fatalf("missing tensor: %v", err)
	}
}

// TestDequantizeRowsCols: every row and column range of FP8 weights (F32, E8M0, ue8m0 U8
// and BF16 scales in 2×2 blocks of a 3×5 matrix: partial blocks at both ends), an FP4
// expert (2×68, groups of 32), an unquantized BF16 linear and a stacked experts tensor
// (read whole) equals the slice of Dequantize's whole matrix; a strict row range of an
// FP8 weight reads fewer bytes than the whole; bad ranges and shapes are refused.
func TestDequantizeRowsCols(t *testing.T) {
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
	}{
		{"a.weight", fp8, []int{3, 5}},
		{"b.weight", fp8, []int{3, 5}},
		{"c.weight", &ue8m0, []int{3, 5}},
		{"d.weight", fp8, []int{3, 5}},
		{"comp.weight", fp8, []int{1, 2}},
		{"layers.0.ffn.experts.0.w1.weight", fp4, []int{2, 68}},
	} {
		whole, err := ck.Dequantize(c.name, c.q, c.shape...)
		if err != nil {
			t.Fatal(err)
		}
		rows, cols := c.shape[0], c.shape[1]
		for lo := 0; lo <= rows; lo++ {
			for hi := lo; hi <= rows; hi++ {
				got, err := ck.DequantizeRows(c.name, c.q, lo, hi, c.shape...)
				if err != nil {
					t.Fatalf("%s rows [%d, %d): %v", c.name, lo, hi, err)
				}
				if !slices.Equal(got, whole[lo*cols:hi*cols]) {
					t.Fatalf("%s rows [%d, %d) = %v, want %v", c.name, lo, hi, got, whole[lo*cols:hi*cols])
				}
			}
		}
		for lo := 0; lo <= cols; lo++ {
			for hi := lo; hi <= cols; hi++ {
				got, err := ck.DequantizeCols(c.name, c.q, lo, hi, c.shape...)
				if err != nil {
					t.Fatalf("%s columns [%d, %d): %v", c.name, lo, hi, err)
				}
				var want []float32
				for r := range rows {
					want = append(want, whole[r*cols+lo:r*cols+hi]...)
				}
				if !slices.Equal(got, want) && !(len(got) == 0 && len(want) == 0) {
					t.Fatalf("%s columns [%d, %d) = %v, want %v", c.name, lo, hi, got, want)
				}
			}
		}
	}
	before := ck.BytesRead()
	if _, err := ck.DequantizeRows("a.weight", fp8, 2, 3, 3, 5); err != nil {
		t.Fatal(err)
	}
	if n := ck.BytesRead() - before; n != 5+3*4 { // the last block row's 5 bytes and 3 F32 scales
		t.Fatalf("row 2 of a.weight read %d bytes, want 17", n)
	}
	if _, err := ck.DequantizeRows("a.weight", fp8, 2, 4, 3, 5); !errors.Is(err, ErrShape) {
		t.Fatalf("rows past the end: %v", err)
	}
	if _, err := ck.DequantizeCols("a.weight", fp8, 0, 1, 5, 3); !errors.Is(err, ErrShape) {
		t.Fatalf("a wrong shape: %v", err)
	}
	if _, err := ck.DequantizeRows("noscale.weight", fp8, 0, 1, 3, 5); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a missing scale: %v", err)
	}
	got, err := ck.DequantizeRows("experts.gate_up_proj", fp8, 0, 1, 2, 3, 5)
	if !errors.Is(err, ErrShape) {
		t.Fatalf("a stacked tensor's rows: %v %v", got, err)
	}
}
