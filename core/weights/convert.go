package weights

import (
	"encoding/binary"
	"fmt"
	"math"
)

// DecodeFloat32 converts raw little-endian elements of type dt into dst, which must hold
// exactly len(raw)/dt.Size() values.
func DecodeFloat32(dst []float32, raw []byte, dt DType) error {
	sz := dt.Size()
	if !dt.Float() || sz == 0 {
		return fmt.Errorf("%w: cannot convert %s to float32", ErrDType, dt)
	}
	if len(raw) != len(dst)*sz {
		return fmt.Errorf("%w: %d bytes of %s for %d values", ErrShape, len(raw), dt, len(dst))
	}
	switch dt {
	case F32:
		for i := range dst {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
		}
	case F64:
		for i := range dst {
			dst[i] = float32(math.Float64frombits(binary.LittleEndian.Uint64(raw[8*i:])))
		}
	case BF16:
		for i := range dst {
			dst[i] = BF16ToFloat32(binary.LittleEndian.Uint16(raw[2*i:]))
		}
	case F16:
		for i := range dst {
			dst[i] = F16ToFloat32(binary.LittleEndian.Uint16(raw[2*i:]))
		}
	case F8E4M3:
		for i := range dst {
			dst[i] = e4m3Table[raw[i]]
		}
	case F8E5M2:
		for i := range dst {
			dst[i] = F8E5M2ToFloat32(raw[i])
		}
	case F8E8M0:
		for i := range dst {
			dst[i] = E8M0ToFloat32(raw[i])
		}
	}
	return nil
}

// EncodeFloat32 converts src to little-endian elements of dt (F32, F16 or BF16; rounding
// to nearest even) and returns the bytes.
func EncodeFloat32(src []float32, dt DType) ([]byte, error) {
	switch dt {
	case F32:
		out := make([]byte, 4*len(src))
		for i, v := range src {
			binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(v))
		}
		return out, nil
	case BF16:
		out := make([]byte, 2*len(src))
		for i, v := range src {
			binary.LittleEndian.PutUint16(out[2*i:], Float32ToBF16(v))
		}
		return out, nil
	case F16:
		out := make([]byte, 2*len(src))
		for i, v := range src {
			binary.LittleEndian.PutUint16(out[2*i:], Float32ToF16(v))
		}
		return out, nil
	}
	return nil, fmt.Errorf("%w: cannot encode float32 as %s (want F32, F16 or BF16)", ErrDType, dt)
}

// Round returns v as it reads back after a store in dt (F32, F16 or BF16): tests use it
// to compare a model that loaded a narrowed checkpoint with one that kept float32.
func Round(v float32, dt DType) float32 {
	switch dt {
	case BF16:
		return BF16ToFloat32(Float32ToBF16(v))
	case F16:
		return F16ToFloat32(Float32ToF16(v))
	}
	return v
}
