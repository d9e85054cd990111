package ref

// widenBF16AVX2 is in bf16_amd64.s.
//
//go:noescape
func widenBF16AVX2(dst *float32, src *uint16, n int)

// widenBF16 sets dst[i] = FromBF16(src[i]) for i < len(src), on AVX2 where the CPU has it
// and len(src) is a multiple of 8.
func widenBF16(dst []float32, src []uint16) {
	if n := len(src); n > 0 && n%8 == 0 && hasAttnAVX2 {
		_ = dst[n-1]
		widenBF16AVX2(&dst[0], &src[0], n)
		return
	}
	for i, v := range src {
		dst[i] = FromBF16(v)
	}
}
