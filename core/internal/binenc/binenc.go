// Package binenc holds the little-endian primitives Resin's binary encodings share: the
// BatchPlan encoding (core/engine) and the runner protocol (core/wire).
package binenc

import (
	"encoding/binary"
	"math"
)

var le = binary.LittleEndian

// AppendI32s appends s, 4 bytes each.
func AppendI32s(dst []byte, s []int32) []byte {
	for _, v := range s {
		dst = le.AppendUint32(dst, uint32(v))
	}
	return dst
}

// AppendF32s appends s as IEEE 754 bits, 4 bytes each.
func AppendF32s(dst []byte, s []float32) []byte {
	for _, v := range s {
		dst = le.AppendUint32(dst, math.Float32bits(v))
	}
	return dst
}

// AppendU64s appends s, 8 bytes each.
func AppendU64s(dst []byte, s []uint64) []byte {
	for _, v := range s {
		dst = le.AppendUint64(dst, v)
	}
	return dst
}

// Reader reads little-endian values from B at Off, remembering the first error: after
// it every read returns zero values and empty slices.
type Reader struct {
	B   []byte
	Off int
	Err error
	// At names what is read, for Short.
	At string
	// Short makes the error of a read of n bytes at offset off with left bytes left.
	Short func(at string, n, off, left int) error
}

// Left returns the number of bytes not read yet.
func (r *Reader) Left() int { return len(r.B) - r.Off }

// Take returns the next n bytes, or nil (setting Err) when fewer are left.
func (r *Reader) Take(n int) []byte {
	if r.Err != nil {
		return nil
	}
	if n < 0 || n > r.Left() {
		r.Err = r.Short(r.At, n, r.Off, r.Left())
		return nil
	}
	out := r.B[r.Off : r.Off+n]
	r.Off += n
	return out
}

// U16 reads a uint16 (0 after an error).
func (r *Reader) U16() uint16 {
	if b := r.Take(2); b != nil {
		return le.Uint16(b)
	}
	return 0
}

// U32 reads a uint32 (0 after an error).
func (r *Reader) U32() uint32 {
	if b := r.Take(4); b != nil {
		return le.Uint32(b)
	}
	return 0
}

// U64 reads a uint64 (0 after an error).
func (r *Reader) U64() uint64 {
	if b := r.Take(8); b != nil {
		return le.Uint64(b)
	}
	return 0
}

// I32s reads n values into dst[:0] and returns it.
func (r *Reader) I32s(dst []int32, n int) []int32 {
	b := r.Take(4 * n)
	dst = dst[:0]
	for i := 0; b != nil && i < n; i++ {
		dst = append(dst, int32(le.Uint32(b[4*i:])))
	}
	return dst
}

// U32s reads n values into dst[:0] and returns it.
func U32s[T ~uint32](r *Reader, dst []T, n int) []T {
	b := r.Take(4 * n)
	dst = dst[:0]
	for i := 0; b != nil && i < n; i++ {
		dst = append(dst, T(le.Uint32(b[4*i:])))
	}
	return dst
}

// F32s reads n values into dst[:0] and returns it.
func (r *Reader) F32s(dst []float32, n int) []float32 {
	b := r.Take(4 * n)
	dst = dst[:0]
	for i := 0; b != nil && i < n; i++ {
		dst = append(dst, math.Float32frombits(le.Uint32(b[4*i:])))
	}
	return dst
}

// U64s reads n values into dst[:0] and returns it.
func (r *Reader) U64s(dst []uint64, n int) []uint64 {
	b := r.Take(8 * n)
	dst = dst[:0]
	for i := 0; b != nil && i < n; i++ {
		dst = append(dst, le.Uint64(b[8*i:]))
	}
	return dst
}

// I64s reads n values into dst[:0] and returns it.
func (r *Reader) I64s(dst []int64, n int) []int64 {
	b := r.Take(8 * n)
	dst = dst[:0]
	for i := 0; b != nil && i < n; i++ {
		dst = append(dst, int64(le.Uint64(b[8*i:])))
	}
	return dst
}
