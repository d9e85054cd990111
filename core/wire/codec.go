package wire

import (
	"encoding/binary"
	"fmt"
	"unicode/utf8"

	"github.com/resin-llm/resin/core/internal/binenc"
)

// enc appends little-endian values to a byte slice.
type enc struct{ b []byte }

func (e *enc) u8(v uint8)   { e.b = append(e.b, v) }
func (e *enc) u16(v uint16) { e.b = binary.LittleEndian.AppendUint16(e.b, v) }
func (e *enc) u32(v uint32) { e.b = binary.LittleEndian.AppendUint32(e.b, v) }
func (e *enc) u64(v uint64) { e.b = binary.LittleEndian.AppendUint64(e.b, v) }
func (e *enc) i32(v int32)  { e.u32(uint32(v)) }
func (e *enc) str(s string) { e.u32(uint32(len(s))); e.b = append(e.b, s...) }

func (e *enc) i32s(s []int32)   { e.b = binenc.AppendI32s(e.b, s) }
func (e *enc) f32s(s []float32) { e.b = binenc.AppendF32s(e.b, s) }

// dec reads little-endian values, remembering the first error: after it every read
// returns zero values, and Err says what was wrong. At names the message being decoded.
type dec struct{ binenc.Reader }

func newDec(payload []byte, at string) dec {
	return dec{binenc.Reader{B: payload, At: at, Short: func(at string, n, off, left int) error {
		return malformed(at, "need %d bytes at offset %d, %d left", n, off, left)
	}}}
}

func malformed(at, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s", ErrMalformed, at, fmt.Sprintf(format, args...))
}

func (d *dec) fail(format string, args ...any) {
	if d.Err == nil {
		d.Err = malformed(d.At, format, args...)
	}
}

func (d *dec) u8() uint8 {
	if b := d.Take(1); b != nil {
		return b[0]
	}
	return 0
}

func (d *dec) i32() int32 { return int32(d.U32()) }

// count reads a u32 element count and checks that n elements of size bytes each fit in
// what is left, so a forged count never makes the decoder allocate.
func (d *dec) count(what string, size int) int {
	n := d.U32()
	if d.Err == nil && int64(n)*int64(size) > int64(d.Left()) {
		d.fail("%s: %d entries of %d bytes do not fit in the %d bytes left", what, n, size, d.Left())
		return 0
	}
	return int(n)
}

func (d *dec) str(what string) string {
	n := d.count(what, 1)
	b := d.Take(n)
	if d.Err == nil && !utf8.Valid(b) {
		d.fail("%s is not UTF-8", what)
	}
	return string(b)
}

// end fails unless every byte was read.
func (d *dec) end() error {
	if d.Err == nil && d.Left() != 0 {
		d.fail("%d trailing bytes", d.Left())
	}
	return d.Err
}
