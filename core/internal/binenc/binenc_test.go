package binenc

import (
	"errors"
	"fmt"
	"slices"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	var b []byte
	b = AppendI32s(b, []int32{-1, 7})
	b = AppendF32s(b, []float32{0.5, -2})
	b = AppendU64s(b, []uint64{1 << 40})
	if len(b) != 4*2+4*2+8 || b[0] != 0xff || b[8] != 0 || b[11] != 0x3f {
		t.Fatalf("encoding % x", b)
	}
	r := &Reader{B: b}
	i32 := r.I32s(nil, 2)
	f32 := r.F32s(nil, 2)
	u64 := r.U64s(nil, 1)
	if !slices.Equal(i32, []int32{-1, 7}) || !slices.Equal(f32, []float32{0.5, -2}) || !slices.Equal(u64, []uint64{1 << 40}) || r.Left() != 0 || r.Err != nil {
		t.Fatalf("read %v %v %v, %d left, %v", i32, f32, u64, r.Left(), r.Err)
	}
}

var errShort = errors.New("short")

func TestShortReadKeepsTheFirstError(t *testing.T) {
	r := &Reader{B: []byte{1, 2, 3, 4, 5, 6}, At: "msg", Short: func(at string, n, off, left int) error {
		return fmt.Errorf("%w: %s: %d at %d, %d left", errShort, at, n, off, left)
	}}
	if v := r.U32(); v != 0x04030201 {
		t.Fatalf("U32 = %#x", v)
	}
	if v := r.U64(); v != 0 || r.Err == nil || r.Err.Error() != "short: msg: 8 at 4, 2 left" {
		t.Fatalf("U64 past the end = %d, %v", v, r.Err)
	}
	first := r.Err
	if v := r.U16(); v != 0 || r.Err != first {
		t.Fatalf("a read after the error = %d, %v", v, r.Err)
	}
	if s := U32s(r, []uint32{9}, 1); len(s) != 0 {
		t.Fatalf("U32s after the error = %v", s)
	}
}
