package weights

import (
	"fmt"
	"math"
)

// DType is a safetensors element type, spelled as in the file header ("BF16", "F32", ...).
type DType string

// The element types safetensors files use.
const (
	F64    DType = "F64"
	F32    DType = "F32"
	F16    DType = "F16"
	BF16   DType = "BF16"
	F8E4M3 DType = "F8_E4M3"
	F8E5M2 DType = "F8_E5M2"
	F8E8M0 DType = "F8_E8M0" // exponent-only scales (torch.float8_e8m0fnu), "ue8m0"
	I64    DType = "I64"
	I32    DType = "I32"
	I16    DType = "I16"
	I8     DType = "I8"
	U8     DType = "U8"
	Bool   DType = "BOOL"
)

// Size returns the bytes per element of d, or 0 for an unknown type.
func (d DType) Size() int {
	switch d {
	case F64, I64:
		return 8
	case F32, I32:
		return 4
	case F16, BF16, I16:
		return 2
	case F8E4M3, F8E5M2, F8E8M0, I8, U8, Bool:
		return 1
	}
	return 0
}

// Float reports whether d is a floating-point type that converts to float32.
func (d DType) Float() bool {
	switch d {
	case F64, F32, F16, BF16, F8E4M3, F8E5M2, F8E8M0:
		return true
	}
	return false
}

// ParseDType returns the DType for a name such as "bf16", "float16" or "F32" (the spellings
// of safetensors headers and of config.json's torch_dtype).
func ParseDType(s string) (DType, error) {
	switch s {
	case "F32", "f32", "float32", "float":
		return F32, nil
	case "F16", "f16", "float16", "half", "fp16":
		return F16, nil
	case "BF16", "bf16", "bfloat16":
		return BF16, nil
	case "F64", "f64", "float64", "double":
		return F64, nil
	case "F8_E4M3", "float8_e4m3fn", "fp8", "e4m3":
		return F8E4M3, nil
	case "F8_E5M2", "float8_e5m2", "e5m2":
		return F8E5M2, nil
	case "F8_E8M0", "float8_e8m0fnu", "ue8m0":
		return F8E8M0, nil
	case "I64", "I32", "I16", "I8", "U8", "BOOL":
		return DType(s), nil
	}
	return "", fmt.Errorf("%w: unknown dtype %q (want f32, f16 or bf16)", ErrFormat, s)
}

// BF16ToFloat32 widens a bfloat16 bit pattern to float32 (exact).
func BF16ToFloat32(h uint16) float32 {
	return math.Float32frombits(uint32(h) << 16)
}

// Float32ToBF16 rounds f to the nearest bfloat16, ties to even; NaN stays NaN.
func Float32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 { // NaN: keep it quiet and non-zero
		return uint16(b>>16) | 0x0040
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

// F16ToFloat32 widens an IEEE half-precision bit pattern to float32 (exact, subnormals
// included).
func F16ToFloat32(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	man := uint32(h) & 0x3ff
	switch {
	case exp == 0x1f: // Inf or NaN
		return math.Float32frombits(sign | 0x7f800000 | man<<13)
	case exp == 0:
		if man == 0 {
			return math.Float32frombits(sign)
		}
		// subnormal: man * 2^-24
		v := float32(man) * (1.0 / (1 << 24))
		if sign != 0 {
			v = -v
		}
		return v
	}
	return math.Float32frombits(sign | (exp+112)<<23 | man<<13)
}

// Float32ToF16 rounds f to the nearest IEEE half, ties to even; values beyond the half
// range become ±Inf and NaN stays NaN.
func Float32ToF16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int32(b>>23) & 0xff
	man := b & 0x7fffff
	if exp == 0xff {
		if man != 0 {
			return sign | 0x7e00
		}
		return sign | 0x7c00
	}
	e := exp - 127 + 15
	if e >= 0x1f {
		return sign | 0x7c00
	}
	if e <= 0 {
		// subnormal half (or zero): shift the implicit-one mantissa into place and round.
		if e < -10 {
			return sign
		}
		m := man | 0x800000
		shift := uint32(14 - e)
		half := uint32(1) << (shift - 1)
		r := m >> shift
		rem := m & (1<<shift - 1)
		if rem > half || (rem == half && r&1 == 1) {
			r++
		}
		return sign | uint16(r)
	}
	r := uint32(e)<<10 | man>>13
	rem := man & 0x1fff
	if rem > 0x1000 || (rem == 0x1000 && r&1 == 1) {
		r++ // may carry into the exponent, which is the correct rounding (up to Inf)
	}
	return sign | uint16(r)
}

// F8E4M3ToFloat32 widens an OCP float8 e4m3fn byte (no infinities, 0x7f/0xff are NaN).
func F8E4M3ToFloat32(v uint8) float32 {
	sign := float32(1)
	if v&0x80 != 0 {
		sign = -1
	}
	exp := int(v>>3) & 0xf
	man := float32(v & 7)
	if exp == 0xf && v&7 == 7 {
		return float32(math.NaN())
	}
	if exp == 0 {
		return sign * man / 8 * float32(math.Ldexp(1, -6))
	}
	return sign * (1 + man/8) * float32(math.Ldexp(1, exp-7))
}

// E8M0ToFloat32 widens an unsigned exponent-only float8 byte (OCP MX "E8M0",
// torch.float8_e8m0fnu, the "ue8m0" scales of DeepSeek-V3.2/V4 checkpoints): 2^(v-127), and
// 0xff is NaN. There is no zero and no sign; every other value is exact in float32
// (0x00 is the subnormal 2^-127).
func E8M0ToFloat32(v uint8) float32 {
	if v == 0xff {
		return float32(math.NaN())
	}
	if v == 0 {
		return math.Float32frombits(1 << 22) // 2^-127, below the normal range
	}
	return math.Float32frombits(uint32(v) << 23)
}

// e2m1Values are the 16 FP4 e2m1 codes (bit 3 sign, bits 2-1 exponent with bias 1, bit 0
// mantissa), as transformers 5.23.0 lists them (integrations/finegrained_fp8.py:1119,
// Fp8Dequantize._FP4_E2M1_LUT).
var e2m1Values = [16]float32{0, 0.5, 1, 1.5, 2, 3, 4, 6, float32(math.Copysign(0, -1)), -0.5, -1, -1.5, -2, -3, -4, -6}

// E2M1ToFloat32 widens the FP4 e2m1 code in the low four bits of v (the high bits are
// ignored): {0, 0.5, 1, 1.5, 2, 3, 4, 6} with bit 3 as the sign. The format has no NaN
// or infinity.
func E2M1ToFloat32(v uint8) float32 { return e2m1Values[v&0xf] }

// F8E5M2ToFloat32 widens an IEEE-like float8 e5m2 byte (the top byte of a half).
func F8E5M2ToFloat32(v uint8) float32 {
	return F16ToFloat32(uint16(v) << 8)
}
