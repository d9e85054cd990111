//go:build !amd64

package ref

// hasInt8VNNI is false where there is no vector form (only amd64 has one).
var hasInt8VNNI = false

// hasInt8AVX2 is false where there is no vector form.
var hasInt8AVX2 = false

func q8Dot1VNNI(out *float32, xq *int8, xs *float32, xc *int32, w *uint8, ws *float32, nb int) {
	panic("ref: q8Dot1VNNI without a vector form")
}

func q8Dot4VNNI(out *float32, ldo int, xq *int8, xs *float32, xc *int32, w *uint8, ws *float32, nb int) {
	panic("ref: q8Dot4VNNI without a vector form")
}

func q8QuantAVX512(xq *int8, xs *float32, xc *int32, x *float32, nb int, step int) {
	panic("ref: q8QuantAVX512 without a vector form")
}

func q8QuantAVX2(xq *int8, xs *float32, xc *int32, x *float32, nb int, step int) {
	panic("ref: q8QuantAVX2 without a vector form")
}

func q8DotAVX2(out *float32, xq *int8, xs *float32, xstep int, w *uint8, ws *float32, nb int) {
	panic("ref: q8DotAVX2 without a vector form")
}

func q8Dot4AVX2(out *float32, ldo int, xq *int8, xs *float32, w *uint8, ws *float32, nb int) {
	panic("ref: q8Dot4AVX2 without a vector form")
}
