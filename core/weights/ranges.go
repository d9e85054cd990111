package weights

import (
	"fmt"
	"slices"
)

// Partial reads: a tensor-parallel rank reads only its slice of a tensor. Safetensors
// stores a tensor row-major, so rows [lo, hi) of dimension 0 are one contiguous range of
// bytes (one read), and columns [lo, hi) of a matrix are a range in every row (one read
// per row). Byte-sized element types only: every dtype this package knows is.

// ReadRows returns the stored bytes of rows [lo, hi) of tensor name's first dimension
// (each row the product of the other dimensions), in one read. A scalar, or a range
// outside [0, rows], is refused.
func (f *File) ReadRows(name string, lo, hi int) (TensorInfo, []byte, error) {
	t, ok := f.tensors[name]
	if !ok {
		return TensorInfo{}, nil, fmt.Errorf("%w: %q", ErrNotFound, name)
	}
	if len(t.Shape) == 0 {
		return t, nil, fmt.Errorf("tensor %q: %w: a scalar has no rows to read [%d, %d) of", name, ErrShape, lo, hi)
	}
	if lo < 0 || hi < lo || hi > t.Shape[0] {
		return t, nil, fmt.Errorf("tensor %q: %w: rows [%d, %d) outside its %d rows (shape %v)", name, ErrShape, lo, hi, t.Shape[0], t.Shape)
	}
	row := int64(t.DType.Size())
	for _, d := range t.Shape[1:] {
		row *= int64(d)
	}
	buf := make([]byte, int64(hi-lo)*row)
	if err := f.readAt(name, buf, int64(lo)*row); err != nil {
		return t, nil, err
	}
	return t, buf, nil
}

// ReadCols returns the stored bytes of columns [lo, hi) of matrix name ([rows, cols]),
// row after row ([rows, hi−lo]), one read per row. A tensor that is not 2-D, or a range
// outside [0, cols], is refused.
func (f *File) ReadCols(name string, lo, hi int) (TensorInfo, []byte, error) {
	t, ok := f.tensors[name]
	if !ok {
		return TensorInfo{}, nil, fmt.Errorf("%w: %q", ErrNotFound, name)
	}
	if len(t.Shape) != 2 {
		return t, nil, fmt.Errorf("tensor %q: %w: columns are read from a 2-D matrix, not shape %v", name, ErrShape, t.Shape)
	}
	rows, cols := t.Shape[0], t.Shape[1]
	if lo < 0 || hi < lo || hi > cols {
		return t, nil, fmt.Errorf("tensor %q: %w: columns [%d, %d) outside its %d columns (shape %v)", name, ErrShape, lo, hi, cols, t.Shape)
	}
	es := int64(t.DType.Size())
	width := int64(hi-lo) * es
	buf := make([]byte, int64(rows)*width)
	for r := range int64(rows) {
		if err := f.readAt(name, buf[r*width:(r+1)*width], (r*int64(cols)+int64(lo))*es); err != nil {
			return t, nil, err
		}
	}
	return t, buf, nil
}

// readAt reads len(buf) bytes at offset off of tensor name's data, counting them.
func (f *File) readAt(name string, buf []byte, off int64) error {
	if len(buf) == 0 {
		return nil // some readers (bytes.Reader) answer EOF to an empty read at the end
	}
	t := f.tensors[name]
	if _, err := f.r.ReadAt(buf, f.data+t.Offset+off); err != nil {
		return fmt.Errorf("read tensor %q: %w", name, err)
	}
	f.bytesRead.Add(int64(len(buf)))
	return nil
}

// BytesRead returns how many bytes of tensor data were read from f so far.
func (f *File) BytesRead() int64 { return f.bytesRead.Load() }

// Float32Rows reads rows [lo, hi) of tensor name, whose whole shape must be shape,
// widened to float32 ([hi−lo, shape[1:]...]).
func (c *Checkpoint) Float32Rows(name string, lo, hi int, shape ...int) ([]float32, error) {
	f, err := c.fileOf(name, shape)
	if err != nil {
		return nil, err
	}
	t, raw, err := f.ReadRows(name, lo, hi)
	if err != nil {
		return nil, err
	}
	return c.widen(t, raw)
}

// Float32Cols reads columns [lo, hi) of matrix name, whose whole shape must be shape
// ([rows, cols]), widened to float32 ([rows, hi−lo]).
func (c *Checkpoint) Float32Cols(name string, lo, hi int, shape ...int) ([]float32, error) {
	f, err := c.fileOf(name, shape)
	if err != nil {
		return nil, err
	}
	t, raw, err := f.ReadCols(name, lo, hi)
	if err != nil {
		return nil, err
	}
	return c.widen(t, raw)
}

// BytesRead returns how many bytes of tensor data were read from the checkpoint's files
// so far: what a rank's partial reads save shows here.
func (c *Checkpoint) BytesRead() int64 {
	var n int64
	for _, f := range c.files {
		n += f.BytesRead()
	}
	return n
}

func (c *Checkpoint) fileOf(name string, shape []int) (*File, error) {
	f, ok := c.where[name]
	if !ok {
		return nil, fmt.Errorf("%w: %q in %s", ErrNotFound, name, c.Dir)
	}
	if t, _ := f.Info(name); !slices.Equal(t.Shape, shape) {
		return nil, fmt.Errorf("tensor %q: %w: checkpoint has %v, model expects %v", name, ErrShape, t.Shape, shape)
	}
	return f, nil
}

func (c *Checkpoint) widen(t TensorInfo, raw []byte) ([]float32, error) {
	out := make([]float32, len(raw)/t.DType.Size())
	if err := DecodeFloat32(out, raw, t.DType); err != nil {
		return nil, fmt.Errorf("tensor %q: %w", t.Name, err)
	}
	c.progress.add(c, t.Name)
	return out, nil
}
