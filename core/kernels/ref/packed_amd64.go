package ref

// hasPackedAVX512 and hasPackedAVX2 say which kernels of packed_amd64.s the FP8 and FP4
// products run: the AVX-512 dot products where the CPU has AVX-512F, else the AVX2 ones
// (AVX2, FMA and F16C); the widening into scratch (batches) runs on AVX2 either way.
var (
	hasPackedAVX2   = hasAttnAVX2 && cpuid1ECX()&(1<<29) != 0
	hasPackedAVX512 = hasSkinnyAVX512 && hasPackedAVX2
)

// cpuid1ECX is in packed_amd64.s.
func cpuid1ECX() uint32

// The kernels are in packed_amd64.s.

//go:noescape
func fp8DotAVX512(x *float32, w *uint8, s *float32, nb, bc int) float32

//go:noescape
func fp8DotAVX2(x *float32, w *uint8, s *float32, nb, bc int) float32

//go:noescape
func fp8WidenAVX2(dst *float32, w *uint8, s *float32, nb, bc int)

//go:noescape
func fp4DotAVX512(xd *float32, w *uint8, s *float32, ng int, lut *float32) float32

//go:noescape
func fp4DotAVX2(xd *float32, w *uint8, s *float32, ng int, lut *float32) float32

//go:noescape
func fp4WidenAVX2(dst *float32, w *uint8, s *float32, ng int, lut *float32)
