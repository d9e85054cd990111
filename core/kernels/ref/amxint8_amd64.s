#include "textflag.h"

// The AMX int8 prefill product's kernel (amxint8_amd64.go: amxInt8Gemm). Go's assembler
// has no AMX mnemonics: each tile instruction is its VEX bytes, the instruction in Intel
// order beside it (TestAMXEncoding re-derives them).

// Q8ROW(off, acc): token row off/64 of a block's int32 tile at R12: its dot products less
// the row's 128·Σ xq (xc at R13), in float32, times the weights' scales (Z16) times the
// row's (xs at R15), added to acc; R13 and R15 step to the next row's (R14 bytes on).
// q8Dot1VNNI's sums, in its order.
#define Q8ROW(off, acc) \
	VMOVDQU32   off(R12), Z17 \
	VPSUBD.BCST (R13), Z17, Z17 \
	VCVTDQ2PS   Z17, Z17 \
	VMULPS.BCST (R15), Z16, Z19 \
	VFMADD231PS Z19, Z17, acc \
	ADDQ        R14, R13 \
	ADDQ        R14, R15

// SCALE(wsoff) scales the tile at R12 into the accumulators: the block's weight scales at
// wsoff(R9), its tokens' from R11 (xc) and R10 (xs).
#define SCALE(wsoff) \
	VMOVUPS wsoff(R9), Z16 \
	MOVQ    R11, R13 \
	MOVQ    R10, R15 \
	Q8ROW(0, Z0) \
	Q8ROW(64, Z1) \
	Q8ROW(128, Z2) \
	Q8ROW(192, Z3) \
	Q8ROW(256, Z4) \
	Q8ROW(320, Z5) \
	Q8ROW(384, Z6) \
	Q8ROW(448, Z7) \
	Q8ROW(512, Z8) \
	Q8ROW(576, Z9) \
	Q8ROW(640, Z10) \
	Q8ROW(704, Z11) \
	Q8ROW(768, Z12) \
	Q8ROW(832, Z13) \
	Q8ROW(896, Z14) \
	Q8ROW(960, Z15)

// func amxInt8Kernel(cfg *amxTileConfig, a *amxInt8Args)
//
// a.groups groups of 16 tokens of quantised activations against one group of 16 rows of
// an Int8Matrix (the tile state configured once for them), block by block: each block's 32 values an exact int32 tile (TDPBSUD: the tokens' int8
// against the weights' q+128), stored to a.scratch and scaled into the tokens' float32
// sums as q8Dot1VNNI scales its block (Q8ROW); then each group's tokens' 16 outputs to
// a.out, a.ldo floats apart, the columns a.mask has (the last group's first a.rows
// tokens only), a.out, a.xq, a.xs and a.xc stepping on a group each time (a.groups
// counts down to 0). The tokens are a.xq's rows, a.ldx
// bytes apart (block b at 32·b), their scales and offsets a.xs and a.xc (a row's nb apart);
// the weights a.wq and a.ws (group-interleaved: a block's 8 steps of 16 rows of 4 bytes is
// one tile of 8 rows of 64 bytes). Blocks go two at a time, in tiles 0 and 1 stored to
// the scratch's two halves, so that the second's product runs while the first's is scaled.
TEXT ·amxInt8Kernel(SB), NOSPLIT, $0-16
	MOVQ cfg+0(FP), AX
	BYTE $0xc4; BYTE $0xe2; BYTE $0x78; BYTE $0x49; BYTE $0x00 // LDTILECFG [rax]
	MOVQ a+8(FP), AX

group:
	MOVQ 16(AX), SI // xq
	MOVQ 24(AX), CX // ldx
	MOVQ 32(AX), R10 // xs
	MOVQ 40(AX), R11 // xc
	MOVQ 48(AX), DX // wq
	MOVQ 56(AX), R9 // ws
	MOVQ 64(AX), BX // nb
	MOVQ 72(AX), R12 // scratch: two tiles
	MOVQ BX, R14
	SHLQ $2, R14 // a token's stride in xs and xc
	MOVQ $64, R8
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	VPXORD Z2, Z2, Z2
	VPXORD Z3, Z3, Z3
	VPXORD Z4, Z4, Z4
	VPXORD Z5, Z5, Z5
	VPXORD Z6, Z6, Z6
	VPXORD Z7, Z7, Z7
	VPXORD Z8, Z8, Z8
	VPXORD Z9, Z9, Z9
	VPXORD Z10, Z10, Z10
	VPXORD Z11, Z11, Z11
	VPXORD Z12, Z12, Z12
	VPXORD Z13, Z13, Z13
	VPXORD Z14, Z14, Z14
	VPXORD Z15, Z15, Z15

	CMPQ BX, $2
	JLT  last

pair:
	BYTE $0xc4; BYTE $0xe2; BYTE $0x7b; BYTE $0x49; BYTE $0xc0 // TILEZERO tmm0
	BYTE $0xc4; BYTE $0xe2; BYTE $0x7b; BYTE $0x49; BYTE $0xc8 // TILEZERO tmm1
	BYTE $0xc4; BYTE $0xe2; BYTE $0x7b; BYTE $0x4b; BYTE $0x24; BYTE $0x0e // TILELOADD tmm4, [rsi+rcx*1]
	BYTE $0xc4; BYTE $0xa2; BYTE $0x7b; BYTE $0x4b; BYTE $0x34; BYTE $0x02 // TILELOADD tmm6, [rdx+r8*1]
	BYTE $0xc4; BYTE $0xe2; BYTE $0x7b; BYTE $0x4b; BYTE $0x6c; BYTE $0x0e; BYTE $0x20 // TILELOADD tmm5, [rsi+rcx*1+32]
	BYTE $0xc4; BYTE $0xa2; BYTE $0x7b; BYTE $0x4b; BYTE $0xbc; BYTE $0x02; BYTE $0x00; BYTE $0x02; BYTE $0x00; BYTE $0x00 // TILELOADD tmm7, [rdx+r8*1+512]
	BYTE $0xc4; BYTE $0xe2; BYTE $0x4a; BYTE $0x5e; BYTE $0xc4 // TDPBSUD tmm0, tmm4, tmm6
	BYTE $0xc4; BYTE $0xe2; BYTE $0x42; BYTE $0x5e; BYTE $0xcd // TDPBSUD tmm1, tmm5, tmm7
	BYTE $0xc4; BYTE $0x82; BYTE $0x7a; BYTE $0x4b; BYTE $0x04; BYTE $0x04 // TILESTORED [r12+r8*1], tmm0
	BYTE $0xc4; BYTE $0x82; BYTE $0x7a; BYTE $0x4b; BYTE $0x8c; BYTE $0x04; BYTE $0x00; BYTE $0x04; BYTE $0x00; BYTE $0x00 // TILESTORED [r12+r8*1+1024], tmm1
	SCALE(0)
	ADDQ $4, R10
	ADDQ $4, R11
	ADDQ $1024, R12
	SCALE(64)
	SUBQ $1024, R12
	ADDQ $4, R10
	ADDQ $4, R11
	ADDQ $64, SI
	ADDQ $1024, DX
	ADDQ $128, R9
	SUBQ $2, BX
	CMPQ BX, $2
	JGE  pair

last:
	TESTQ BX, BX
	JZ    release
	BYTE $0xc4; BYTE $0xe2; BYTE $0x7b; BYTE $0x49; BYTE $0xc0 // TILEZERO tmm0
	BYTE $0xc4; BYTE $0xe2; BYTE $0x7b; BYTE $0x4b; BYTE $0x24; BYTE $0x0e // TILELOADD tmm4, [rsi+rcx*1]
	BYTE $0xc4; BYTE $0xa2; BYTE $0x7b; BYTE $0x4b; BYTE $0x34; BYTE $0x02 // TILELOADD tmm6, [rdx+r8*1]
	BYTE $0xc4; BYTE $0xe2; BYTE $0x4a; BYTE $0x5e; BYTE $0xc4 // TDPBSUD tmm0, tmm4, tmm6
	BYTE $0xc4; BYTE $0x82; BYTE $0x7a; BYTE $0x4b; BYTE $0x04; BYTE $0x04 // TILESTORED [r12+r8*1], tmm0
	SCALE(0)

release:
	MOVQ  0(AX), DI // out
	MOVQ  8(AX), R8
	SHLQ  $2, R8
	MOVQ  $16, CX // a group's rows; the last group's a.rows
	CMPQ  96(AX), $1
	JGT   full
	MOVQ  80(AX), CX

full:
	KMOVW 88(AX), K1 // mask
	VMOVUPS Z0, K1, (DI)
	CMPQ CX, $2
	JLT  stored
	ADDQ R8, DI
	VMOVUPS Z1, K1, (DI)
	CMPQ CX, $3
	JLT  stored
	ADDQ R8, DI
	VMOVUPS Z2, K1, (DI)
	CMPQ CX, $4
	JLT  stored
	ADDQ R8, DI
	VMOVUPS Z3, K1, (DI)
	CMPQ CX, $5
	JLT  stored
	ADDQ R8, DI
	VMOVUPS Z4, K1, (DI)
	CMPQ CX, $6
	JLT  stored
	ADDQ R8, DI
	VMOVUPS Z5, K1, (DI)
	CMPQ CX, $7
	JLT  stored
	ADDQ R8, DI
	VMOVUPS Z6, K1, (DI)
	CMPQ CX, $8
	JLT  stored
	ADDQ R8, DI
	VMOVUPS Z7, K1, (DI)
	CMPQ CX, $9
	JLT  stored
	ADDQ R8, DI
	VMOVUPS Z8, K1, (DI)
	CMPQ CX, $10
	JLT  stored
	ADDQ R8, DI
	VMOVUPS Z9, K1, (DI)
	CMPQ CX, $11
	JLT  stored
	ADDQ R8, DI
	VMOVUPS Z10, K1, (DI)
	CMPQ CX, $12
	JLT  stored
	ADDQ R8, DI
	VMOVUPS Z11, K1, (DI)
	CMPQ CX, $13
	JLT  stored
	ADDQ R8, DI
	VMOVUPS Z12, K1, (DI)
	CMPQ CX, $14
	JLT  stored
	ADDQ R8, DI
	VMOVUPS Z13, K1, (DI)
	CMPQ CX, $15
	JLT  stored
	ADDQ R8, DI
	VMOVUPS Z14, K1, (DI)
	CMPQ CX, $16
	JLT  stored
	ADDQ R8, DI
	VMOVUPS Z15, K1, (DI)

stored:
	// The next group of 16 tokens: out 16 rows on, xq, xs and xc 16 tokens on.
	MOVQ R8, DI
	SHLQ $4, DI
	ADDQ DI, 0(AX)
	MOVQ 24(AX), DI
	SHLQ $4, DI
	ADDQ DI, 16(AX)
	MOVQ R14, DI
	SHLQ $4, DI
	ADDQ DI, 32(AX)
	ADDQ DI, 40(AX)
	DECQ 96(AX)
	JNZ  group
	BYTE $0xc4; BYTE $0xe2; BYTE $0x78; BYTE $0x49; BYTE $0xc0 // TILERELEASE

done:
	VZEROUPPER
	RET
