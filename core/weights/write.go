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
	ts := append([]Tensor(nil), tensors...)
	sort.Slice(ts, func(i, j int) bool { return ts[i].Name < ts[j].Name })
	hdr := make(map[string]any, len(ts)+1)
	if len(metadata) > 0 {
		hdr["__metadata__"] = metadata
	}
	var off int64
	for i, t := range ts {
		if t.Name == "" || t.Name == "__metadata__" {
			return nil, fmt.Errorf("%w: invalid tensor name %q", ErrFormat, t.Name)
		}
		if i > 0 && ts[i-1].Name == t.Name {
			return nil, fmt.Errorf("%w: tensor %q written twice", ErrFormat, t.Name)
		}
		if t.DType.Size() == 0 {
			return nil, fmt.Errorf("%w: tensor %q has unknown dtype %q", ErrFormat, t.Name, t.DType)
		}
		for _, d := range t.Shape {
			if d < 0 {
				return nil, fmt.Errorf("tensor %q: %w: negative dimension in %v", t.Name, ErrShape, t.Shape)
			}
		}
		info := TensorInfo{Shape: t.Shape}
		if want := int64(info.Elements()) * int64(t.DType.Size()); want != int64(len(t.Data)) {
			return nil, fmt.Errorf("tensor %q: %w: shape %v of %s needs %d bytes, got %d", t.Name, ErrShape, t.Shape, t.DType, want, len(t.Data))
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
		return nil, fmt.Errorf("encode safetensors header: %w", err)
	}
	for len(js)%8 != 0 {
		js = append(js, ' ')
	}
	out := make([]byte, 8, 8+len(js)+int(off))
	binary.LittleEndian.PutUint64(out, uint64(len(js)))
	out = append(out, js...)
	for _, t := range ts {
		out = append(out, t.Data...)
	}
	return out, nil
}

// WriteFile writes tensors to path as one safetensors file, atomically (a temporary file
// renamed into place).
func WriteFile(path string, tensors []Tensor, metadata map[string]string) error {
	img, err := Encode(tensors, metadata)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".safetensors-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if _, err := tmp.Write(img); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return fmt.Errorf("write %s: %w", path, err)
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
