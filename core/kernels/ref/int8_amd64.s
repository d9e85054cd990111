#include "textflag.h"
#include "fma_amd64.h"

// The AVX-512 VNNI kernels of MatMulTInt8 (int8.go): dot products of activations
// quantised in blocks of 32 (int8 values, a float32 scale each) with a weight group of
// 16 rows in the same blocks (unsigned bytes q+128, a float32 scale each), laid out as
// int8.go's Int8Matrix says.
//
// Per block b of 32 steps and x row r, VPDPBUSD adds, in lane i of an int32 vector, the
// four products (q[i]+128)·xq of 4 steps: 8 of them (two accumulators of 4, so two
// chains) cover the block for all 16 rows at once. The block's integer dot is that sum
// less 128·Σxq (xc[b], the activation's part of the offset), converted to float32 and
// added to the row's accumulator times ws[b][i]·xs[b] by an FMA: every block's sum is
// exact in int32 and each row's float32 sum runs over the blocks in order, as the scalar
// loop's (int8.go: q8DotScalar).

// func q8Dot1VNNI(out *float32, xq *int8, xs *float32, xc *int32, w *uint8, ws *float32, nb int)
//
// out[i] = Σ_b ws[b*16+i]·xs[b]·(Σ_s (w[b*512 + s*64 + 4i..] · xq[b*32 + 4s..]) - xc[b])
// for i < 16, b < nb: one activation row against one weight group.
TEXT ·q8Dot1VNNI(SB), NOSPLIT, $0-56
	MOVQ out+0(FP), DI
	MOVQ xq+8(FP), SI
	MOVQ xs+16(FP), R8
	MOVQ xc+24(FP), R9
	MOVQ w+32(FP), DX
	MOVQ ws+40(FP), CX
	MOVQ nb+48(FP), BX
	VPXORD Z16, Z16, Z16
	MOVQ BX, R10
	SHLQ $9, R10
	LEAQ (DX)(R10*1), R10 // the next group's weights and scales, prefetched along
	MOVQ BX, R11
	SHLQ $6, R11
	ADDQ CX, R11

block1:
	PREFETCH512(R10)
	PREFETCHT1 (R11)
	ADDQ $64, R11
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	VMOVDQU32 0(DX), Z8
	VMOVDQU32 64(DX), Z9
	VMOVDQU32 128(DX), Z10
	VMOVDQU32 192(DX), Z11
	VPDPBUSD.BCST 0(SI), Z8, Z0
	VPDPBUSD.BCST 4(SI), Z9, Z1
	VPDPBUSD.BCST 8(SI), Z10, Z0
	VPDPBUSD.BCST 12(SI), Z11, Z1
	VMOVDQU32 256(DX), Z8
	VMOVDQU32 320(DX), Z9
	VMOVDQU32 384(DX), Z10
	VMOVDQU32 448(DX), Z11
	VPDPBUSD.BCST 16(SI), Z8, Z0
	VPDPBUSD.BCST 20(SI), Z9, Z1
	VPDPBUSD.BCST 24(SI), Z10, Z0
	VPDPBUSD.BCST 28(SI), Z11, Z1
	VPADDD Z1, Z0, Z0
	VPSUBD.BCST (R9), Z0, Z0
	VCVTDQ2PS Z0, Z0
	VMOVUPS (CX), Z12
	VMULPS.BCST (R8), Z12, Z2
	VFMADD231PS Z2, Z0, Z16
	ADDQ $512, DX
	ADDQ $64, CX
	ADDQ $32, SI
	ADDQ $4, R8
	ADDQ $4, R9
	DECQ BX
	JNZ  block1
	VMOVUPS Z16, (DI)
	VZEROUPPER
	RET

// Q4STEP(off, wr) feeds the weights in wr (4 steps of 16 rows, at step s = off/4 of the
// block) to the four rows' accumulators: rows' xq are 32 bytes apart, accumulators
// Z0/Z1 (row 0) to Z6/Z7 (row 3), the first of each pair for steps 0..3 of the block.
#define Q4STEP(off, acc0, acc1, acc2, acc3, wr) \
	VPDPBUSD.BCST (off)(SI), wr, acc0 \
	VPDPBUSD.BCST (32+off)(SI), wr, acc1 \
	VPDPBUSD.BCST (64+off)(SI), wr, acc2 \
	VPDPBUSD.BCST (96+off)(SI), wr, acc3

// Q4ROW(r, acc, accb, sum) finishes row r's block: acc += accb, less xc[r], to float32,
// sum += it · ws·xs[r] (ws, the block's 16 weight scales, in Z12).
#define Q4ROW(r, acc, accb, sum) \
	VPADDD accb, acc, acc \
	VPSUBD.BCST (4*r)(R9), acc, acc \
	VCVTDQ2PS acc, acc \
	VMULPS.BCST (4*r)(R8), Z12, Z13 \
	VFMADD231PS Z13, acc, sum

// func q8Dot4VNNI(out *float32, ldo int, xq *int8, xs *float32, xc *int32, w *uint8, ws *float32, nb int)
//
// q8Dot1VNNI for 4 activation rows at once, sharing the weight loads: their blocks
// interleaved (block b of row r at xq[(b*4 + r)*32], xs[b*4 + r], xc[b*4 + r]), row r's
// 16 outputs stored at out[r*ldo].
TEXT ·q8Dot4VNNI(SB), NOSPLIT, $0-64
	MOVQ out+0(FP), DI
	MOVQ ldo+8(FP), AX
	MOVQ xq+16(FP), SI
	MOVQ xs+24(FP), R8
	MOVQ xc+32(FP), R9
	MOVQ w+40(FP), DX
	MOVQ ws+48(FP), CX
	MOVQ nb+56(FP), BX
	SHLQ $2, AX
	VPXORD Z16, Z16, Z16
	VPXORD Z17, Z17, Z17
	VPXORD Z18, Z18, Z18
	VPXORD Z19, Z19, Z19
	MOVQ BX, R10
	SHLQ $9, R10
	LEAQ (DX)(R10*1), R10 // the next group's weights and scales, prefetched along
	MOVQ BX, R11
	SHLQ $6, R11
	ADDQ CX, R11

block4:
	PREFETCH512(R10)
	PREFETCHT1 (R11)
	ADDQ $64, R11
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	VPXORD Z2, Z2, Z2
	VPXORD Z3, Z3, Z3
	VPXORD Z4, Z4, Z4
	VPXORD Z5, Z5, Z5
	VPXORD Z6, Z6, Z6
	VPXORD Z7, Z7, Z7
	VMOVDQU32 0(DX), Z8
	VMOVDQU32 64(DX), Z9
	VMOVDQU32 128(DX), Z10
	VMOVDQU32 192(DX), Z11
	Q4STEP(0, Z0, Z2, Z4, Z6, Z8)
	Q4STEP(4, Z1, Z3, Z5, Z7, Z9)
	Q4STEP(8, Z0, Z2, Z4, Z6, Z10)
	Q4STEP(12, Z1, Z3, Z5, Z7, Z11)
	VMOVDQU32 256(DX), Z8
	VMOVDQU32 320(DX), Z9
	VMOVDQU32 384(DX), Z10
	VMOVDQU32 448(DX), Z11
	Q4STEP(16, Z0, Z2, Z4, Z6, Z8)
	Q4STEP(20, Z1, Z3, Z5, Z7, Z9)
	Q4STEP(24, Z0, Z2, Z4, Z6, Z10)
	Q4STEP(28, Z1, Z3, Z5, Z7, Z11)
	VMOVUPS (CX), Z12
	Q4ROW(0, Z0, Z1, Z16)
	Q4ROW(1, Z2, Z3, Z17)
	Q4ROW(2, Z4, Z5, Z18)
	Q4ROW(3, Z6, Z7, Z19)
	ADDQ $512, DX
	ADDQ $64, CX
	ADDQ $128, SI
	ADDQ $16, R8
	ADDQ $16, R9
	DECQ BX
	JNZ  block4
	VMOVUPS Z16, (DI)
	ADDQ AX, DI
	VMOVUPS Z17, (DI)
	ADDQ AX, DI
	VMOVUPS Z18, (DI)
	ADDQ AX, DI
	VMOVUPS Z19, (DI)
	VZEROUPPER
	RET

DATA q8absmask<>+0(SB)/4, $0x7fffffff
GLOBL q8absmask<>(SB), RODATA|NOPTR, $4
DATA q8f127<>+0(SB)/4, $127.0
GLOBL q8f127<>(SB), RODATA|NOPTR, $4
DATA q8f1<>+0(SB)/4, $1.0
GLOBL q8f1<>(SB), RODATA|NOPTR, $4
DATA q8minnormal<>+0(SB)/4, $0x00800000
GLOBL q8minnormal<>(SB), RODATA|NOPTR, $4

// func q8QuantAVX512(xq *int8, xs *float32, xc *int32, x *float32, nb int, step int)
//
// Quantises nb blocks of 32 floats of x as quantBlock does (int8.go): d = max|x|/127,
// q = x·(1/d) rounded to nearest even (0 where d is below the smallest normal float32), block b's q at
// xq[b*step*32], d at xs[b*step], 128·Σq at xc[b*step]. The values must be finite.
TEXT ·q8QuantAVX512(SB), NOSPLIT, $0-48
	MOVQ xq+0(FP), DI
	MOVQ xs+8(FP), R8
	MOVQ xc+16(FP), R9
	MOVQ x+24(FP), SI
	MOVQ nb+32(FP), CX
	MOVQ step+40(FP), DX
	MOVQ DX, BX
	SHLQ $5, BX // xq bytes a block
	SHLQ $2, DX // xs, xc bytes a block
	VBROADCASTSS q8absmask<>(SB), Z31
	VMOVSS q8f127<>(SB), X30
	VMOVSS q8f1<>(SB), X29
	VMOVSS q8minnormal<>(SB), X28

qblock:
	VMOVUPS (SI), Z0
	VMOVUPS 64(SI), Z1
	VANDPS  Z31, Z0, Z2
	VANDPS  Z31, Z1, Z3
	VMAXPS  Z3, Z2, Z2
	VEXTRACTF32X8 $1, Z2, Y3
	VMAXPS  Y3, Y2, Y2
	VEXTRACTF128 $1, Y2, X3
	VMAXPS  X3, X2, X2
	VPERMILPS $0x4E, X2, X3
	VMAXPS  X3, X2, X2
	VPERMILPS $0xB1, X2, X3
	VMAXPS  X3, X2, X2 // every lane: max|x|
	VDIVSS  X30, X2, X4 // d
	VMOVSS  X4, (R8)
	VXORPS  X5, X5, X5
	VUCOMISS X28, X4
	JCS     qzero // d below the smallest normal (0 included): 1/d would overflow; zeros
	VDIVSS  X4, X29, X5 // 1/d

qzero:
	VBROADCASTSS X5, Z5
	VMULPS  Z5, Z0, Z0
	VMULPS  Z5, Z1, Z1
	VCVTPS2DQ Z0, Z0
	VCVTPS2DQ Z1, Z1
	VPMOVDB Z0, (DI)
	VPMOVDB Z1, 16(DI)
	VPADDD  Z1, Z0, Z0
	VEXTRACTI32X8 $1, Z0, Y1
	VPADDD  Y1, Y0, Y0
	VEXTRACTI128 $1, Y0, X1
	VPADDD  X1, X0, X0
	VPSHUFD $0x4E, X0, X1
	VPADDD  X1, X0, X0
	VPSHUFD $0xB1, X0, X1
	VPADDD  X1, X0, X0
	VMOVD   X0, AX
	SHLL    $7, AX
	MOVL    AX, (R9)
	ADDQ    $128, SI
	ADDQ    BX, DI
	ADDQ    DX, R8
	ADDQ    DX, R9
	DECQ    CX
	JNZ     qblock
	VZEROUPPER
	RET

DATA q8perm<>+0(SB)/4, $0
DATA q8perm<>+4(SB)/4, $4
DATA q8perm<>+8(SB)/4, $1
DATA q8perm<>+12(SB)/4, $5
DATA q8perm<>+16(SB)/4, $2
DATA q8perm<>+20(SB)/4, $6
DATA q8perm<>+24(SB)/4, $3
DATA q8perm<>+28(SB)/4, $7
GLOBL q8perm<>(SB), RODATA|NOPTR, $32

// func q8QuantAVX2(xq *int8, xs *float32, xc *int32, x *float32, nb int, step int)
//
// q8QuantAVX512 in 8-lane registers (AVX2, no VPMOVDB): each block's 32 values as four
// registers, their int32s packed to int8 with saturation (VPACKSSDW, VPACKSSWB: the values
// are within ±127, so nothing saturates) and put back in order by VPERMD (the packs
// interleave the 128-bit lanes: dwords 0 4 1 5 2 6 3 7 hold values 0-3, 4-7, ...).
TEXT ·q8QuantAVX2(SB), NOSPLIT, $0-48
	MOVQ xq+0(FP), DI
	MOVQ xs+8(FP), R8
	MOVQ xc+16(FP), R9
	MOVQ x+24(FP), SI
	MOVQ nb+32(FP), CX
	MOVQ step+40(FP), DX
	MOVQ DX, BX
	SHLQ $5, BX // xq bytes a block
	SHLQ $2, DX // xs, xc bytes a block
	VBROADCASTSS q8absmask<>(SB), Y15
	VMOVDQU q8perm<>(SB), Y14
	VMOVSS q8f127<>(SB), X13
	VMOVSS q8f1<>(SB), X12
	VMOVSS q8minnormal<>(SB), X11

q2block:
	VMOVUPS (SI), Y0
	VMOVUPS 32(SI), Y1
	VMOVUPS 64(SI), Y2
	VMOVUPS 96(SI), Y3
	VANDPS  Y15, Y0, Y4
	VANDPS  Y15, Y1, Y5
	VANDPS  Y15, Y2, Y6
	VANDPS  Y15, Y3, Y7
	VMAXPS  Y5, Y4, Y4
	VMAXPS  Y7, Y6, Y6
	VMAXPS  Y6, Y4, Y4
	VEXTRACTF128 $1, Y4, X5
	VMAXPS  X5, X4, X4
	VPERMILPS $0x4E, X4, X5
	VMAXPS  X5, X4, X4
	VPERMILPS $0xB1, X4, X5
	VMAXPS  X5, X4, X4 // every lane: max|x|
	VDIVSS  X13, X4, X6 // d
	VMOVSS  X6, (R8)
	VXORPS  X7, X7, X7
	VUCOMISS X11, X6
	JCS     q2zero // d below the smallest normal (0 included): zeros, as quantBlock
	VDIVSS  X6, X12, X7 // 1/d

q2zero:
	VBROADCASTSS X7, Y7
	VMULPS  Y7, Y0, Y0
	VMULPS  Y7, Y1, Y1
	VMULPS  Y7, Y2, Y2
	VMULPS  Y7, Y3, Y3
	VCVTPS2DQ Y0, Y0
	VCVTPS2DQ Y1, Y1
	VCVTPS2DQ Y2, Y2
	VCVTPS2DQ Y3, Y3
	VPACKSSDW Y1, Y0, Y4
	VPACKSSDW Y3, Y2, Y5
	VPACKSSWB Y5, Y4, Y6
	VPERMD  Y6, Y14, Y6
	VMOVDQU Y6, (DI)
	VPADDD  Y1, Y0, Y0
	VPADDD  Y3, Y2, Y2
	VPADDD  Y2, Y0, Y0
	VEXTRACTI128 $1, Y0, X1
	VPADDD  X1, X0, X0
	VPSHUFD $0x4E, X0, X1
	VPADDD  X1, X0, X0
	VPSHUFD $0xB1, X0, X1
	VPADDD  X1, X0, X0
	VMOVD   X0, AX
	SHLL    $7, AX
	MOVL    AX, (R9)
	ADDQ    $128, SI
	ADDQ    BX, DI
	ADDQ    DX, R8
	ADDQ    DX, R9
	DECQ    CX
	JNZ     q2block
	VZEROUPPER
	RET

#define Q8PF 2048

DATA q8b80<>+0(SB)/4, $0x80808080
GLOBL q8b80<>(SB), RODATA|NOPTR, $4
DATA q8w1<>+0(SB)/4, $0x00010001
GLOBL q8w1<>(SB), RODATA|NOPTR, $4

// Q8A2STEP(s) adds step s of a block (4 values of 16 rows) to Y0 (rows 0-7) and Y1 (rows
// 8-15): q = byte ^ 0x80, signed by x and multiplied by |x| in pairs (VPMADDUBSW: at most
// 2·127·127, no saturation), the pairs summed to int32 (VPMADDWD by ones).
#define Q8A2STEP(s) \
	PREFETCHT0 (64*s+Q8PF)(DX) \
	VPBROADCASTD (4*s)(SI), Y2 \
	VPABSB     Y2, Y3 \
	VMOVDQU    (64*s)(DX), Y4 \
	VMOVDQU    (64*s+32)(DX), Y5 \
	VPXOR      Y15, Y4, Y4 \
	VPXOR      Y15, Y5, Y5 \
	VPSIGNB    Y2, Y4, Y4 \
	VPSIGNB    Y2, Y5, Y5 \
	VPMADDUBSW Y4, Y3, Y4 \
	VPMADDUBSW Y5, Y3, Y5 \
	VPMADDWD   Y14, Y4, Y4 \
	VPMADDWD   Y14, Y5, Y5 \
	VPADDD     Y4, Y0, Y0 \
	VPADDD     Y5, Y1, Y1

// func q8DotAVX2(out *float32, xq *int8, xs *float32, xstep int, w *uint8, ws *float32, nb int)
//
// q8Dot1VNNI on AVX2 (no VNNI): one activation row, its blocks xstep bytes apart in xq
// (their scales xstep/8 bytes apart in xs), against one weight group; the block sums are
// Σ q·xq exactly in int32, as the VNNI kernels' less their offset.
TEXT ·q8DotAVX2(SB), NOSPLIT, $0-56
	MOVQ out+0(FP), DI
	MOVQ xq+8(FP), SI
	MOVQ xs+16(FP), R8
	MOVQ xstep+24(FP), AX
	MOVQ w+32(FP), DX
	MOVQ ws+40(FP), CX
	MOVQ nb+48(FP), BX
	MOVQ AX, R10
	SHRQ $3, R10
	VPBROADCASTD q8b80<>(SB), Y15
	VPBROADCASTD q8w1<>(SB), Y14
	VXORPS Y10, Y10, Y10
	VXORPS Y11, Y11, Y11

a2block:
	VPXOR Y0, Y0, Y0
	VPXOR Y1, Y1, Y1
	Q8A2STEP(0)
	Q8A2STEP(1)
	Q8A2STEP(2)
	Q8A2STEP(3)
	Q8A2STEP(4)
	Q8A2STEP(5)
	Q8A2STEP(6)
	Q8A2STEP(7)
	VCVTDQ2PS Y0, Y0
	VCVTDQ2PS Y1, Y1
	VBROADCASTSS (R8), Y8
	VMULPS (CX), Y8, Y6
	VMULPS 32(CX), Y8, Y7
	VFMADD231PS Y6, Y0, Y10
	VFMADD231PS Y7, Y1, Y11
	ADDQ $512, DX
	ADDQ $64, CX
	ADDQ AX, SI
	ADDQ R10, R8
	DECQ BX
	JNZ  a2block
	VMOVUPS Y10, (DI)
	VMOVUPS Y11, 32(DI)
	VZEROUPPER
	RET

// Q8A4ROW(s, r, A0, A1) is row r's part of step s of q8Dot4AVX2: its 4 values at
// (32r + 4s)(SI) broadcast, signing the step's weights (Y8, Y9, already q) and multiplied
// by their magnitudes in pairs as in Q8A2STEP, into A0 and A1.
#define Q8A4ROW(s, r, A0, A1) \
	VPBROADCASTD (32*r+4*s)(SI), Y10 \
	VPABSB     Y10, Y11 \
	VPSIGNB    Y10, Y8, Y12 \
	VPSIGNB    Y10, Y9, Y13 \
	VPMADDUBSW Y12, Y11, Y12 \
	VPMADDUBSW Y13, Y11, Y13 \
	VPMADDWD   Y14, Y12, Y12 \
	VPMADDWD   Y14, Y13, Y13 \
	VPADDD     Y12, A0, A0 \
	VPADDD     Y13, A1, A1

// Q8A4STEP(s) is step s of a block of q8Dot4AVX2: the 64 bytes of weights loaded and
// made q once, then each of the 4 rows against them.
#define Q8A4STEP(s) \
	PREFETCHT0 (64*s+Q8PF)(DX) \
	VMOVDQU (64*s)(DX), Y8 \
	VMOVDQU (64*s+32)(DX), Y9 \
	VPXOR   Y15, Y8, Y8 \
	VPXOR   Y15, Y9, Y9 \
	Q8A4ROW(s, 0, Y0, Y1) \
	Q8A4ROW(s, 1, Y2, Y3) \
	Q8A4ROW(s, 2, Y4, Y5) \
	Q8A4ROW(s, 3, Y6, Y7)

// func q8Dot4AVX2(out *float32, ldo int, xq *int8, xs *float32, w *uint8, ws *float32, nb int)
//
// q8DotAVX2 on 4 activation rows at once (interleaved by block, as q8Dot4VNNI takes
// them), out's rows ldo apart: each step's weights are loaded and offset once for the 4
// rows, in place of once a row. The block sums of a row are its int32 accumulators
// (Y0–Y7, two a row); its float32 sums are kept in out itself, each block's added by the
// same FMA of the same values as q8DotAVX2's, so a row's results are q8DotAVX2's to the
// bit.
TEXT ·q8Dot4AVX2(SB), NOSPLIT, $0-56
	MOVQ out+0(FP), DI
	MOVQ ldo+8(FP), R9
	SHLQ $2, R9
	MOVQ xq+16(FP), SI
	MOVQ xs+24(FP), R8
	MOVQ w+32(FP), DX
	MOVQ ws+40(FP), CX
	MOVQ nb+48(FP), BX
	LEAQ (R9)(R9*2), R10
	ADDQ DI, R10 // out's row 3
	VPBROADCASTD q8b80<>(SB), Y15
	VPBROADCASTD q8w1<>(SB), Y14
	VXORPS  Y0, Y0, Y0
	VMOVUPS Y0, (DI)
	VMOVUPS Y0, 32(DI)
	VMOVUPS Y0, (DI)(R9*1)
	VMOVUPS Y0, 32(DI)(R9*1)
	VMOVUPS Y0, (DI)(R9*2)
	VMOVUPS Y0, 32(DI)(R9*2)
	VMOVUPS Y0, (R10)
	VMOVUPS Y0, 32(R10)

a4block:
	VPXOR Y0, Y0, Y0
	VPXOR Y1, Y1, Y1
	VPXOR Y2, Y2, Y2
	VPXOR Y3, Y3, Y3
	VPXOR Y4, Y4, Y4
	VPXOR Y5, Y5, Y5
	VPXOR Y6, Y6, Y6
	VPXOR Y7, Y7, Y7
	Q8A4STEP(0)
	Q8A4STEP(1)
	Q8A4STEP(2)
	Q8A4STEP(3)
	Q8A4STEP(4)
	Q8A4STEP(5)
	Q8A4STEP(6)
	Q8A4STEP(7)
	VCVTDQ2PS    Y0, Y0
	VCVTDQ2PS    Y1, Y1
	VBROADCASTSS 0(R8), Y8
	VMULPS       (CX), Y8, Y9
	VMULPS       32(CX), Y8, Y10
	VMOVUPS      (DI), Y11
	VMOVUPS      32(DI), Y12
	VFMADD231PS  Y9, Y0, Y11
	VFMADD231PS  Y10, Y1, Y12
	VMOVUPS      Y11, (DI)
	VMOVUPS      Y12, 32(DI)
	VCVTDQ2PS    Y2, Y2
	VCVTDQ2PS    Y3, Y3
	VBROADCASTSS 4(R8), Y8
	VMULPS       (CX), Y8, Y9
	VMULPS       32(CX), Y8, Y10
	VMOVUPS      (DI)(R9*1), Y11
	VMOVUPS      32(DI)(R9*1), Y12
	VFMADD231PS  Y9, Y2, Y11
	VFMADD231PS  Y10, Y3, Y12
	VMOVUPS      Y11, (DI)(R9*1)
	VMOVUPS      Y12, 32(DI)(R9*1)
	VCVTDQ2PS    Y4, Y4
	VCVTDQ2PS    Y5, Y5
	VBROADCASTSS 8(R8), Y8
	VMULPS       (CX), Y8, Y9
	VMULPS       32(CX), Y8, Y10
	VMOVUPS      (DI)(R9*2), Y11
	VMOVUPS      32(DI)(R9*2), Y12
	VFMADD231PS  Y9, Y4, Y11
	VFMADD231PS  Y10, Y5, Y12
	VMOVUPS      Y11, (DI)(R9*2)
	VMOVUPS      Y12, 32(DI)(R9*2)
	VCVTDQ2PS    Y6, Y6
	VCVTDQ2PS    Y7, Y7
	VBROADCASTSS 12(R8), Y8
	VMULPS       (CX), Y8, Y9
	VMULPS       32(CX), Y8, Y10
	VMOVUPS      (R10), Y11
	VMOVUPS      32(R10), Y12
	VFMADD231PS  Y9, Y6, Y11
	VFMADD231PS  Y10, Y7, Y12
	VMOVUPS      Y11, (R10)
	VMOVUPS      Y12, 32(R10)
	ADDQ $512, DX
	ADDQ $64, CX
	ADDQ $128, SI
	ADDQ $16, R8
	DECQ BX
	JNZ  a4block
	VZEROUPPER
	RET
