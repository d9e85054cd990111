//go:build !amd64

package ref

// hasPackedAVX512 and hasPackedAVX2 are false where there is no vector form (only amd64
// has one): the FP8 and FP4 products run their scalar loops.
var (
	hasPackedAVX512 = false
	hasPackedAVX2   = false
)

func fp8DotAVX512(x *float32, w *uint8, s *float32, nb, bc int) float32 {
	panic("ref: fp8DotAVX512 without a vector form")
}

func fp8DotAVX2(x *float32, w *uint8, s *float32, nb, bc int) float32 {
	panic("ref: fp8DotAVX2 without a vector form")
}

func fp8WidenAVX2(dst *float32, w *uint8, s *float32, nb, bc int) {
	panic("ref: fp8WidenAVX2 without a vector form")
}

func fp4DotAVX512(xd *float32, w *uint8, s *float32, ng int, lut *float32) float32 {
	panic("ref: fp4DotAVX512 without a vector form")
}

func fp4DotAVX2(xd *float32, w *uint8, s *float32, ng int, lut *float32) float32 {
	panic("ref: fp4DotAVX2 without a vector form")
}

func fp4WidenAVX2(dst *float32, w *uint8, s *float32, ng int, lut *float32) {
	panic("ref: fp4WidenAVX2 without a vector form")
}
