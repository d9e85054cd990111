#include "textflag.h"

// func widenBF16AVX2(dst *float32, src *uint16, n int)
//
// dst[i] = the float32 of the bfloat16 src[i] (its bits as the upper half) for i < n, n a
// positive multiple of 8: 8 at a time, zero-extended to 32 bits and shifted up.
TEXT ·widenBF16AVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX

loop:
	VPMOVZXWD (SI), Y0
	VPSLLD    $16, Y0, Y0
	VMOVUPS   Y0, (DI)
	ADDQ      $16, SI
	ADDQ      $32, DI
	SUBQ      $8, CX
	JNZ       loop
	VZEROUPPER
	RET
