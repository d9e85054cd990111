package weights

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"sync/atomic"
)

// Errors that callers test with errors.Is.
var (
	ErrFormat   = errors.New("weights: malformed file")
	ErrNotFound = errors.New("weights: tensor not found")
	ErrShape    = errors.New("weights: shape mismatch")
	ErrDType    = errors.New("weights: unsupported dtype")
)

// maxHeader bounds the JSON header a reader accepts (the reference implementation uses
// 100 MB).
const maxHeader = 100 << 20

// TensorInfo describes one tensor of a safetensors file: its element type, its shape and
// where its bytes lie, counted from the start of the data section.
type TensorInfo struct {
	Name   string
	DType  DType
	Shape  []int
	Offset int64
	Size   int64
}

// Elements returns the number of elements of t (1 for a scalar).
func (t TensorInfo) Elements() int {
	n := 1
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// File is an open safetensors file. Tensors are read on demand with ReadAt, so opening a
// large checkpoint costs only its header.
type File struct {
	path     string
	r        io.ReaderAt
	closer   io.Closer
	data     int64 // offset of the data section
	tensors  map[string]TensorInfo
	names    []string
	Metadata map[string]string

	bytesRead atomic.Int64 // tensor data read so far (BytesRead)
}

type headerEntry struct {
	DType       string  `json:"dtype"`
	Shape       []int   `json:"shape"`
	DataOffsets []int64 `json:"data_offsets"`
}

// OpenFile opens a safetensors file and validates its header: known dtypes, offsets inside
// the file, sizes that match shapes, no overlapping tensors.
func OpenFile(path string) (*File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open safetensors: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("open safetensors %s: %w", path, err)
	}
	sf, err := parse(f, st.Size())
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("open safetensors %s: %w", path, err)
	}
	sf.path, sf.closer = path, f
	return sf, nil
}

// Parse reads a safetensors image from r, whose total length is size.
func Parse(r io.ReaderAt, size int64) (*File, error) {
	return parse(r, size)
}

func parse(r io.ReaderAt, size int64) (*File, error) {
	var lenBuf [8]byte
	if size < 8 {
		return nil, fmt.Errorf("%w: %d bytes, shorter than the 8-byte header length", ErrFormat, size)
	}
	if _, err := r.ReadAt(lenBuf[:], 0); err != nil {
		return nil, fmt.Errorf("%w: read header length: %v", ErrFormat, err)
	}
	n := binary.LittleEndian.Uint64(lenBuf[:])
	if n > maxHeader || int64(n) > size-8 {
		return nil, fmt.Errorf("%w: header length %d does not fit a %d-byte file", ErrFormat, n, size)
	}
	hdr := make([]byte, n)
	if _, err := r.ReadAt(hdr, 8); err != nil {
		return nil, fmt.Errorf("%w: read header: %v", ErrFormat, err)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(hdr, &raw); err != nil || raw == nil {
		return nil, fmt.Errorf("%w: header is not a JSON object: %v", ErrFormat, err)
	}
	sf := &File{r: r, data: 8 + int64(n), tensors: make(map[string]TensorInfo, len(raw))}
	dataLen := size - sf.data
	for name, msg := range raw {
		if name == "__metadata__" {
			if err := json.Unmarshal(msg, &sf.Metadata); err != nil {
				return nil, fmt.Errorf("%w: __metadata__ must map strings to strings: %v", ErrFormat, err)
			}
			continue
		}
		var e headerEntry
		if err := json.Unmarshal(msg, &e); err != nil {
			return nil, fmt.Errorf("%w: tensor %q: %v", ErrFormat, name, err)
		}
		dt := DType(e.DType)
		if dt.Size() == 0 {
			return nil, fmt.Errorf("%w: tensor %q has unknown dtype %q", ErrFormat, name, e.DType)
		}
		if len(e.DataOffsets) != 2 || e.DataOffsets[0] < 0 || e.DataOffsets[1] < e.DataOffsets[0] || e.DataOffsets[1] > dataLen {
			return nil, fmt.Errorf("%w: tensor %q has data_offsets %v outside the %d-byte data section", ErrFormat, name, e.DataOffsets, dataLen)
		}
		t := TensorInfo{Name: name, DType: dt, Shape: e.Shape, Offset: e.DataOffsets[0], Size: e.DataOffsets[1] - e.DataOffsets[0]}
		// The byte count is built dimension by dimension so that a huge shape cannot wrap
		// around to the size the offsets give (and later make a negative-length slice).
		need := int64(dt.Size())
		if slices.Contains(e.Shape, 0) {
			need = 0
		}
		for _, d := range e.Shape {
			if d < 0 {
				return nil, fmt.Errorf("%w: tensor %q has negative dimension in %v", ErrFormat, name, e.Shape)
			}
			if need > 0 && need > dataLen/int64(d) {
				return nil, fmt.Errorf("%w: tensor %q: shape %v of %s is larger than the %d-byte data section", ErrFormat, name, e.Shape, dt, dataLen)
			}
			need *= int64(d)
		}
		if need != t.Size {
			return nil, fmt.Errorf("%w: tensor %q: shape %v of %s needs %d bytes, offsets give %d", ErrFormat, name, e.Shape, dt, need, t.Size)
		}
		sf.tensors[name] = t
		sf.names = append(sf.names, name)
	}
	sort.Strings(sf.names)
	// The tensors must tile the data section exactly, as the reference reader requires
	// (safetensors' Metadata::validate and its MetadataIncompleteBuffer check): no overlap,
	// no gap, no bytes after the last one.
	byOff := make([]TensorInfo, 0, len(sf.tensors))
	for _, t := range sf.tensors {
		byOff = append(byOff, t)
	}
	sort.Slice(byOff, func(i, j int) bool {
		a, b := byOff[i], byOff[j]
		return a.Offset < b.Offset || a.Offset == b.Offset && (a.Size < b.Size || a.Size == b.Size && a.Name < b.Name)
	})
	var end int64
	for i, t := range byOff {
		switch {
		case t.Offset < end:
			return nil, fmt.Errorf("%w: tensors %q and %q overlap", ErrFormat, byOff[i-1].Name, t.Name)
		case t.Offset > end:
			return nil, fmt.Errorf("%w: %d unused bytes before tensor %q (data_offsets %d, previous tensor ends at %d)", ErrFormat, t.Offset-end, t.Name, t.Offset, end)
		}
		end = t.Offset + t.Size
	}
	if end != dataLen {
		return nil, fmt.Errorf("%w: the tensors end at byte %d of a %d-byte data section (the file is longer than its header says)", ErrFormat, end, dataLen)
	}
	return sf, nil
}

// Close releases the file.
func (f *File) Close() error {
	if f.closer == nil {
		return nil
	}
	return f.closer.Close()
}

// Names returns the tensor names in sorted order.
func (f *File) Names() []string { return f.names }

// Info returns the description of a tensor.
func (f *File) Info(name string) (TensorInfo, bool) {
	t, ok := f.tensors[name]
	return t, ok
}

// ReadRaw returns the stored bytes of a tensor.
func (f *File) ReadRaw(name string) (TensorInfo, []byte, error) {
	t, ok := f.tensors[name]
	if !ok {
		return TensorInfo{}, nil, fmt.Errorf("%w: %q", ErrNotFound, name)
	}
	buf := make([]byte, t.Size)
	if err := f.readAt(name, buf, 0); err != nil {
		return t, nil, err
	}
	return t, buf, nil
}

// Float32 reads a tensor of any float dtype and returns it widened to float32 with its
// shape.
func (f *File) Float32(name string) ([]float32, []int, error) {
	t, raw, err := f.ReadRaw(name)
	if err != nil {
		return nil, nil, err
	}
	out := make([]float32, t.Elements())
	if err := DecodeFloat32(out, raw, t.DType); err != nil {
		return nil, nil, fmt.Errorf("tensor %q: %w", name, err)
	}
	return out, t.Shape, nil
}
