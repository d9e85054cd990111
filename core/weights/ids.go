package weights

import (
	"encoding/binary"
	"fmt"
)

// DecodeIDs reads a little-endian I32 or I64 tensor (token ids, as reference scripts
// write them) into int32s.
func DecodeIDs(dt DType, raw []byte) ([]int32, error) {
	var ids []int32
	switch dt {
	case I32:
		for i := 0; i+4 <= len(raw); i += 4 {
			ids = append(ids, int32(binary.LittleEndian.Uint32(raw[i:])))
		}
	case I64:
		for i := 0; i+8 <= len(raw); i += 8 {
			ids = append(ids, int32(binary.LittleEndian.Uint64(raw[i:])))
		}
	default:
		return nil, fmt.Errorf("%w: token ids of dtype %s, want I32 or I64", ErrFormat, dt)
	}
	return ids, nil
}
