#include "textflag.h"

// The micro-kernels of the packed GEMM (sgemm.go). Each computes one MR×NR tile of c:
//
//	c[i*ldc + j] = Σ_l a[l*MR + i]·b[l*NR + j]           (acc = 0)
//	c[i*ldc + j] = c[i*ldc + j] + Σ_l a[l*MR + i]·b[l*NR + j]   (acc ≠ 0)
//
// for i < MR, j < NR, l < kc (kc ≥ 1), a and b packed panels (sgemm.go's packA, packB):
// a's MR values of step l, then b's NR. The sum runs over l in order, one FMA a step into
// one accumulator per element of the tile, so an element's bits depend on its own row of a
// and column of b, and on kc, and on nothing else. A row of the tile is two registers of b
// (loaded once a step) times a broadcast value of a.

// GEMM_ARGS loads the arguments: CX = kc, SI = a, DI = b, R8 = c, R9 = ldc in bytes,
// R10 = acc.
#define GEMM_ARGS \
	MOVQ kc+0(FP), CX; \
	MOVQ a+8(FP), SI; \
	MOVQ b+16(FP), DI; \
	MOVQ c+24(FP), R8; \
	MOVQ ldc+32(FP), R9; \
	SHLQ $2, R9; \
	MOVQ acc+40(FP), R10

// STEP_S is row i of a step in 8-lane registers: a[l*MR + i] (at byte off of SI) broadcast
// into BC, times b's two registers Y12, Y13, into the row's accumulators A0, A1.
#define STEP_S(off, BC, A0, A1) \
	VBROADCASTSS off(SI), BC; \
	VFMADD231PS  BC, Y12, A0; \
	VFMADD231PS  BC, Y13, A1

// STEP4_S(aoff, boff) is one step of sgemmAVX2: b's two registers at boff(DI), a's 6
// values from aoff(SI), into Y0–Y11.
#define STEP4_S(aoff, boff) \
	VMOVUPS boff(DI), Y12; \
	VMOVUPS (boff+32)(DI), Y13; \
	STEP_S(aoff, Y14, Y0, Y1); \
	STEP_S(aoff+4, Y15, Y2, Y3); \
	STEP_S(aoff+8, Y14, Y4, Y5); \
	STEP_S(aoff+12, Y15, Y6, Y7); \
	STEP_S(aoff+16, Y14, Y8, Y9); \
	STEP_S(aoff+20, Y15, Y10, Y11)

// ADD_S adds a row's accumulators A0, A1 to c's row at R8 and steps R8 to the next row.
#define ADD_S(A0, A1) \
	VADDPS  (R8), A0, A0; \
	VADDPS  32(R8), A1, A1; \
	VMOVUPS A0, (R8); \
	VMOVUPS A1, 32(R8); \
	ADDQ    R9, R8

// STORE_S stores a row's accumulators A0, A1 at R8 and steps R8 to the next row.
#define STORE_S(A0, A1) \
	VMOVUPS A0, (R8); \
	VMOVUPS A1, 32(R8); \
	ADDQ    R9, R8

// STEP_Z, ADD_Z and STORE_Z are STEP_S, ADD_S and STORE_S in 16-lane registers, b's two
// in Z28, Z29.
#define STEP_Z(off, BC, A0, A1) \
	VBROADCASTSS off(SI), BC; \
	VFMADD231PS  BC, Z28, A0; \
	VFMADD231PS  BC, Z29, A1

#define ADD_Z(A0, A1) \
	VADDPS  (R8), A0, A0; \
	VADDPS  64(R8), A1, A1; \
	VMOVUPS A0, (R8); \
	VMOVUPS A1, 64(R8); \
	ADDQ    R9, R8

#define STORE_Z(A0, A1) \
	VMOVUPS A0, (R8); \
	VMOVUPS A1, 64(R8); \
	ADDQ    R9, R8

// func sgemmAVX2(kc int, a, b, c *float32, ldc int, acc int)
//
// A 6×16 tile (MR = 6, NR = 16) in Y0–Y11, b in Y12, Y13, a's broadcasts in Y14, Y15.
TEXT ·sgemmAVX2(SB), NOSPLIT, $0-48
	GEMM_ARGS
	VXORPS Y0, Y0, Y0; VXORPS Y1, Y1, Y1; VXORPS Y2, Y2, Y2; VXORPS Y3, Y3, Y3
	VXORPS Y4, Y4, Y4; VXORPS Y5, Y5, Y5; VXORPS Y6, Y6, Y6; VXORPS Y7, Y7, Y7
	VXORPS Y8, Y8, Y8; VXORPS Y9, Y9, Y9; VXORPS Y10, Y10, Y10; VXORPS Y11, Y11, Y11

	CMPQ CX, $4
	JB   sgemmavx2_step

sgemmavx2_step4: // four steps a pass, b's panel prefetched 8 steps ahead into L1
	PREFETCHT0 512(DI)
	STEP4_S(0, 0)
	STEP4_S(24, 64)
	PREFETCHT0 640(DI)
	STEP4_S(48, 128)
	STEP4_S(72, 192)
	ADDQ $96, SI
	ADDQ $256, DI
	SUBQ $4, CX
	CMPQ CX, $4
	JAE  sgemmavx2_step4
	TESTQ CX, CX
	JZ   sgemmavx2_done

sgemmavx2_step:
	STEP4_S(0, 0)
	ADDQ $24, SI
	ADDQ $64, DI
	DECQ CX
	JNZ  sgemmavx2_step

sgemmavx2_done:

	TESTQ R10, R10
	JZ    sgemmavx2_store
	ADD_S(Y0, Y1)
	ADD_S(Y2, Y3)
	ADD_S(Y4, Y5)
	ADD_S(Y6, Y7)
	ADD_S(Y8, Y9)
	ADD_S(Y10, Y11)
	VZEROUPPER
	RET

sgemmavx2_store:
	STORE_S(Y0, Y1)
	STORE_S(Y2, Y3)
	STORE_S(Y4, Y5)
	STORE_S(Y6, Y7)
	STORE_S(Y8, Y9)
	STORE_S(Y10, Y11)
	VZEROUPPER
	RET

// func sgemmAVX512(kc int, a, b, c *float32, ldc int, acc int)
//
// A 14×32 tile (MR = 14, NR = 32) in Z0–Z27, b in Z28, Z29, a's broadcasts in Z30, Z31.
TEXT ·sgemmAVX512(SB), NOSPLIT, $0-48
	GEMM_ARGS
	VPXORD Z0, Z0, Z0; VPXORD Z1, Z1, Z1; VPXORD Z2, Z2, Z2; VPXORD Z3, Z3, Z3
	VPXORD Z4, Z4, Z4; VPXORD Z5, Z5, Z5; VPXORD Z6, Z6, Z6; VPXORD Z7, Z7, Z7
	VPXORD Z8, Z8, Z8; VPXORD Z9, Z9, Z9; VPXORD Z10, Z10, Z10; VPXORD Z11, Z11, Z11
	VPXORD Z12, Z12, Z12; VPXORD Z13, Z13, Z13; VPXORD Z14, Z14, Z14; VPXORD Z15, Z15, Z15
	VPXORD Z16, Z16, Z16; VPXORD Z17, Z17, Z17; VPXORD Z18, Z18, Z18; VPXORD Z19, Z19, Z19
	VPXORD Z20, Z20, Z20; VPXORD Z21, Z21, Z21; VPXORD Z22, Z22, Z22; VPXORD Z23, Z23, Z23
	VPXORD Z24, Z24, Z24; VPXORD Z25, Z25, Z25; VPXORD Z26, Z26, Z26; VPXORD Z27, Z27, Z27

sgemmavx512_step:
	VMOVUPS (DI), Z28
	VMOVUPS 64(DI), Z29
	STEP_Z(0, Z30, Z0, Z1)
	STEP_Z(4, Z31, Z2, Z3)
	STEP_Z(8, Z30, Z4, Z5)
	STEP_Z(12, Z31, Z6, Z7)
	STEP_Z(16, Z30, Z8, Z9)
	STEP_Z(20, Z31, Z10, Z11)
	STEP_Z(24, Z30, Z12, Z13)
	STEP_Z(28, Z31, Z14, Z15)
	STEP_Z(32, Z30, Z16, Z17)
	STEP_Z(36, Z31, Z18, Z19)
	STEP_Z(40, Z30, Z20, Z21)
	STEP_Z(44, Z31, Z22, Z23)
	STEP_Z(48, Z30, Z24, Z25)
	STEP_Z(52, Z31, Z26, Z27)
	ADDQ $56, SI
	ADDQ $128, DI
	DECQ CX
	JNZ  sgemmavx512_step

	TESTQ R10, R10
	JZ    sgemmavx512_store
	ADD_Z(Z0, Z1)
	ADD_Z(Z2, Z3)
	ADD_Z(Z4, Z5)
	ADD_Z(Z6, Z7)
	ADD_Z(Z8, Z9)
	ADD_Z(Z10, Z11)
	ADD_Z(Z12, Z13)
	ADD_Z(Z14, Z15)
	ADD_Z(Z16, Z17)
	ADD_Z(Z18, Z19)
	ADD_Z(Z20, Z21)
	ADD_Z(Z22, Z23)
	ADD_Z(Z24, Z25)
	ADD_Z(Z26, Z27)
	VZEROUPPER
	RET

sgemmavx512_store:
	STORE_Z(Z0, Z1)
	STORE_Z(Z2, Z3)
	STORE_Z(Z4, Z5)
	STORE_Z(Z6, Z7)
	STORE_Z(Z8, Z9)
	STORE_Z(Z10, Z11)
	STORE_Z(Z12, Z13)
	STORE_Z(Z14, Z15)
	STORE_Z(Z16, Z17)
	STORE_Z(Z18, Z19)
	STORE_Z(Z20, Z21)
	STORE_Z(Z22, Z23)
	STORE_Z(Z24, Z25)
	STORE_Z(Z26, Z27)
	VZEROUPPER
	RET

// func packT8AVX2(dst *float32, width int, src *float32, ld int, kc int)
//
// dst[l*width + i] = src[i*ld + l] for i < 8, l < kc (kc a positive multiple of 8): 8 rows
// of src transposed in 8×8 blocks (unpack pairs, shuffle quads, swap 128-bit halves) into
// 8 consecutive values of dst's rows, width apart.
TEXT ·packT8AVX2(SB), NOSPLIT, $0-40
	MOVQ dst+0(FP), DI
	MOVQ width+8(FP), DX
	SHLQ $2, DX
	MOVQ src+16(FP), SI
	MOVQ ld+24(FP), BX
	SHLQ $2, BX
	MOVQ kc+32(FP), CX
	SHRQ $3, CX
	LEAQ (BX)(BX*2), R11 // 3·ld
	LEAQ (SI)(BX*4), R12 // row 4
	LEAQ (DX)(DX*2), R13 // 3·width

packt8_step:
	VMOVUPS (SI), Y0
	VMOVUPS (SI)(BX*1), Y1
	VMOVUPS (SI)(BX*2), Y2
	VMOVUPS (SI)(R11*1), Y3
	VMOVUPS (R12), Y4
	VMOVUPS (R12)(BX*1), Y5
	VMOVUPS (R12)(BX*2), Y6
	VMOVUPS (R12)(R11*1), Y7
	VUNPCKLPS Y1, Y0, Y8  // r0[0] r1[0] r0[1] r1[1] | r0[4] r1[4] r0[5] r1[5]
	VUNPCKHPS Y1, Y0, Y9  // r0[2] r1[2] r0[3] r1[3] | r0[6] ...
	VUNPCKLPS Y3, Y2, Y10
	VUNPCKHPS Y3, Y2, Y11
	VUNPCKLPS Y5, Y4, Y12
	VUNPCKHPS Y5, Y4, Y13
	VUNPCKLPS Y7, Y6, Y14
	VUNPCKHPS Y7, Y6, Y15
	VSHUFPS $0x44, Y10, Y8, Y0  // rows 0–3 of columns 0 | 4
	VSHUFPS $0xEE, Y10, Y8, Y1  // 1 | 5
	VSHUFPS $0x44, Y11, Y9, Y2  // 2 | 6
	VSHUFPS $0xEE, Y11, Y9, Y3  // 3 | 7
	VSHUFPS $0x44, Y14, Y12, Y4 // rows 4–7 of columns 0 | 4
	VSHUFPS $0xEE, Y14, Y12, Y5
	VSHUFPS $0x44, Y15, Y13, Y6
	VSHUFPS $0xEE, Y15, Y13, Y7
	VPERM2F128 $0x20, Y4, Y0, Y8  // column 0
	VPERM2F128 $0x20, Y5, Y1, Y9  // column 1
	VPERM2F128 $0x20, Y6, Y2, Y10 // column 2
	VPERM2F128 $0x20, Y7, Y3, Y11 // column 3
	VPERM2F128 $0x31, Y4, Y0, Y12 // column 4
	VPERM2F128 $0x31, Y5, Y1, Y13
	VPERM2F128 $0x31, Y6, Y2, Y14
	VPERM2F128 $0x31, Y7, Y3, Y15
	VMOVUPS Y8, (DI)
	VMOVUPS Y9, (DI)(DX*1)
	VMOVUPS Y10, (DI)(DX*2)
	VMOVUPS Y11, (DI)(R13*1)
	LEAQ    (DI)(DX*4), DI
	VMOVUPS Y12, (DI)
	VMOVUPS Y13, (DI)(DX*1)
	VMOVUPS Y14, (DI)(DX*2)
	VMOVUPS Y15, (DI)(R13*1)
	LEAQ    (DI)(DX*4), DI
	ADDQ    $32, SI
	ADDQ    $32, R12
	DECQ    CX
	JNZ     packt8_step
	VZEROUPPER
	RET

// func packT6AVX2(dst *float32, src *float32, ld int, kc int)
//
// dst[l*6 + i] = src[i*ld + l] for i < 6, l < kc (kc a positive multiple of 8): packT8AVX2
// for the AVX2 micro-kernel's panel of a (MR = 6), whose 8 columns of a block are 48
// contiguous values. The block is transposed as an 8×8 one (its rows 6 and 7 whatever Y6
// and Y7 hold), each column stored as 8 values 6 apart, in order, so the next column's
// store overwrites the 2 that do not belong; the last column is stored as 6.
TEXT ·packT6AVX2(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ ld+16(FP), BX
	SHLQ $2, BX
	MOVQ kc+24(FP), CX
	SHRQ $3, CX
	LEAQ (BX)(BX*2), R11 // 3·ld
	LEAQ (SI)(BX*4), R12 // row 4

packt6_step:
	VMOVUPS (SI), Y0
	VMOVUPS (SI)(BX*1), Y1
	VMOVUPS (SI)(BX*2), Y2
	VMOVUPS (SI)(R11*1), Y3
	VMOVUPS (R12), Y4
	VMOVUPS (R12)(BX*1), Y5
	VUNPCKLPS Y1, Y0, Y8
	VUNPCKHPS Y1, Y0, Y9
	VUNPCKLPS Y3, Y2, Y10
	VUNPCKHPS Y3, Y2, Y11
	VUNPCKLPS Y5, Y4, Y12
	VUNPCKHPS Y5, Y4, Y13
	VUNPCKLPS Y7, Y6, Y14
	VUNPCKHPS Y7, Y6, Y15
	VSHUFPS $0x44, Y10, Y8, Y0
	VSHUFPS $0xEE, Y10, Y8, Y1
	VSHUFPS $0x44, Y11, Y9, Y2
	VSHUFPS $0xEE, Y11, Y9, Y3
	VSHUFPS $0x44, Y14, Y12, Y4
	VSHUFPS $0xEE, Y14, Y12, Y5
	VSHUFPS $0x44, Y15, Y13, Y6
	VSHUFPS $0xEE, Y15, Y13, Y7
	VPERM2F128 $0x20, Y4, Y0, Y8  // column 0
	VPERM2F128 $0x20, Y5, Y1, Y9  // column 1
	VPERM2F128 $0x20, Y6, Y2, Y10 // column 2
	VPERM2F128 $0x20, Y7, Y3, Y11 // column 3
	VPERM2F128 $0x31, Y4, Y0, Y12 // column 4
	VPERM2F128 $0x31, Y5, Y1, Y13
	VPERM2F128 $0x31, Y6, Y2, Y14
	VPERM2F128 $0x31, Y7, Y3, Y15
	VMOVUPS Y8, (DI)
	VMOVUPS Y9, 24(DI)
	VMOVUPS Y10, 48(DI)
	VMOVUPS Y11, 72(DI)
	VMOVUPS Y12, 96(DI)
	VMOVUPS Y13, 120(DI)
	VMOVUPS Y14, 144(DI)
	VMOVUPS X15, 168(DI)
	VEXTRACTF128 $1, Y15, X15
	VMOVLPS X15, 184(DI)
	ADDQ    $192, DI
	ADDQ    $32, SI
	ADDQ    $32, R12
	DECQ    CX
	JNZ     packt6_step
	VZEROUPPER
	RET

// func packT8BF16AVX2(dst *float32, width int, src *uint16, ld int, kc int)
//
// packT8AVX2 on a src of bfloat16 values (uint16, the upper half of a float32's bits),
// each widened to its float32 (shifted up 16 bits) as it is loaded.
TEXT ·packT8BF16AVX2(SB), NOSPLIT, $0-40
	MOVQ dst+0(FP), DI
	MOVQ width+8(FP), DX
	SHLQ $2, DX
	MOVQ src+16(FP), SI
	MOVQ ld+24(FP), BX
	SHLQ $1, BX
	MOVQ kc+32(FP), CX
	SHRQ $3, CX
	LEAQ (BX)(BX*2), R11 // 3·ld
	LEAQ (SI)(BX*4), R12 // row 4
	LEAQ (DX)(DX*2), R13 // 3·width

packt8bf16_step:
	VPMOVZXWD (SI), Y0
	VPSLLD    $16, Y0, Y0
	VPMOVZXWD (SI)(BX*1), Y1
	VPSLLD    $16, Y1, Y1
	VPMOVZXWD (SI)(BX*2), Y2
	VPSLLD    $16, Y2, Y2
	VPMOVZXWD (SI)(R11*1), Y3
	VPSLLD    $16, Y3, Y3
	VPMOVZXWD (R12), Y4
	VPSLLD    $16, Y4, Y4
	VPMOVZXWD (R12)(BX*1), Y5
	VPSLLD    $16, Y5, Y5
	VPMOVZXWD (R12)(BX*2), Y6
	VPSLLD    $16, Y6, Y6
	VPMOVZXWD (R12)(R11*1), Y7
	VPSLLD    $16, Y7, Y7
	VUNPCKLPS Y1, Y0, Y8  // r0[0] r1[0] r0[1] r1[1] | r0[4] r1[4] r0[5] r1[5]
	VUNPCKHPS Y1, Y0, Y9  // r0[2] r1[2] r0[3] r1[3] | r0[6] ...
	VUNPCKLPS Y3, Y2, Y10
	VUNPCKHPS Y3, Y2, Y11
	VUNPCKLPS Y5, Y4, Y12
	VUNPCKHPS Y5, Y4, Y13
	VUNPCKLPS Y7, Y6, Y14
	VUNPCKHPS Y7, Y6, Y15
	VSHUFPS $0x44, Y10, Y8, Y0  // rows 0–3 of columns 0 | 4
	VSHUFPS $0xEE, Y10, Y8, Y1  // 1 | 5
	VSHUFPS $0x44, Y11, Y9, Y2  // 2 | 6
	VSHUFPS $0xEE, Y11, Y9, Y3  // 3 | 7
	VSHUFPS $0x44, Y14, Y12, Y4 // rows 4–7 of columns 0 | 4
	VSHUFPS $0xEE, Y14, Y12, Y5
	VSHUFPS $0x44, Y15, Y13, Y6
	VSHUFPS $0xEE, Y15, Y13, Y7
	VPERM2F128 $0x20, Y4, Y0, Y8  // column 0
	VPERM2F128 $0x20, Y5, Y1, Y9  // column 1
	VPERM2F128 $0x20, Y6, Y2, Y10 // column 2
	VPERM2F128 $0x20, Y7, Y3, Y11 // column 3
	VPERM2F128 $0x31, Y4, Y0, Y12 // column 4
	VPERM2F128 $0x31, Y5, Y1, Y13
	VPERM2F128 $0x31, Y6, Y2, Y14
	VPERM2F128 $0x31, Y7, Y3, Y15
	VMOVUPS Y8, (DI)
	VMOVUPS Y9, (DI)(DX*1)
	VMOVUPS Y10, (DI)(DX*2)
	VMOVUPS Y11, (DI)(R13*1)
	LEAQ    (DI)(DX*4), DI
	VMOVUPS Y12, (DI)
	VMOVUPS Y13, (DI)(DX*1)
	VMOVUPS Y14, (DI)(DX*2)
	VMOVUPS Y15, (DI)(R13*1)
	LEAQ    (DI)(DX*4), DI
	ADDQ    $16, SI
	ADDQ    $16, R12
	DECQ    CX
	JNZ     packt8bf16_step
	VZEROUPPER
	RET
