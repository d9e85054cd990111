package ref

// sgemmAVX2 and sgemmAVX512 are the micro-kernels in sgemm_amd64.s.
//
//go:noescape
func sgemmAVX2(kc int, a, b, c *float32, ldc int, acc int)

//go:noescape
func sgemmAVX512(kc int, a, b, c *float32, ldc int, acc int)

// gemmMicro returns the tile (MR rows, NR columns) of the micro-kernel this CPU runs for
// ownGemm: 14×32 with AVX-512, 6×16 with AVX2 and FMA; 0, 0 without (gonum runs the GEMMs).
func gemmMicro() (mr, nr int) {
	switch {
	case !hasAttnAVX2:
		return 0, 0
	case hasSkinnyAVX512:
		return 14, 32
	}
	return 6, 16
}

// micro runs the micro-kernel of tile height mr (one gemmMicro returned) on a kc-step
// panel pair: c's mr×NR tile, ldc apart, stored (acc = 0) or added to.
func micro(mr, kc int, a, b, c *float32, ldc, acc int) {
	if mr == 14 {
		sgemmAVX512(kc, a, b, c, ldc, acc)
		return
	}
	sgemmAVX2(kc, a, b, c, ldc, acc)
}

// packT8AVX2 is in sgemm_amd64.s.
//
//go:noescape
func packT8AVX2(dst *float32, width int, src *float32, ld int, kc int)

// packT8 sets dst[l*width + i] = src[i*ld + l] for i < 8, l < kc8 (a multiple of 8) and
// returns true, on a CPU with AVX2; it returns false, doing nothing, on others.
func packT8(dst []float32, width int, src []float32, ld, kc8 int) bool {
	if !hasAttnAVX2 {
		return false
	}
	if kc8 > 0 {
		_, _ = dst[(kc8-1)*width+7], src[7*ld+kc8-1]
		packT8AVX2(&dst[0], width, &src[0], ld, kc8)
	}
	return true
}

// packT8BF16AVX2 is in sgemm_amd64.s.
//
//go:noescape
func packT8BF16AVX2(dst *float32, width int, src *uint16, ld int, kc int)

// packT8BF16 is packT8 on bfloat16 rows, widened to float32.
func packT8BF16(dst []float32, width int, src []uint16, ld, kc8 int) bool {
	if !hasAttnAVX2 {
		return false
	}
	if kc8 > 0 {
		_, _ = dst[(kc8-1)*width+7], src[7*ld+kc8-1]
		packT8BF16AVX2(&dst[0], width, &src[0], ld, kc8)
	}
	return true
}

// packT6AVX2 is in sgemm_amd64.s.
//
//go:noescape
func packT6AVX2(dst *float32, src *float32, ld int, kc int)

// packT6 sets dst[l*6 + i] = src[i*ld + l] for i < 6, l < kc8 (a multiple of 8) and
// returns true, on a CPU with AVX2; it returns false, doing nothing, on others.
func packT6(dst []float32, src []float32, ld, kc8 int) bool {
	if !hasAttnAVX2 {
		return false
	}
	if kc8 > 0 {
		_, _ = dst[kc8*6-1], src[5*ld+kc8-1]
		packT6AVX2(&dst[0], &src[0], ld, kc8)
	}
	return true
}
