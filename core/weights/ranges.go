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

// DequantizeRows is Dequantize of rows [lo, hi) of the matrix name ([out, in], shape its
// whole logical shape) alone: an unquantized one by Float32Rows, an F8_E4M3 or FP4 one by
// reading only the block rows that hold the range and their scales' rows, then trimming.
// A ModelOpt weight is dequantized whole and cut; a stacked [..., out, in] tensor is
// refused (ErrShape).
func (c *Checkpoint) DequantizeRows(name string, q *Quant, lo, hi int, shape ...int) ([]float32, error) {
	return c.dequantizePart(name, q, false, lo, hi, shape)
}

// DequantizeCols is DequantizeRows for columns [lo, hi) (one read per row of the weight
// and of its scales, the column range widened to whole scale blocks, then trimmed).
func (c *Checkpoint) DequantizeCols(name string, q *Quant, lo, hi int, shape ...int) ([]float32, error) {
	return c.dequantizePart(name, q, true, lo, hi, shape)
}

func (c *Checkpoint) dequantizePart(name string, q *Quant, cols bool, lo, hi int, shape []int) ([]float32, error) {
	info, ok := c.Info(name)
	if !ok {
		return nil, fmt.Errorf("%w: %q in %s", ErrNotFound, name, c.Dir)
	}
	if len(shape) != 2 {
		return nil, fmt.Errorf("tensor %q: %w: rows or columns of a matrix [out, in], model expects %v", name, ErrShape, shape)
	}
	rows, width := shape[0], shape[1]
	n, what := rows, "rows"
	if cols {
		n, what = width, "columns"
	}
	if lo < 0 || hi < lo || hi > n {
		return nil, fmt.Errorf("tensor %q: %w: %s [%d, %d) outside its %d (shape %v)", name, ErrShape, what, lo, hi, n, shape)
	}
	scaleName, scaled := c.ScaleName(name)
	_, notConverted := q.NotConvertedBy(name)
	var br, bc, pack int // a scale's block, and values per stored byte
	switch {
	case !scaled && unquantized(info.DType):
		if cols {
			return c.Float32Cols(name, lo, hi, shape...)
		}
		return c.Float32Rows(name, lo, hi, shape...)
	case q != nil && q.Method != "modelopt" && !notConverted && scaled && info.DType == F8E4M3:
		br, bc, pack = q.BlockSize[0], q.BlockSize[1], 1
	case q != nil && q.Method != "modelopt" && !notConverted && scaled && (info.DType == I8 || info.DType == U8) && q.ExpertDType == ExpertFP4 && width%2 == 0:
		br, bc, pack = 1, FP4Group, 2
	default:
		v, err := c.Dequantize(name, q, shape...)
		if err != nil {
			return nil, err
		}
		if cols {
			out := make([]float32, 0, rows*(hi-lo))
			for r := range rows {
				out = append(out, v[r*width+lo:r*width+hi]...)
			}
			return out, nil
		}
		return v[lo*width : hi*width], nil
	}
	if !slices.Equal(info.Shape, []int{rows, width / pack}) {
		return nil, fmt.Errorf("tensor %q: %w: checkpoint has %v of %s, model expects %v", name, ErrShape, info.Shape, info.DType, shape)
	}
	sinfo, _ := c.Info(scaleName)
	if want := []int{ceilDiv(rows, br), ceilDiv(width, bc)}; !slices.Equal(sinfo.Shape, want) {
		return nil, fmt.Errorf("tensor %q: %w: scale %q is %v, want %v (one per %d×%d block of %v)", name, ErrShape, scaleName, sinfo.Shape, want, br, bc, shape)
	}
	if hi == lo {
		return []float32{}, nil
	}
	f, sf := c.where[name], c.where[scaleName]
	var raw, sraw []byte
	var err error
	var subRows, subCols, trim int // the block-aligned sub-matrix read, and where the range starts in it
	if !cols {
		r0, r1 := lo/br*br, min(ceilDiv(hi, br)*br, rows)
		subRows, subCols, trim = r1-r0, width, lo-r0
		if _, raw, err = f.ReadRows(name, r0, r1); err == nil {
			_, sraw, err = sf.ReadRows(scaleName, r0/br, ceilDiv(r1, br))
		}
	} else {
		c0, c1 := lo/bc*bc, min(ceilDiv(hi, bc)*bc, width)
		subRows, subCols, trim = rows, c1-c0, lo-c0
		if _, raw, err = f.ReadCols(name, c0/pack, c1/pack); err == nil {
			_, sraw, err = sf.ReadCols(scaleName, c0/bc, ceilDiv(c1, bc))
		}
	}
	if err != nil {
		return nil, err
	}
	sdt := sinfo.DType
	if sdt == U8 && q.ScaleFormat == ScaleUE8M0 {
		sdt = F8E8M0
	}
	if !sdt.Float() {
		return nil, fmt.Errorf("scale %q: %w: %s scales (want F32, BF16 or F8_E8M0)", scaleName, ErrDType, sinfo.DType)
	}
	scale := make([]float32, len(sraw)/sdt.Size())
	if err := DecodeFloat32(scale, sraw, sdt); err != nil {
		return nil, fmt.Errorf("scale %q: %w", scaleName, err)
	}
	sub := make([]float32, subRows*subCols)
	if subRows*subCols > 0 {
		if pack == 1 {
			err = DequantFP8(sub, raw, scale, subRows, subCols, br, bc)
		} else {
			err = DequantFP4(sub, raw, scale, subRows, subCols, bc)
		}
		if err != nil {
			return nil, fmt.Errorf("tensor %q: %w", name, err)
		}
	}
	c.progress.add(c, name, scaleName)
	if !cols {
		return sub[trim*width : (trim+hi-lo)*width], nil
	}
	out := make([]float32, 0, rows*(hi-lo))
	for r := range rows {
		out = append(out, sub[r*subCols+trim:r*subCols+trim+hi-lo]...)
	}
	return out, nil
}
