#include "textflag.h"

// func widenBF16AVX2(dst *float32, src *uint16, n int)
//
// dst[i] = the float32 of the bfloat16 src[i] (its bits as the upper half) for i < n, n a
// positive multiple of 8: 32 at a time (then 8), zero-extended to 32 bits and shifted up.
// The n values after src's are prefetched along, a line a step: skinnyBF16 widens a
// weight in consecutive runs between products over the last one, and the stream of its
// rows restarts at each run, too late for the hardware's prefetchers (PREFETCH512's note).
TEXT ·widenBF16AVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	LEAQ (SI)(CX*2), R8 // the next run

loop32:
	CMPQ       CX, $32
	JB         loop8
	PREFETCHT1 (R8)
	VPMOVZXWD  (SI), Y0
	VPMOVZXWD  16(SI), Y1
	VPMOVZXWD  32(SI), Y2
	VPMOVZXWD  48(SI), Y3
	VPSLLD     $16, Y0, Y0
	VPSLLD     $16, Y1, Y1
	VPSLLD     $16, Y2, Y2
	VPSLLD     $16, Y3, Y3
	VMOVUPS    Y0, (DI)
	VMOVUPS    Y1, 32(DI)
	VMOVUPS    Y2, 64(DI)
	VMOVUPS    Y3, 96(DI)
	ADDQ       $64, SI
	ADDQ       $64, R8
	ADDQ       $128, DI
	SUBQ       $32, CX
	JMP        loop32

loop8:
	TESTQ     CX, CX
	JZ        done
	VPMOVZXWD (SI), Y0
	VPSLLD    $16, Y0, Y0
	VMOVUPS   Y0, (DI)
	ADDQ      $16, SI
	ADDQ      $32, DI
	SUBQ      $8, CX
	JMP       loop8

done:
	VZEROUPPER
	RET
