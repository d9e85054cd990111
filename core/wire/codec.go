package wire

import (
	"encoding/binary"
	"fmt"
	"math"
	"unicode/utf8"
)

// enc appends little-endian values to a byte slice.
type enc struct{ b []byte }

func (e *enc) u8(v uint8)   { e.b = append(e.b, v) }
func (e *enc) u16(v uint16) { e.b = binary.LittleEndian.AppendUint16(e.b, v) }
func (e *enc) u32(v uint32) { e.b = binary.LittleEndian.AppendUint32(e.b, v) }
func (e *enc) u64(v uint64) { e.b = binary.LittleEndian.AppendUint64(e.b, v) }
func (e *enc) i32(v int32)  { e.u32(uint32(v)) }
func (e *enc) str(s string) { e.u32(uint32(len(s))); e.b = append(e.b, s...) }

func (e *enc) i32s(s []int32) {
	for _, v := range s {
		e.b = binary.LittleEndian.AppendUint32(e.b, uint32(v))
	}
}

func (e *enc) f32s(s []float32) {
	for _, v := range s {
		e.b = binary.LittleEndian.AppendUint32(e.b, math.Float32bits(v))
	}
}

func (e *enc) u64s(s []uint64) {
	for _, v := range s {
		e.b = binary.LittleEndian.AppendUint64(e.b, v)
	}
}

// dec reads little-endian values, remembering the first shortfall: after an error every
// read returns zero values, and err says what was missing.
type dec struct {
	b   []byte
	off int
	err error
	at  string // the message being decoded, for errors
}

func (d *dec) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s: %s", ErrMalformed, d.at, fmt.Sprintf(format, args...))
	}
}

func (d *dec) take(n int) []byte {
	if d.err != nil {
		return nil
	}
	if n < 0 || n > len(d.b)-d.off {
		d.fail("need %d bytes at offset %d, %d left", n, d.off, len(d.b)-d.off)
		return nil
	}
	out := d.b[d.off : d.off+n]
	d.off += n
	return out
}

func (d *dec) left() int { return len(d.b) - d.off }

func (d *dec) u8() uint8 {
	if b := d.take(1); b != nil {
		return b[0]
	}
	return 0
}

func (d *dec) u16() uint16 {
	if b := d.take(2); b != nil {
		return binary.LittleEndian.Uint16(b)
	}
	return 0
}

func (d *dec) u32() uint32 {
	if b := d.take(4); b != nil {
		return binary.LittleEndian.Uint32(b)
	}
	return 0
}

func (d *dec) u64() uint64 {
	if b := d.take(8); b != nil {
		return binary.LittleEndian.Uint64(b)
	}
	return 0
}

func (d *dec) i32() int32 { return int32(d.u32()) }

// count reads a u32 element count and checks that n elements of size bytes each fit in
// what is left, so a forged count never makes the decoder allocate.
func (d *dec) count(what string, size int) int {
	n := d.u32()
	if d.err == nil && int64(n)*int64(size) > int64(d.left()) {
		d.fail("%s: %d entries of %d bytes do not fit in the %d bytes left", what, n, size, d.left())
		return 0
	}
	return int(n)
}

func (d *dec) str(what string) string {
	n := d.count(what, 1)
	b := d.take(n)
	if d.err == nil && !utf8.Valid(b) {
		d.fail("%s is not UTF-8", what)
	}
	return string(b)
}

func (d *dec) i32s(dst []int32, n int) []int32 {
	b := d.take(4 * n)
	dst = dst[:0]
	for i := 0; b != nil && i < n; i++ {
		dst = append(dst, int32(binary.LittleEndian.Uint32(b[4*i:])))
	}
	return dst
}

func (d *dec) f32s(dst []float32, n int) []float32 {
	b := d.take(4 * n)
	dst = dst[:0]
	for i := 0; b != nil && i < n; i++ {
		dst = append(dst, math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])))
	}
	return dst
}

func (d *dec) u64s(dst []uint64, n int) []uint64 {
	b := d.take(8 * n)
	dst = dst[:0]
	for i := 0; b != nil && i < n; i++ {
		dst = append(dst, binary.LittleEndian.Uint64(b[8*i:]))
	}
	return dst
}

// end fails unless every byte was read.
func (d *dec) end() error {
	if d.err == nil && d.left() != 0 {
		d.fail("%d trailing bytes", d.left())
	}
	return d.err
}
