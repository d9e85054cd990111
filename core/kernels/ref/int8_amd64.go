package ref

import "golang.org/x/sys/cpu"

// hasInt8VNNI says whether MatMulTInt8 runs its AVX-512 VNNI kernels (int8_amd64.s).
var hasInt8VNNI = hasSkinnyAVX512 && cpu.X86.HasAVX512VNNI && cpu.X86.HasAVX512BW

// hasInt8AVX2 says whether MatMulTInt8 runs its AVX2 kernel where there is no VNNI.
var hasInt8AVX2 = hasAttnAVX2

// q8Dot1VNNI and q8Dot4VNNI are in int8_amd64.s.
//
//go:noescape
func q8Dot1VNNI(out *float32, xq *int8, xs *float32, xc *int32, w *uint8, ws *float32, nb int)

//go:noescape
func q8Dot4VNNI(out *float32, ldo int, xq *int8, xs *float32, xc *int32, w *uint8, ws *float32, nb int)

//go:noescape
func q8QuantAVX512(xq *int8, xs *float32, xc *int32, x *float32, nb int, step int)

//go:noescape
func q8QuantAVX2(xq *int8, xs *float32, xc *int32, x *float32, nb int, step int)

//go:noescape
func q8DotAVX2(out *float32, xq *int8, xs *float32, xstep int, w *uint8, ws *float32, nb int)

//go:noescape
func q8Dot4AVX2(out *float32, ldo int, xq *int8, xs *float32, w *uint8, ws *float32, nb int)
