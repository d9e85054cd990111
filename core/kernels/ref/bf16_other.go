//go:build !amd64

package ref

// widenBF16 sets dst[i] = FromBF16(src[i]) for i < len(src).
func widenBF16(dst []float32, src []uint16) {
	for i, v := range src {
		dst[i] = FromBF16(v)
	}
}
