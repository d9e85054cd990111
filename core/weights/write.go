package weights

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
)

// Tensor is one tensor to write: its HF name, element type, shape and little-endian bytes.
type Tensor struct {
	Name  string
	DType DType
	Shape []int
	Data  []byte
}

// NewTensor converts float32 values to dt (F32, F16 or BF16) and checks they fill shape.
func NewTensor(name string, dt DType, shape []int, values []float32) (Tensor, error) {
	n := 1
	for _, d := range shape {
		n *= d
	}
	if n != len(values) {
		return Tensor{}, fmt.Errorf("tensor %q: %w: shape %v holds %d values, got %d", name, ErrShape, shape, n, len(values))
	}
	data, err := EncodeFloat32(values, dt)
	if err != nil {
		return Tensor{}, fmt.Errorf("tensor %q: %w", name, err)
	}
	return Tensor{Name: name, DType: dt, Shape: append([]int(nil), shape...), Data: data}, nil
}

// Encode returns the safetensors image of tensors (sorted by name, 8-byte aligned data as
// the reference writer does) with optional metadata.
func Encode(tensors []Tensor, metadata map[string]string) ([]byte, error) {
	ts, hdr, size, err := encodeHeader(tensors, metadata)
	if err != nil {
		return nil, err
	}
	out := make([]byte, 0, int64(len(hdr))+size)
	out = append(out, hdr...)
	for _, t := range ts {
		out = append(out, t.Data...)
	}
	return out, nil
}

// encodeHeader checks tensors and returns them sorted by name, the file's header (the 8-byte
// length and the padded JSON) and the bytes of data that follow it.
func encodeHeader(tensors []Tensor, metadata map[string]string) ([]Tensor, []byte, int64, error) {
	ts := append([]Tensor(nil), tensors...)
	sort.Slice(ts, func(i, j int) bool { return ts[i].Name < ts[j].Name })
	hdr := make(map[string]any, len(ts)+1)
	if len(metadata) > 0 {
		hdr["__metadata__"] = metadata
	}
	var off int64
	for i, t := range ts {
		if t.Name == "" || t.Name == "__metadata__" {
			return nil, nil, 0, fmt.Errorf("%w: invalid tensor name %q", ErrFormat, t.Name)
		}
		if i > 0 && ts[i-1].Name == t.Name {
			return nil, nil, 0, fmt.Errorf("%w: tensor %q written twice", ErrFormat, t.Name)
		}
		if t.DType.Size() == 0 {
			return nil, nil, 0, fmt.Errorf("%w: tensor %q has unknown dtype %q", ErrFormat, t.Name, t.DType)
		}
		for _, d := range t.Shape {
			if d < 0 {
				return nil, nil, 0, fmt.Errorf("tensor %q: %w: negative dimension in %v", t.Name, ErrShape, t.Shape)
			}
		}
		info := TensorInfo{Shape: t.Shape}
		if want := int64(info.Elements()) * int64(t.DType.Size()); want != int64(len(t.Data)) {
			return nil, nil, 0, fmt.Errorf("tensor %q: %w: shape %v of %s needs %d bytes, got %d", t.Name, ErrShape, t.Shape, t.DType, want, len(t.Data))
		}
		shape := t.Shape
		if shape == nil {
			shape = []int{}
		}
		hdr[t.Name] = headerEntry{DType: string(t.DType), Shape: shape, DataOffsets: []int64{off, off + int64(len(t.Data))}}
		off += int64(len(t.Data))
	}
	js, err := json.Marshal(hdr)
	if err != nil {
		return nil, nil, 0, fmt.Errorf("encode safetensors header: %w", err)
	}
	for len(js)%8 != 0 {
		js = append(js, ' ')
	}
	out := make([]byte, 8, 8+len(js))
	binary.LittleEndian.PutUint64(out, uint64(len(js)))
	return ts, append(out, js...), off, nil
}

// WriteFile writes tensors to path as one safetensors file, atomically: the data goes to
// a temporary file beside path (the tensors' bytes written as they are, not copied into
// one image), which is synced and renamed into place, so path never holds a partial file.
// The file is readable by everyone (mode 0644).
func WriteFile(path string, tensors []Tensor, metadata map[string]string) error {
	ts, hdr, _, err := encodeHeader(tensors, metadata)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".safetensors-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	fail := func(err error) error {
		tmp.Close()
		os.Remove(tmp.Name())
		return fmt.Errorf("write %s: %w", path, err)
	}
	if _, err := tmp.Write(hdr); err != nil {
		return fail(err)
	}
	for _, t := range ts {
		if _, err := tmp.Write(t.Data); err != nil {
			return fail(err)
		}
	}
	if err := tmp.Chmod(0o644); err != nil {
		return fail(err)
	}
	if err := tmp.Sync(); err != nil {
		return fail(err)
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
