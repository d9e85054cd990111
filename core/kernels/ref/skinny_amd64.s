#include "textflag.h"
#include "fma_amd64.h"

// func skinnyAVX2(ct *float32, x *float32, k int, w *float32, ldw int, n int)
//
// ct[j*8 + i] = Σ_l x[i*k + l]·w[j*ldw + l] for i < 4, j < n, l < k (k a positive
// multiple of 8): 4 rows of x against n rows of w, the product stored transposed in rows
// of 8 (the caller offsets ct by 4 for x's rows 4 to 7). Two rows of w at a time: 8
// accumulators of 8 lanes, each load of x feeding two FMAs, summed across by a
// transposing horizontal add; a last odd row of w on its own. w streams through once,
// x stays in cache.
TEXT ·skinnyAVX2(SB), NOSPLIT, $0-48
	SKINNY_ARGS

pair:
	CMPQ DX, $2
	JB   single
	ZERO8
	XORQ AX, AX

pcol:
	SKINNY_PAIR_STEP(Y8, Y9, Y10, Y11, Y0, Y1, Y2, Y3, Y4, Y5, Y6, Y7)
	ADDQ $32, AX
	CMPQ AX, CX
	JB   pcol
	HSUM8 // Y1 = (row j of w: x0..x3 | row j+1: x0..x3)
	VMOVUPS    X1, (DI)
	VEXTRACTF128 $1, Y1, 32(DI)
	ADDQ $64, DI
	LEAQ (SI)(BX*2), SI
	LEAQ (R12)(BX*2), R12
	SUBQ $2, DX
	JMP  pair

single:
	TESTQ DX, DX
	JZ    done
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	XORQ AX, AX

scol:
	SKINNY_SINGLE_STEP(Y8, Y0, Y1, Y2, Y3)
	ADDQ $32, AX
	CMPQ AX, CX
	JB   scol
	VHADDPS    Y1, Y0, Y0
	VHADDPS    Y3, Y2, Y2
	VHADDPS    Y2, Y0, Y0   // (x0 x1 x2 x3 | x0 x1 x2 x3) partial
	VEXTRACTF128 $1, Y0, X1
	VADDPS     X1, X0, X0
	VMOVUPS    X0, (DI)

done:
	VZEROUPPER
	RET

// func skinnyAVX512(ct *float32, x *float32, k int, w *float32, ldw int, n int)
//
// skinnyAVX2 with 16-lane registers, for k a positive multiple of 16: the same two rows of
// w against 4 rows of x, 8 accumulators of 16 lanes, each halved into 8 lanes before the
// transposing horizontal sum. The pair after the one it reads is prefetched along (R13,
// one step's 128 bytes a step: with ldw = k, a pair's bytes by its end), as the GEMVs
// prefetch their next rows: each pair of rows is otherwise two short streams the
// hardware's prefetchers do not run ahead of.
TEXT ·skinnyAVX512(SB), NOSPLIT, $0-48
	SKINNY_ARGS
	LEAQ (SI)(BX*2), R13 // the next pair of rows, prefetched along (PREFETCH512's note)

zpair:
	CMPQ DX, $2
	JB   zsingle
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	VPXORD Z2, Z2, Z2
	VPXORD Z3, Z3, Z3
	VPXORD Z4, Z4, Z4
	VPXORD Z5, Z5, Z5
	VPXORD Z6, Z6, Z6
	VPXORD Z7, Z7, Z7
	XORQ AX, AX

zpcol:
	PREFETCHT1 (R13)
	PREFETCHT1 64(R13)
	ADDQ       $128, R13
	SKINNY_PAIR_STEP(Z8, Z9, Z10, Z11, Z0, Z1, Z2, Z3, Z4, Z5, Z6, Z7)
	ADDQ $64, AX
	CMPQ AX, CX
	JB   zpcol
	HALVE8
	HSUM8 // Y1 = (row j of w: x0..x3 | row j+1: x0..x3)
	VMOVUPS    X1, (DI)
	VEXTRACTF128 $1, Y1, 32(DI)
	ADDQ $64, DI
	LEAQ (SI)(BX*2), SI
	LEAQ (R12)(BX*2), R12
	SUBQ $2, DX
	JMP  zpair

zsingle:
	TESTQ DX, DX
	JZ    zdone
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	VPXORD Z2, Z2, Z2
	VPXORD Z3, Z3, Z3
	XORQ AX, AX

zscol:
	SKINNY_SINGLE_STEP(Z8, Z0, Z1, Z2, Z3)
	ADDQ $64, AX
	CMPQ AX, CX
	JB   zscol
	VEXTRACTF64X4 $1, Z0, Y16
	VADDPS        Y16, Y0, Y0
	VEXTRACTF64X4 $1, Z1, Y16
	VADDPS        Y16, Y1, Y1
	VEXTRACTF64X4 $1, Z2, Y16
	VADDPS        Y16, Y2, Y2
	VEXTRACTF64X4 $1, Z3, Y16
	VADDPS        Y16, Y3, Y3
	VHADDPS    Y1, Y0, Y0
	VHADDPS    Y3, Y2, Y2
	VHADDPS    Y2, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VADDPS     X1, X0, X0
	VMOVUPS    X0, (DI)

zdone:
	VZEROUPPER
	RET

// GEMV_STEP is one step of gemv: x's values at R9 into X0, times the same values of 8
// rows of w (SI: rows 0–3, R12: rows 4–7), into A0–A7.
#define GEMV_STEP(X0, A0, A1, A2, A3, A4, A5, A6, A7) \
	VMOVUPS     (R9), X0; \
	VFMADD231PS (SI), X0, A0; \
	VFMADD231PS (SI)(BX*1), X0, A1; \
	VFMADD231PS (SI)(BX*2), X0, A2; \
	VFMADD231PS (SI)(R11*1), X0, A3; \
	VFMADD231PS (R12), X0, A4; \
	VFMADD231PS (R12)(BX*1), X0, A5; \
	VFMADD231PS (R12)(BX*2), X0, A6; \
	VFMADD231PS (R12)(R11*1), X0, A7

// func gemvAVX2(out *float32, x *float32, k int, w *float32, ldw int, n8 int)
//
// out[j] = Σ_l x[l]·w[j*ldw + l] for j < 8·n8, l < k (k a positive multiple of 8, n8 ≥ 1):
// one row of x against w's rows 8 at a time, one accumulator of 8 lanes a row, summed
// across by HSUM8 into 8 consecutive values of out. w streams through once.
TEXT ·gemvAVX2(SB), NOSPLIT, $0-48
	MOVQ out+0(FP), DI
	MOVQ x+8(FP), R8
	MOVQ k+16(FP), CX
	SHRQ $3, CX // steps of the width
	MOVQ w+24(FP), SI
	MOVQ ldw+32(FP), BX
	SHLQ $2, BX
	LEAQ (BX)(BX*2), R11 // 3·ldw
	MOVQ n8+40(FP), DX

gemv8:
	ZERO8
	MOVQ SI, R13
	LEAQ (SI)(BX*4), R12
	LEAQ (SI)(BX*8), R14 // the next 8 rows, prefetched along (PREFETCH512's note)
	MOVQ R8, R9
	MOVQ CX, R10

gemv8_step:
	GEMV_STEP(Y8, Y0, Y1, Y2, Y3, Y4, Y5, Y6, Y7)
	ADDQ $32, SI
	ADDQ $32, R12
	ADDQ $32, R9
	DECQ R10
	JNZ  gemv8_step
	HSUM8
	VMOVUPS Y1, (DI)
	ADDQ    $32, DI
	LEAQ    (R13)(BX*8), SI
	DECQ    DX
	JNZ     gemv8
	VZEROUPPER
	RET

// func gemvAVX512(out *float32, x *float32, k int, w *float32, ldw int, n8 int)
//
// gemvAVX2 in 16-lane registers, for k a positive multiple of 16: each accumulator halved
// into 8 lanes before the transposing horizontal sum.
TEXT ·gemvAVX512(SB), NOSPLIT, $0-48
	MOVQ out+0(FP), DI
	MOVQ x+8(FP), R8
	MOVQ k+16(FP), CX
	SHRQ $4, CX // steps of the width
	MOVQ w+24(FP), SI
	MOVQ ldw+32(FP), BX
	SHLQ $2, BX
	LEAQ (BX)(BX*2), R11 // 3·ldw
	MOVQ n8+40(FP), DX

zgemv8:
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	VPXORD Z2, Z2, Z2
	VPXORD Z3, Z3, Z3
	VPXORD Z4, Z4, Z4
	VPXORD Z5, Z5, Z5
	VPXORD Z6, Z6, Z6
	VPXORD Z7, Z7, Z7
	MOVQ   SI, R13
	LEAQ   (SI)(BX*4), R12
	LEAQ   (SI)(BX*8), R14 // the next 8 rows, prefetched along
	MOVQ   R8, R9
	MOVQ   CX, R10

zgemv8_step:
	PREFETCH512(R14)
	GEMV_STEP(Z8, Z0, Z1, Z2, Z3, Z4, Z5, Z6, Z7)
	ADDQ $64, SI
	ADDQ $64, R12
	ADDQ $64, R9
	DECQ R10
	JNZ  zgemv8_step
	HALVE8
	HSUM8
	VMOVUPS Y1, (DI)
	ADDQ    $32, DI
	LEAQ    (R13)(BX*8), SI
	DECQ    DX
	JNZ     zgemv8
	VZEROUPPER
	RET

// GEMVBF16_STEP is GEMV_STEP on a w of bfloat16 values, each row's widened into T
// (VPMOVZXWD, then shifted up 16 bits) before its FMA.
#define GEMVBF16_STEP(X0, T, A0, A1, A2, A3, A4, A5, A6, A7) \
	VMOVUPS     (R9), X0; \
	VPMOVZXWD   (SI), T; \
	VPSLLD      $16, T, T; \
	VFMADD231PS T, X0, A0; \
	VPMOVZXWD   (SI)(BX*1), T; \
	VPSLLD      $16, T, T; \
	VFMADD231PS T, X0, A1; \
	VPMOVZXWD   (SI)(BX*2), T; \
	VPSLLD      $16, T, T; \
	VFMADD231PS T, X0, A2; \
	VPMOVZXWD   (SI)(R11*1), T; \
	VPSLLD      $16, T, T; \
	VFMADD231PS T, X0, A3; \
	VPMOVZXWD   (R12), T; \
	VPSLLD      $16, T, T; \
	VFMADD231PS T, X0, A4; \
	VPMOVZXWD   (R12)(BX*1), T; \
	VPSLLD      $16, T, T; \
	VFMADD231PS T, X0, A5; \
	VPMOVZXWD   (R12)(BX*2), T; \
	VPSLLD      $16, T, T; \
	VFMADD231PS T, X0, A6; \
	VPMOVZXWD   (R12)(R11*1), T; \
	VPSLLD      $16, T, T; \
	VFMADD231PS T, X0, A7

// func gemvBF16AVX2(out *float32, x *float32, k int, w *uint16, ldw int, n8 int)
//
// gemvAVX2 on a w of bfloat16 values (uint16, the upper half of a float32's bits), each
// widened to its float32 as it is loaded: half the bytes streamed.
TEXT ·gemvBF16AVX2(SB), NOSPLIT, $0-48
	MOVQ out+0(FP), DI
	MOVQ x+8(FP), R8
	MOVQ k+16(FP), CX
	SHRQ $3, CX // steps of the width
	MOVQ w+24(FP), SI
	MOVQ ldw+32(FP), BX
	SHLQ $1, BX
	LEAQ (BX)(BX*2), R11 // 3·ldw
	MOVQ n8+40(FP), DX

gemvbf16_8:
	ZERO8
	MOVQ SI, R13
	LEAQ (SI)(BX*4), R12
	LEAQ (SI)(BX*8), R14 // the next 8 rows, prefetched along
	MOVQ R8, R9
	MOVQ CX, R10

gemvbf16_8_step:
	GEMVBF16_STEP(Y8, Y9, Y0, Y1, Y2, Y3, Y4, Y5, Y6, Y7)
	ADDQ $16, SI
	ADDQ $16, R12
	ADDQ $32, R9
	DECQ R10
	JNZ  gemvbf16_8_step
	HSUM8
	VMOVUPS Y1, (DI)
	ADDQ    $32, DI
	LEAQ    (R13)(BX*8), SI
	DECQ    DX
	JNZ     gemvbf16_8
	VZEROUPPER
	RET

// func gemvBF16AVX512(out *float32, x *float32, k int, w *uint16, ldw int, n8 int)
//
// gemvBF16AVX2 in 16-lane registers, for k a positive multiple of 16: each accumulator halved
// into 8 lanes before the transposing horizontal sum.
TEXT ·gemvBF16AVX512(SB), NOSPLIT, $0-48
	MOVQ out+0(FP), DI
	MOVQ x+8(FP), R8
	MOVQ k+16(FP), CX
	SHRQ $4, CX // steps of the width
	MOVQ w+24(FP), SI
	MOVQ ldw+32(FP), BX
	SHLQ $1, BX
	LEAQ (BX)(BX*2), R11 // 3·ldw
	MOVQ n8+40(FP), DX

zgemvbf16_8:
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	VPXORD Z2, Z2, Z2
	VPXORD Z3, Z3, Z3
	VPXORD Z4, Z4, Z4
	VPXORD Z5, Z5, Z5
	VPXORD Z6, Z6, Z6
	VPXORD Z7, Z7, Z7
	MOVQ   SI, R13
	LEAQ   (SI)(BX*4), R12
	MOVQ   R8, R9
	MOVQ   CX, R10

zgemvbf16_8_step:
	GEMVBF16_STEP(Z8, Z9, Z0, Z1, Z2, Z3, Z4, Z5, Z6, Z7)
	ADDQ $32, SI
	ADDQ $32, R12
	ADDQ $64, R9
	DECQ R10
	JNZ  zgemvbf16_8_step
	HALVE8
	HSUM8
	VMOVUPS Y1, (DI)
	ADDQ    $32, DI
	LEAQ    (R13)(BX*8), SI
	DECQ    DX
	JNZ     zgemvbf16_8
	VZEROUPPER
	RET

DATA bf16hi<>+0(SB)/4, $0xffff0000
GLOBL bf16hi<>(SB), RODATA|NOPTR, $4

// GEMVBF16EO_ROW(mem, AE, AO) is one row's step of gemvBF16EOAVX512: its 32 bfloat16 at
// mem as 16 dwords, the even ones (the low halves) shifted up into float32, the odd ones
// (the high halves) masked, each times its x lanes (Z8 even, Z9 odd) into AE, AO.
#define GEMVBF16EO_ROW(mem, AE, AO) \
	VPSLLD      $16, mem, Z10; \
	VPANDD      mem, Z11, Z12; \
	VFMADD231PS Z10, Z8, AE; \
	VFMADD231PS Z12, Z9, AO

// func gemvBF16EOAVX512(out *float32, xp *float32, k int, w *uint16, ldw int, n8 int)
//
// gemvBF16AVX512 for k a positive multiple of 32 on x laid out in blocks of 32 as its
// even then its odd steps (xp[32b + i] = x[32b + 2i], xp[32b + 16 + i] = x[32b + 2i + 1],
// i < 16: gemvBF16's evenOdd): a step reads 64 bytes of each of 8 rows (32 values), and
// widens them with one shift and one mask, in place of two zero-extending loads and two
// shifts; half the instructions a byte, so more of the rows' misses are in flight at once.
// A row's even and odd steps sum in two accumulators (Z0–Z7, Z16–Z23), added before the
// horizontal sum.
TEXT ·gemvBF16EOAVX512(SB), NOSPLIT, $0-48
	MOVQ out+0(FP), DI
	MOVQ xp+8(FP), R8
	MOVQ k+16(FP), CX
	SHRQ $5, CX // steps of 32
	MOVQ w+24(FP), SI
	MOVQ ldw+32(FP), BX
	SHLQ $1, BX
	LEAQ (BX)(BX*2), R11 // 3·ldw
	MOVQ n8+40(FP), DX
	VPBROADCASTD bf16hi<>(SB), Z11

zgemvbf16eo_8:
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	VPXORD Z2, Z2, Z2
	VPXORD Z3, Z3, Z3
	VPXORD Z4, Z4, Z4
	VPXORD Z5, Z5, Z5
	VPXORD Z6, Z6, Z6
	VPXORD Z7, Z7, Z7
	VPXORD Z16, Z16, Z16
	VPXORD Z17, Z17, Z17
	VPXORD Z18, Z18, Z18
	VPXORD Z19, Z19, Z19
	VPXORD Z20, Z20, Z20
	VPXORD Z21, Z21, Z21
	VPXORD Z22, Z22, Z22
	VPXORD Z23, Z23, Z23
	MOVQ   SI, R13
	LEAQ   (SI)(BX*4), R12
	LEAQ   (SI)(BX*8), R14 // the next 8 rows, prefetched along (PREFETCH512's note)
	MOVQ   R8, R9
	MOVQ   CX, R10

zgemvbf16eo_8_step:
	PREFETCH512(R14)
	VMOVUPS (R9), Z8
	VMOVUPS 64(R9), Z9
	GEMVBF16EO_ROW((SI), Z0, Z16)
	GEMVBF16EO_ROW((SI)(BX*1), Z1, Z17)
	GEMVBF16EO_ROW((SI)(BX*2), Z2, Z18)
	GEMVBF16EO_ROW((SI)(R11*1), Z3, Z19)
	GEMVBF16EO_ROW((R12), Z4, Z20)
	GEMVBF16EO_ROW((R12)(BX*1), Z5, Z21)
	GEMVBF16EO_ROW((R12)(BX*2), Z6, Z22)
	GEMVBF16EO_ROW((R12)(R11*1), Z7, Z23)
	ADDQ $64, SI
	ADDQ $64, R12
	ADDQ $128, R9
	DECQ R10
	JNZ  zgemvbf16eo_8_step
	VADDPS Z16, Z0, Z0
	VADDPS Z17, Z1, Z1
	VADDPS Z18, Z2, Z2
	VADDPS Z19, Z3, Z3
	VADDPS Z20, Z4, Z4
	VADDPS Z21, Z5, Z5
	VADDPS Z22, Z6, Z6
	VADDPS Z23, Z7, Z7
	HALVE8
	HSUM8
	VMOVUPS Y1, (DI)
	ADDQ    $32, DI
	LEAQ    (R13)(BX*8), SI
	DECQ    DX
	JNZ     zgemvbf16eo_8
	VZEROUPPER
	RET

// GEMVBF16EO_ROW2(off, A) is one row's step of gemvBF16EOAVX2: its 32 bfloat16 at off(R)
// as two registers of 8 dwords, the even values (the low halves) shifted up into float32,
// the odd ones (the high halves) masked by Y12, each times its x lanes (Y8, Y9 even; Y10,
// Y11 odd) into the row's one accumulator A; Y13–Y15 are scratch.
#define GEMVBF16EO_ROW2(mem0, mem1, A) \
	VMOVDQU     mem0, Y13; \
	VMOVDQU     mem1, Y14; \
	VPSLLD      $16, Y13, Y15; \
	VFMADD231PS Y15, Y8, A; \
	VPAND       Y13, Y12, Y13; \
	VFMADD231PS Y13, Y10, A; \
	VPSLLD      $16, Y14, Y15; \
	VFMADD231PS Y15, Y9, A; \
	VPAND       Y14, Y12, Y14; \
	VFMADD231PS Y14, Y11, A

// func gemvBF16EOAVX2(out *float32, xp *float32, k int, w *uint16, ldw int, n8 int)
//
// gemvBF16EOAVX512 in 8-lane registers, on the same even-odd layout of x (k a positive
// multiple of 32): a step reads 64 bytes of each of 8 rows, widened with one shift and
// one mask a register in place of gemvBF16AVX2's zero-extending load and shift for every
// 8 values, which on Zen 3 both go to the two shuffle-and-shift pipes: half the
// instructions a byte, and the FMAs' two pipes the bound. Each row sums in one accumulator
// (Y0–Y7: 8 chains of 4 FMAs a step, as many as the FMAs' latency needs), x's step in
// Y8–Y11; the next 8 rows are prefetched along as in gemvAVX512.
TEXT ·gemvBF16EOAVX2(SB), NOSPLIT, $0-48
	MOVQ out+0(FP), DI
	MOVQ xp+8(FP), R8
	MOVQ k+16(FP), CX
	SHRQ $5, CX // steps of 32
	MOVQ w+24(FP), SI
	MOVQ ldw+32(FP), BX
	SHLQ $1, BX
	LEAQ (BX)(BX*2), R11 // 3·ldw
	MOVQ n8+40(FP), DX
	VPBROADCASTD bf16hi<>(SB), Y12

gemvbf16eo_8:
	ZERO8
	MOVQ SI, R13
	LEAQ (SI)(BX*4), R12
	LEAQ (SI)(BX*8), R14 // the next 8 rows, prefetched along
	MOVQ R8, R9
	MOVQ CX, R10

gemvbf16eo_8_step:
	PREFETCH512(R14)
	VMOVUPS (R9), Y8
	VMOVUPS 32(R9), Y9
	VMOVUPS 64(R9), Y10
	VMOVUPS 96(R9), Y11
	GEMVBF16EO_ROW2((SI), 32(SI), Y0)
	GEMVBF16EO_ROW2((SI)(BX*1), 32(SI)(BX*1), Y1)
	GEMVBF16EO_ROW2((SI)(BX*2), 32(SI)(BX*2), Y2)
	GEMVBF16EO_ROW2((SI)(R11*1), 32(SI)(R11*1), Y3)
	GEMVBF16EO_ROW2((R12), 32(R12), Y4)
	GEMVBF16EO_ROW2((R12)(BX*1), 32(R12)(BX*1), Y5)
	GEMVBF16EO_ROW2((R12)(BX*2), 32(R12)(BX*2), Y6)
	GEMVBF16EO_ROW2((R12)(R11*1), 32(R12)(R11*1), Y7)
	ADDQ $64, SI
	ADDQ $64, R12
	ADDQ $128, R9
	DECQ R10
	JNZ  gemvbf16eo_8_step
	HSUM8
	VMOVUPS Y1, (DI)
	ADDQ    $32, DI
	LEAQ    (R13)(BX*8), SI
	DECQ    DX
	JNZ     gemvbf16eo_8
	VZEROUPPER
	RET

// func skinnyBF16EOAVX512(ct *float32, xp *float32, k int, w *uint16, ldw int, n int)
//
// skinnyAVX512 on a bfloat16 w, read as stored: ct[j*8 + i] = x_i·w[j*ldw:][:k] for i < 4,
// j < n, x's 4 rows (k values each, contiguous) in gemvBF16's even-odd layout (evenOdd: in
// each block of 32, the even steps then the odd ones), k a positive multiple of 32. A
// step reads 64 bytes of each of two rows of w and widens them with one shift and one
// mask a row (as gemvBF16EOAVX512), each times x's even and odd lanes into the rows'
// accumulators; no widened copy of w is written or read back. The next pair of rows is
// prefetched along (R13), as skinnyAVX512's.
TEXT ·skinnyBF16EOAVX512(SB), NOSPLIT, $0-48
	MOVQ ct+0(FP), DI
	MOVQ xp+8(FP), R8
	MOVQ k+16(FP), CX
	SHLQ $2, CX // a row of x in bytes
	LEAQ (R8)(CX*1), R9
	LEAQ (R9)(CX*1), R10
	LEAQ (R10)(CX*1), R11
	MOVQ w+24(FP), SI
	MOVQ ldw+32(FP), BX
	SHLQ $1, BX // a row of w in bytes
	LEAQ (SI)(BX*1), R12
	MOVQ n+40(FP), DX
	LEAQ (SI)(BX*2), R13 // the next pair of rows, prefetched along
	VPBROADCASTD bf16hi<>(SB), Z14

bpair:
	CMPQ DX, $2
	JB   bsingle
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	VPXORD Z2, Z2, Z2
	VPXORD Z3, Z3, Z3
	VPXORD Z4, Z4, Z4
	VPXORD Z5, Z5, Z5
	VPXORD Z6, Z6, Z6
	VPXORD Z7, Z7, Z7
	XORQ AX, AX  // x's offset
	XORQ R14, R14 // w's

bpcol:
	PREFETCHT1 (R13)
	PREFETCHT1 64(R13)
	ADDQ       $128, R13
	VMOVUPS    (SI)(R14*1), Z15
	VPSLLD     $16, Z15, Z8
	VPANDD     Z15, Z14, Z9
	VMOVUPS    (R12)(R14*1), Z15
	VPSLLD     $16, Z15, Z10
	VPANDD     Z15, Z14, Z11
	VMOVUPS     (R8)(AX*1), Z12
	VMOVUPS     64(R8)(AX*1), Z13
	VFMADD231PS Z12, Z8, Z0
	VFMADD231PS Z12, Z10, Z4
	VFMADD231PS Z13, Z9, Z0
	VFMADD231PS Z13, Z11, Z4
	VMOVUPS     (R9)(AX*1), Z12
	VMOVUPS     64(R9)(AX*1), Z13
	VFMADD231PS Z12, Z8, Z1
	VFMADD231PS Z12, Z10, Z5
	VFMADD231PS Z13, Z9, Z1
	VFMADD231PS Z13, Z11, Z5
	VMOVUPS     (R10)(AX*1), Z12
	VMOVUPS     64(R10)(AX*1), Z13
	VFMADD231PS Z12, Z8, Z2
	VFMADD231PS Z12, Z10, Z6
	VFMADD231PS Z13, Z9, Z2
	VFMADD231PS Z13, Z11, Z6
	VMOVUPS     (R11)(AX*1), Z12
	VMOVUPS     64(R11)(AX*1), Z13
	VFMADD231PS Z12, Z8, Z3
	VFMADD231PS Z12, Z10, Z7
	VFMADD231PS Z13, Z9, Z3
	VFMADD231PS Z13, Z11, Z7
	ADDQ $128, AX
	ADDQ $64, R14
	CMPQ AX, CX
	JB   bpcol
	HALVE8
	HSUM8 // Y1 = (row j of w: x0..x3 | row j+1: x0..x3)
	VMOVUPS      X1, (DI)
	VEXTRACTF128 $1, Y1, 32(DI)
	ADDQ         $64, DI
	LEAQ         (SI)(BX*2), SI
	LEAQ         (R12)(BX*2), R12
	SUBQ         $2, DX
	JMP          bpair

bsingle:
	TESTQ DX, DX
	JZ    bdone
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	VPXORD Z2, Z2, Z2
	VPXORD Z3, Z3, Z3
	XORQ AX, AX
	XORQ R14, R14

bscol:
	VMOVUPS (SI)(R14*1), Z15
	VPSLLD  $16, Z15, Z8
	VPANDD  Z15, Z14, Z9
	VFMADD231PS (R8)(AX*1), Z8, Z0
	VFMADD231PS 64(R8)(AX*1), Z9, Z0
	VFMADD231PS (R9)(AX*1), Z8, Z1
	VFMADD231PS 64(R9)(AX*1), Z9, Z1
	VFMADD231PS (R10)(AX*1), Z8, Z2
	VFMADD231PS 64(R10)(AX*1), Z9, Z2
	VFMADD231PS (R11)(AX*1), Z8, Z3
	VFMADD231PS 64(R11)(AX*1), Z9, Z3
	ADDQ $128, AX
	ADDQ $64, R14
	CMPQ AX, CX
	JB   bscol
	VEXTRACTF64X4 $1, Z0, Y16
	VADDPS        Y16, Y0, Y0
	VEXTRACTF64X4 $1, Z1, Y16
	VADDPS        Y16, Y1, Y1
	VEXTRACTF64X4 $1, Z2, Y16
	VADDPS        Y16, Y2, Y2
	VEXTRACTF64X4 $1, Z3, Y16
	VADDPS        Y16, Y3, Y3
	VHADDPS       Y1, Y0, Y0
	VHADDPS       Y3, Y2, Y2
	VHADDPS       Y2, Y0, Y0
	VEXTRACTF128  $1, Y0, X1
	VADDPS        X1, X0, X0
	VMOVUPS       X0, (DI)

bdone:
	VZEROUPPER
	RET
