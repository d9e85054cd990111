package weights

import (
	"math"
	"testing"
)

func TestF16RoundTripEveryValue(t *testing.T) {
	for h := 0; h < 1<<16; h++ {
		f := F16ToFloat32(uint16(h))
		if f != f { // NaN
			if back := Float32ToF16(f); back&0x7c00 != 0x7c00 || back&0x3ff == 0 {
				t.Fatalf("NaN %#04x came back as %#04x", h, back)
			}
			continue
		}
		if back := Float32ToF16(f); back != uint16(h) {
			t.Fatalf("half %#04x -> %g -> %#04x", h, f, back)
		}
	}
}

func TestF16Rounding(t *testing.T) {
	cases := []struct {
		in   float32
		want uint16
	}{
		{1, 0x3c00},
		{-2, 0xc000},
		{65504, 0x7bff},
		{65520, 0x7c00},                             // rounds up to Inf
		{1e9, 0x7c00},                               // overflow
		{float32(math.Ldexp(1, -24)), 0x0001},       // smallest subnormal
		{float32(math.Ldexp(1, -26)), 0x0000},       // underflow to zero
		{1 + float32(math.Ldexp(1, -11)), 0x3c00},   // tie to even (down)
		{1 + 3*float32(math.Ldexp(1, -11)), 0x3c02}, // tie to even (up)
		{float32(math.Ldexp(3, -26)), 0x0001},       // 0.75 ulp subnormal rounds up
	}
	for _, c := range cases {
		if got := Float32ToF16(c.in); got != c.want {
			t.Errorf("Float32ToF16(%g) = %#04x, want %#04x", c.in, got, c.want)
		}
	}
}

func TestBF16(t *testing.T) {
	for h := 0; h < 1<<16; h++ {
		f := BF16ToFloat32(uint16(h))
		if f != f {
			continue
		}
		if back := Float32ToBF16(f); back != uint16(h) {
			t.Fatalf("bf16 %#04x -> %g -> %#04x", h, f, back)
		}
	}
	cases := []struct {
		in   float32
		want uint16
	}{
		{1, 0x3f80},
		{math.Float32frombits(0x3f808000), 0x3f80}, // tie, even stays
		{math.Float32frombits(0x3f818000), 0x3f82}, // tie, odd rounds up
		{math.Float32frombits(0x3f808001), 0x3f81}, // above the tie
	}
	for _, c := range cases {
		if got := Float32ToBF16(c.in); got != c.want {
			t.Errorf("Float32ToBF16(%#x) = %#04x, want %#04x", math.Float32bits(c.in), got, c.want)
		}
	}
	if nan := Float32ToBF16(float32(math.NaN())); BF16ToFloat32(nan) == BF16ToFloat32(nan) {
		t.Errorf("NaN became %#04x", nan)
	}
}

func TestF8(t *testing.T) {
	cases := []struct {
		in   uint8
		want float32
	}{
		{0x38, 1}, {0xb8, -1}, {0x7e, 448}, {0x01, float32(math.Ldexp(1, -9))}, {0x00, 0},
	}
	for _, c := range cases {
		if got := F8E4M3ToFloat32(c.in); got != c.want {
			t.Errorf("F8E4M3ToFloat32(%#02x) = %g, want %g", c.in, got, c.want)
		}
	}
	if v := F8E4M3ToFloat32(0x7f); v == v {
		t.Errorf("0x7f should be NaN, got %g", v)
	}
	if got := F8E5M2ToFloat32(0x3c); got != 1 {
		t.Errorf("F8E5M2ToFloat32(0x3c) = %g, want 1", got)
	}
}

func TestParseDType(t *testing.T) {
	for in, want := range map[string]DType{"bfloat16": BF16, "f16": F16, "F32": F32} {
		if got, err := ParseDType(in); err != nil || got != want {
			t.Errorf("ParseDType(%q) = %v, %v", in, got, err)
		}
	}
	if _, err := ParseDType("int4"); err == nil {
		t.Error("ParseDType(int4) succeeded")
	}
}

func TestF8E4M3EdgeValues(t *testing.T) {
	negZero := float32(math.Copysign(0, -1))
	cases := []struct {
		in   uint8
		want float32
	}{
		{0x00, 0},            // +0
		{0x80, negZero},      // -0
		{0x01, 0.001953125},  // smallest subnormal, 2^-9
		{0x07, 0.013671875},  // largest subnormal, 7·2^-9
		{0x87, -0.013671875}, // negative subnormal
		{0x08, 0.015625},     // smallest normal, 2^-6
		{0x38, 1},            // exponent bias 7
		{0x3c, 1.5},          // mantissa 4/8
		{0x44, 3},            // 1.5·2
		{0x77, 240},          // 1.875·2^7
		{0x78, 256},          // exponent 15 is finite in e4m3fn
		{0x7e, 448},          // max, 1.75·2^8
		{0xfe, -448},         // min
		{0xb8, -1},
	}
	for _, c := range cases {
		got := F8E4M3ToFloat32(c.in)
		if got != c.want || math.Signbit(float64(got)) != math.Signbit(float64(c.want)) {
			t.Errorf("F8E4M3ToFloat32(%#02x) = %g, want %g", c.in, got, c.want)
		}
		if lut := e4m3Table[c.in]; math.Float32bits(lut) != math.Float32bits(got) {
			t.Errorf("e4m3Table[%#02x] = %g, want %g", c.in, lut, got)
		}
	}
	for _, nan := range []uint8{0x7f, 0xff} {
		if v := F8E4M3ToFloat32(nan); v == v {
			t.Errorf("F8E4M3ToFloat32(%#02x) = %g, want NaN", nan, v)
		}
	}
}

func TestE8M0(t *testing.T) {
	cases := []struct {
		in   uint8
		want float32
	}{
		{127, 1},
		{128, 2},
		{126, 0.5},
		{130, 8},
		{120, 0.0078125},                   // 2^-7
		{254, float32(math.Ldexp(1, 127))}, // largest
		{1, float32(math.Ldexp(1, -126))},  // smallest normal float32
		{0, float32(math.Ldexp(1, -127))},  // 2^-127, a float32 subnormal
	}
	for _, c := range cases {
		if got := E8M0ToFloat32(c.in); got != c.want {
			t.Errorf("E8M0ToFloat32(%d) = %g, want %g", c.in, got, c.want)
		}
	}
	if v := E8M0ToFloat32(255); v == v {
		t.Errorf("E8M0ToFloat32(255) = %g, want NaN", v)
	}
	dst := make([]float32, 3)
	if err := DecodeFloat32(dst, []byte{127, 131, 125}, F8E8M0); err != nil || dst[0] != 1 || dst[1] != 16 || dst[2] != 0.25 {
		t.Errorf("DecodeFloat32(F8_E8M0) = %v, %v, want [1 16 0.25]", dst, err)
	}
	if dt, err := ParseDType("float8_e8m0fnu"); err != nil || dt != F8E8M0 {
		t.Errorf("ParseDType(float8_e8m0fnu) = %v, %v", dt, err)
	}
}

func TestE2M1(t *testing.T) {
	want := []float32{0, 0.5, 1, 1.5, 2, 3, 4, 6, 0, -0.5, -1, -1.5, -2, -3, -4, -6}
	for code, w := range want {
		got := E2M1ToFloat32(uint8(code) | 0xf0) // the high nibble is ignored
		if got != w || math.Signbit(float64(got)) != (code >= 8) {
			t.Errorf("E2M1ToFloat32(%#x) = %g, want %s%g", code, got, map[bool]string{true: "-", false: ""}[code == 8], w)
		}
	}
}
