package weights

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func mustTensor(t *testing.T, name string, dt DType, shape []int, v []float32) Tensor {
	t.Helper()
	x, err := NewTensor(name, dt, shape, v)
	if err != nil {
		t.Fatal(err)
	}
	return x
}

func TestRoundTrip(t *testing.T) {
	vals := []float32{1, -2.5, 3.140625, 0.1, 1e-3, -65504}
	dir := t.TempDir()
	path := filepath.Join(dir, "model.safetensors")
	ts := []Tensor{
		mustTensor(t, "model.layers.0.self_attn.q_proj.weight", BF16, []int{2, 3}, vals),
		mustTensor(t, "model.norm.weight", F32, []int{6}, vals),
		mustTensor(t, "lm_head.weight", F16, []int{3, 2}, vals),
	}
	if err := WriteFile(path, ts, map[string]string{"format": "pt"}); err != nil {
		t.Fatal(err)
	}
	ck, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	for _, c := range []struct {
		name  string
		dt    DType
		shape []int
	}{{"model.layers.0.self_attn.q_proj.weight", BF16, []int{2, 3}}, {"model.norm.weight", F32, []int{6}}, {"lm_head.weight", F16, []int{3, 2}}} {
		got, err := ck.Float32(c.name, c.shape...)
		if err != nil {
			t.Fatal(err)
		}
		for i, v := range vals {
			if want := Round(v, c.dt); got[i] != want {
				t.Errorf("%s[%d] = %g, want %g", c.name, i, got[i], want)
			}
		}
		if info, _ := ck.Info(c.name); info.DType != c.dt {
			t.Errorf("%s dtype %s, want %s", c.name, info.DType, c.dt)
		}
	}
	if _, err := ck.Float32("model.norm.weight", 3, 2); !errors.Is(err, ErrShape) {
		t.Errorf("wrong shape: err = %v, want ErrShape", err)
	}
	if _, err := ck.Float32("model.embed_tokens.weight", 6); !errors.Is(err, ErrNotFound) {
		t.Errorf("missing tensor: err = %v, want ErrNotFound", err)
	}
	f, err := OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.Metadata["format"] != "pt" {
		t.Errorf("metadata = %v", f.Metadata)
	}
	// The data section starts 8-byte aligned, as the reference writer does.
	raw, _ := os.ReadFile(path)
	if n := binary.LittleEndian.Uint64(raw); (8+n)%8 != 0 {
		t.Errorf("header length %d leaves the data unaligned", n)
	}
}

func TestSharded(t *testing.T) {
	dir := t.TempDir()
	a := []Tensor{mustTensor(t, "a", F32, []int{2}, []float32{1, 2})}
	b := []Tensor{mustTensor(t, "b", F32, []int{1}, []float32{3})}
	if err := WriteFile(filepath.Join(dir, "model-00001-of-00002.safetensors"), a, nil); err != nil {
		t.Fatal(err)
	}
	if err := WriteFile(filepath.Join(dir, "model-00002-of-00002.safetensors"), b, nil); err != nil {
		t.Fatal(err)
	}
	idx := `{"metadata":{"total_size":12},"weight_map":{"a":"model-00001-of-00002.safetensors","b":"model-00002-of-00002.safetensors"}}`
	if err := os.WriteFile(filepath.Join(dir, IndexFile), []byte(idx), 0o644); err != nil {
		t.Fatal(err)
	}
	ck, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	if got, err := ck.Float32("b", 1); err != nil || got[0] != 3 {
		t.Fatalf("b = %v, %v", got, err)
	}
	if n := ck.Names(); len(n) != 2 {
		t.Errorf("names = %v", n)
	}
	bad := `{"weight_map":{"a":"model-00002-of-00002.safetensors"}}`
	os.WriteFile(filepath.Join(dir, IndexFile), []byte(bad), 0o644)
	// A malformed checkpoint, not a missing one: runtimes take ErrNotFound from Open to
	// mean "no safetensors here" and fall back to random weights.
	if _, err := Open(dir); !errors.Is(err, ErrFormat) || errors.Is(err, ErrNotFound) {
		t.Errorf("index naming the wrong shard: err = %v, want ErrFormat (not ErrNotFound)", err)
	}
}

func header(js string) []byte {
	var b bytes.Buffer
	binary.Write(&b, binary.LittleEndian, uint64(len(js)))
	b.WriteString(js)
	return b.Bytes()
}

func TestMalformed(t *testing.T) {
	cases := map[string][]byte{
		"short":          {1, 2, 3},
		"huge header":    header("")[:8],
		"not json":       header("{nope"),
		"bad dtype":      append(header(`{"x":{"dtype":"Q4","shape":[1],"data_offsets":[0,1]}}`), 0),
		"past the end":   append(header(`{"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`), 0, 0),
		"size mismatch":  append(header(`{"x":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}`), 0, 0, 0, 0),
		"overlap":        append(header(`{"x":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"y":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}}`), 0, 0, 0),
		"negative shape": append(header(`{"x":{"dtype":"U8","shape":[-1],"data_offsets":[0,0]}}`), 0),
		"bad metadata":   header(`{"__metadata__":{"a":1}}`),
		// 2^62·2 elements wrap to -2^63, and -2^63·4 bytes wrap to 0: a naive product
		// matches the empty data_offsets, and reading the tensor would panic in make.
		"elements overflow": header(`{"x":{"dtype":"F32","shape":[4611686018427387904,2],"data_offsets":[0,0]}}`),
		"elements wrap":     header(`{"x":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}}`),
		// The header claims more bytes than the file has.
		"header past the end": append(header(`{}`)[:8], '{', '}'),
		"header over 2^63":    append(header(`{}`)[:8], '{', '}'),
		// Offsets that lie.
		"one offset":       append(header(`{"x":{"dtype":"U8","shape":[1],"data_offsets":[0]}}`), 0),
		"three offsets":    append(header(`{"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1,1]}}`), 0),
		"negative offset":  append(header(`{"x":{"dtype":"U8","shape":[1],"data_offsets":[-1,0]}}`), 0),
		"end before start": append(header(`{"x":{"dtype":"U8","shape":[0],"data_offsets":[1,0]}}`), 0),
		"offset past end":  append(header(`{"x":{"dtype":"U8","shape":[1],"data_offsets":[4,5]}}`), 0),
		"offset wraps":     append(header(`{"x":{"dtype":"U8","shape":[1],"data_offsets":[9223372036854775807,9223372036854775807]}}`), 0),
		"gap":              append(header(`{"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"y":{"dtype":"U8","shape":[1],"data_offsets":[2,3]}}`), 0, 0, 0),
		"trailing bytes":   append(header(`{"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}`), 0, 0),
		"same offsets":     append(header(`{"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"y":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}`), 0),
		"offsets not ints": append(header(`{"x":{"dtype":"U8","shape":[1],"data_offsets":["0","1"]}}`), 0),
		"no offsets":       append(header(`{"x":{"dtype":"U8","shape":[1]}}`), 0),
		// dtype and shape against the byte count.
		"dtype too wide":  append(header(`{"x":{"dtype":"BF16","shape":[1],"data_offsets":[0,1]}}`), 0),
		"shape too small": append(header(`{"x":{"dtype":"F8_E4M3","shape":[1],"data_offsets":[0,2]}}`), 0, 0),
		"shape not ints":  append(header(`{"x":{"dtype":"U8","shape":[1.5],"data_offsets":[0,1]}}`), 0),
		"no dtype":        append(header(`{"x":{"shape":[1],"data_offsets":[0,1]}}`), 0),
		"F4 unsupported":  append(header(`{"x":{"dtype":"F4","shape":[2],"data_offsets":[0,1]}}`), 0),
		// Headers that are not an object of tensors.
		"null header":  header("null"),
		"array header": header("[]"),
		"empty header": header(""),
		"entry string": header(`{"x":"F32"}`),
	}
	binary.LittleEndian.PutUint64(cases["huge header"], 1<<40)
	binary.LittleEndian.PutUint64(cases["header past the end"], 100)
	binary.LittleEndian.PutUint64(cases["header over 2^63"], 1<<63+2)
	for name, img := range cases {
		if _, err := Parse(bytes.NewReader(img), int64(len(img))); !errors.Is(err, ErrFormat) {
			t.Errorf("%s: err = %v, want ErrFormat", name, err)
		}
	}
	// The edge cases that are valid: an empty file, zero-size tensors sharing an offset.
	for name, img := range map[string][]byte{
		"no tensors": header(`{}`),
		"zero-size":  append(header(`{"a":{"dtype":"F32","shape":[0,3],"data_offsets":[0,0]},"b":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"c":{"dtype":"U8","shape":[0],"data_offsets":[1,1]}}`), 0),
		"scalar":     append(header(`{"s":{"dtype":"F8_E8M0","shape":[],"data_offsets":[0,1]}}`), 127),
		"metadata":   header(`{"__metadata__":{"format":"pt"}}`),
	} {
		if _, err := Parse(bytes.NewReader(img), int64(len(img))); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := Encode([]Tensor{{Name: "x", DType: F32, Shape: []int{2}, Data: make([]byte, 4)}}, nil); !errors.Is(err, ErrShape) {
		t.Errorf("Encode with short data: err = %v", err)
	}
	// Two negative dimensions multiply to a plausible count; the file would not read back.
	if _, err := Encode([]Tensor{{Name: "x", DType: F32, Shape: []int{-1, -1}, Data: make([]byte, 4)}}, nil); !errors.Is(err, ErrShape) {
		t.Errorf("Encode with negative dimensions: err = %v", err)
	}
	if _, err := NewTensor("x", I8, []int{1}, []float32{1}); !errors.Is(err, ErrDType) {
		t.Errorf("NewTensor I8: err = %v", err)
	}
}

func FuzzParse(f *testing.F) {
	img, _ := Encode([]Tensor{{Name: "w", DType: F32, Shape: []int{1}, Data: make([]byte, 4)}}, nil)
	f.Add(img)
	f.Add(header(`{"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		sf, err := Parse(bytes.NewReader(b), int64(len(b)))
		if err != nil {
			return
		}
		for _, n := range sf.Names() {
			info, _ := sf.Info(n)
			if info.DType.Float() {
				if _, _, err := sf.Float32(n); err != nil {
					t.Fatalf("validated tensor %q unreadable: %v", n, err)
				}
			}
		}
	})
}

// FuzzSafetensorsHeader feeds the header parser JSON headers (rather than whole random
// images, which rarely get past the length prefix) over a data section of the given
// length. A header that parses must describe tensors that read back without error, and
// dequantizing any of them may fail but must not panic.
func FuzzSafetensorsHeader(f *testing.F) {
	f.Add(`{"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, uint16(4))
	f.Add(`{"w.weight":{"dtype":"F8_E4M3","shape":[2,3],"data_offsets":[0,6]},"w.scale":{"dtype":"F8_E8M0","shape":[1,2],"data_offsets":[6,8]}}`, uint16(8))
	f.Add(`{"e.weight":{"dtype":"I8","shape":[2,2],"data_offsets":[0,4]},"e.weight_scale_inv":{"dtype":"F32","shape":[2,1],"data_offsets":[4,12]}}`, uint16(12))
	f.Add(`{"__metadata__":{"format":"pt"},"a":{"dtype":"BF16","shape":[0],"data_offsets":[0,0]}}`, uint16(0))
	f.Add(`{"x":{"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,0]}}`, uint16(0))
	q := &Quant{Method: "fp8", BlockSize: [2]int{2, 2}, ScaleFormat: ScaleUE8M0, ExpertDType: ExpertFP4}
	f.Fuzz(func(t *testing.T, js string, dataLen uint16) {
		img := append(header(js), make([]byte, dataLen)...)
		for i := range img[8+len(js):] {
			img[8+len(js)+i] = byte(i * 37)
		}
		sf, err := Parse(bytes.NewReader(img), int64(len(img)))
		if err != nil {
			if !errors.Is(err, ErrFormat) {
				t.Fatalf("error %v does not match ErrFormat", err)
			}
			return
		}
		c := &Checkpoint{where: map[string]*File{}}
		for _, n := range sf.Names() {
			c.where[n] = sf
		}
		for _, n := range sf.Names() {
			info, _ := sf.Info(n)
			if info.DType.Float() {
				if _, _, err := sf.Float32(n); err != nil {
					t.Fatalf("validated tensor %q unreadable: %v", n, err)
				}
			}
			shape := slices.Clone(info.Shape)
			if info.DType == I8 && len(shape) > 0 {
				shape[len(shape)-1] *= 2
			}
			c.Dequantize(n, q, shape...)
		}
	})
}
