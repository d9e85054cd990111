#include "textflag.h"

// The AMX bf16 prefill product's three routines (amxbf16_amd64.go: amxBF16Gemm). Go's
// assembler has no AMX mnemonics, so each tile instruction is written as its VEX bytes,
// the instruction in Intel order in the comment beside it: TestAMXEncoding re-derives
// every such line's bytes from its comment.

// func amxBF16Kernel(cfg *amxTileConfig, c *float32, w *uint16, ldw int, b *uint32, kb int)
//
// Four 16×16 float32 tiles of wᵀ-side products for 32 of w's rows against 32 tokens:
// tile 2·hn+hm (1 KiB at c + 1024·(2·hn+hm), rows of 64 bytes) holds, at [i][j],
// Σ_k w[16·hn+i][k] · x[16·hm+j][k] over k < 32·kb. w is bfloat16 rows ldw bytes apart
// (tiles A: 16 rows by 32 k-values, loaded as stored); b is the tokens packed by
// amxPackBF16 (tiles B: per 32 k-values, 2 KiB: 16 k-pairs by 16 tokens' pairs, for
// tokens 0-15 and then 16-31). TDPBF16PS sums each pair's products in float32. The tile
// state is configured from cfg on entry and released on return.
TEXT ·amxBF16Kernel(SB), NOSPLIT, $0-48
	MOVQ cfg+0(FP), AX
	BYTE $0xc4; BYTE $0xe2; BYTE $0x78; BYTE $0x49; BYTE $0x00 // LDTILECFG [rax]
	MOVQ c+8(FP), DI
	MOVQ w+16(FP), SI
	MOVQ ldw+24(FP), CX
	MOVQ b+32(FP), DX
	MOVQ kb+40(FP), BX
	MOVQ CX, AX
	SHLQ $4, AX
	ADDQ SI, AX // w's rows 16-31
	MOVQ $64, R8
	BYTE $0xc4; BYTE $0xe2; BYTE $0x7b; BYTE $0x49; BYTE $0xc0 // TILEZERO tmm0
	BYTE $0xc4; BYTE $0xe2; BYTE $0x7b; BYTE $0x49; BYTE $0xc8 // TILEZERO tmm1
	BYTE $0xc4; BYTE $0xe2; BYTE $0x7b; BYTE $0x49; BYTE $0xd0 // TILEZERO tmm2
	BYTE $0xc4; BYTE $0xe2; BYTE $0x7b; BYTE $0x49; BYTE $0xd8 // TILEZERO tmm3

loop:
	BYTE $0xc4; BYTE $0xe2; BYTE $0x7b; BYTE $0x4b; BYTE $0x24; BYTE $0x0e // TILELOADD tmm4, [rsi+rcx*1]
	BYTE $0xc4; BYTE $0xe2; BYTE $0x7b; BYTE $0x4b; BYTE $0x2c; BYTE $0x08 // TILELOADD tmm5, [rax+rcx*1]
	BYTE $0xc4; BYTE $0xa2; BYTE $0x7b; BYTE $0x4b; BYTE $0x34; BYTE $0x02 // TILELOADD tmm6, [rdx+r8*1]
	BYTE $0xc4; BYTE $0xa2; BYTE $0x7b; BYTE $0x4b; BYTE $0xbc; BYTE $0x02; BYTE $0x00; BYTE $0x04; BYTE $0x00; BYTE $0x00 // TILELOADD tmm7, [rdx+r8*1+1024]
	BYTE $0xc4; BYTE $0xe2; BYTE $0x4a; BYTE $0x5c; BYTE $0xc4 // TDPBF16PS tmm0, tmm4, tmm6
	BYTE $0xc4; BYTE $0xe2; BYTE $0x42; BYTE $0x5c; BYTE $0xcc // TDPBF16PS tmm1, tmm4, tmm7
	BYTE $0xc4; BYTE $0xe2; BYTE $0x4a; BYTE $0x5c; BYTE $0xd5 // TDPBF16PS tmm2, tmm5, tmm6
	BYTE $0xc4; BYTE $0xe2; BYTE $0x42; BYTE $0x5c; BYTE $0xdd // TDPBF16PS tmm3, tmm5, tmm7
	ADDQ $64, SI
	ADDQ $64, AX
	ADDQ $2048, DX
	DECQ BX
	JNZ  loop

	BYTE $0xc4; BYTE $0xa2; BYTE $0x7a; BYTE $0x4b; BYTE $0x04; BYTE $0x07 // TILESTORED [rdi+r8*1], tmm0
	BYTE $0xc4; BYTE $0xa2; BYTE $0x7a; BYTE $0x4b; BYTE $0x8c; BYTE $0x07; BYTE $0x00; BYTE $0x04; BYTE $0x00; BYTE $0x00 // TILESTORED [rdi+r8*1+1024], tmm1
	BYTE $0xc4; BYTE $0xa2; BYTE $0x7a; BYTE $0x4b; BYTE $0x94; BYTE $0x07; BYTE $0x00; BYTE $0x08; BYTE $0x00; BYTE $0x00 // TILESTORED [rdi+r8*1+2048], tmm2
	BYTE $0xc4; BYTE $0xa2; BYTE $0x7a; BYTE $0x4b; BYTE $0x9c; BYTE $0x07; BYTE $0x00; BYTE $0x0c; BYTE $0x00; BYTE $0x00 // TILESTORED [rdi+r8*1+3072], tmm3
	BYTE $0xc4; BYTE $0xe2; BYTE $0x78; BYTE $0x49; BYTE $0xc0 // TILERELEASE
	RET

// func amxBF16Kernel64(cfg *amxTileConfig, c *float32, w *uint16, ldw int, b *uint32, kb int)
//
// amxBF16Kernel for 64 of w's rows against 16 tokens (a decode step's, or a batch's of at
// most 16): tile t (1 KiB at c + 1024·t) holds, at [i][j], Σ_k w[16·t+i][k] · x[j][k];
// b as amxBF16Kernel's (its tokens 0-15 only are read). Four of w's tiles load a step,
// twice amxBF16Kernel's, against one of the tokens': a decode's stream of w from memory
// has more lines in flight, and each of w's bytes takes one TDPBF16PS, not two.
TEXT ·amxBF16Kernel64(SB), NOSPLIT, $0-48
	MOVQ cfg+0(FP), AX
	BYTE $0xc4; BYTE $0xe2; BYTE $0x78; BYTE $0x49; BYTE $0x00 // LDTILECFG [rax]
	MOVQ c+8(FP), DI
	MOVQ w+16(FP), SI
	MOVQ ldw+24(FP), CX
	MOVQ b+32(FP), DX
	MOVQ kb+40(FP), BX
	MOVQ CX, AX
	SHLQ $4, AX
	ADDQ SI, AX // w's rows 16-31
	MOVQ CX, R9
	SHLQ $5, R9
	ADDQ SI, R9 // rows 32-47
	MOVQ CX, R10
	SHLQ $4, R10
	ADDQ R9, R10 // rows 48-63
	MOVQ $64, R8
	BYTE $0xc4; BYTE $0xe2; BYTE $0x7b; BYTE $0x49; BYTE $0xc0 // TILEZERO tmm0
	BYTE $0xc4; BYTE $0xe2; BYTE $0x7b; BYTE $0x49; BYTE $0xc8 // TILEZERO tmm1
	BYTE $0xc4; BYTE $0xe2; BYTE $0x7b; BYTE $0x49; BYTE $0xd0 // TILEZERO tmm2
	BYTE $0xc4; BYTE $0xe2; BYTE $0x7b; BYTE $0x49; BYTE $0xd8 // TILEZERO tmm3

loop64:
	BYTE $0xc4; BYTE $0xa2; BYTE $0x7b; BYTE $0x4b; BYTE $0x34; BYTE $0x02 // TILELOADD tmm6, [rdx+r8*1]
	BYTE $0xc4; BYTE $0xe2; BYTE $0x7b; BYTE $0x4b; BYTE $0x24; BYTE $0x0e // TILELOADD tmm4, [rsi+rcx*1]
	BYTE $0xc4; BYTE $0xe2; BYTE $0x7b; BYTE $0x4b; BYTE $0x2c; BYTE $0x08 // TILELOADD tmm5, [rax+rcx*1]
	BYTE $0xc4; BYTE $0xc2; BYTE $0x7b; BYTE $0x4b; BYTE $0x3c; BYTE $0x09 // TILELOADD tmm7, [r9+rcx*1]
	BYTE $0xc4; BYTE $0xe2; BYTE $0x4a; BYTE $0x5c; BYTE $0xc4 // TDPBF16PS tmm0, tmm4, tmm6
	BYTE $0xc4; BYTE $0xe2; BYTE $0x4a; BYTE $0x5c; BYTE $0xcd // TDPBF16PS tmm1, tmm5, tmm6
	BYTE $0xc4; BYTE $0xe2; BYTE $0x4a; BYTE $0x5c; BYTE $0xd7 // TDPBF16PS tmm2, tmm7, tmm6
	BYTE $0xc4; BYTE $0xc2; BYTE $0x7b; BYTE $0x4b; BYTE $0x24; BYTE $0x0a // TILELOADD tmm4, [r10+rcx*1]
	BYTE $0xc4; BYTE $0xe2; BYTE $0x4a; BYTE $0x5c; BYTE $0xdc // TDPBF16PS tmm3, tmm4, tmm6
	ADDQ $64, SI
	ADDQ $64, AX
	ADDQ $64, R9
	ADDQ $64, R10
	ADDQ $2048, DX
	DECQ BX
	JNZ  loop64

	BYTE $0xc4; BYTE $0xa2; BYTE $0x7a; BYTE $0x4b; BYTE $0x04; BYTE $0x07 // TILESTORED [rdi+r8*1], tmm0
	BYTE $0xc4; BYTE $0xa2; BYTE $0x7a; BYTE $0x4b; BYTE $0x8c; BYTE $0x07; BYTE $0x00; BYTE $0x04; BYTE $0x00; BYTE $0x00 // TILESTORED [rdi+r8*1+1024], tmm1
	BYTE $0xc4; BYTE $0xa2; BYTE $0x7a; BYTE $0x4b; BYTE $0x94; BYTE $0x07; BYTE $0x00; BYTE $0x08; BYTE $0x00; BYTE $0x00 // TILESTORED [rdi+r8*1+2048], tmm2
	BYTE $0xc4; BYTE $0xa2; BYTE $0x7a; BYTE $0x4b; BYTE $0x9c; BYTE $0x07; BYTE $0x00; BYTE $0x0c; BYTE $0x00; BYTE $0x00 // TILESTORED [rdi+r8*1+3072], tmm3
	BYTE $0xc4; BYTE $0xe2; BYTE $0x78; BYTE $0x49; BYTE $0xc0 // TILERELEASE
	RET

// amxIdx: 0, 16, ..., 240, the dword offsets of a tile's column (rows of 16 dwords).
DATA amxIdx<>+0(SB)/4, $0
DATA amxIdx<>+4(SB)/4, $16
DATA amxIdx<>+8(SB)/4, $32
DATA amxIdx<>+12(SB)/4, $48
DATA amxIdx<>+16(SB)/4, $64
DATA amxIdx<>+20(SB)/4, $80
DATA amxIdx<>+24(SB)/4, $96
DATA amxIdx<>+28(SB)/4, $112
DATA amxIdx<>+32(SB)/4, $128
DATA amxIdx<>+36(SB)/4, $144
DATA amxIdx<>+40(SB)/4, $160
DATA amxIdx<>+44(SB)/4, $176
DATA amxIdx<>+48(SB)/4, $192
DATA amxIdx<>+52(SB)/4, $208
DATA amxIdx<>+56(SB)/4, $224
DATA amxIdx<>+60(SB)/4, $240
GLOBL amxIdx<>(SB), RODATA|NOPTR, $64

// func amxPackBF16(dst *uint32, x *float32, ldx int, rows int, kb int)
//
// Packs rows (1 to 32) tokens of x (float32 rows ldx floats apart, 32·kb values each) as
// amxBF16Kernel's b: each value rounded to bfloat16 (ties to even; a NaN stays a NaN, as
// BF16 rounds), a pair of them per uint32 (the lower half the first), token j's pair p of
// k-block q at dst[q·512 + (j/16)·256 + p·16 + j%16]. Tokens rows to 31 are not written.
TEXT ·amxPackBF16(SB), NOSPLIT, $0-40
	MOVQ dst+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ ldx+16(FP), R9
	SHLQ $2, R9
	MOVQ rows+24(FP), R10
	MOVQ kb+32(FP), R11
	VMOVDQU32 amxIdx<>(SB), Z20
	MOVL $1, AX
	VPBROADCASTD AX, Z21 // the lsb
	MOVL $0x7fff, AX
	VPBROADCASTD AX, Z22 // the rounding bias
	MOVL $0x7fffffff, AX
	VPBROADCASTD AX, Z23 // |·|
	MOVL $0x7f800000, AX
	VPBROADCASTD AX, Z24 // above it: NaN
	MOVL $0x40, AX
	VPBROADCASTD AX, Z25 // a NaN's quiet bit, in bfloat16
	XORQ R12, R12 // j

token:
	MOVQ R12, R13
	ANDQ $15, R13
	SHLQ $2, R13
	MOVQ R12, R14
	SHRQ $4, R14
	SHLQ $10, R14
	ADDQ R14, R13
	ADDQ DI, R13 // dst + (j/16)·1024 + (j%16)·4 bytes
	MOVQ SI, R14
	MOVQ R11, CX

block:
	VMOVDQU32 (R14), Z0
	VMOVDQU32 64(R14), Z1
	VPSRLD    $16, Z0, Z2
	VPANDD    Z21, Z2, Z2
	VPADDD    Z22, Z2, Z2
	VPADDD    Z0, Z2, Z2
	VPSRLD    $16, Z2, Z2
	VPANDD    Z23, Z0, Z4
	VPCMPUD   $6, Z24, Z4, K1
	VPSRLD    $16, Z0, Z4
	VPORD     Z25, Z4, Z4
	VMOVDQA32 Z4, K1, Z2
	VPSRLD    $16, Z1, Z3
	VPANDD    Z21, Z3, Z3
	VPADDD    Z22, Z3, Z3
	VPADDD    Z1, Z3, Z3
	VPSRLD    $16, Z3, Z3
	VPANDD    Z23, Z1, Z4
	VPCMPUD   $6, Z24, Z4, K1
	VPSRLD    $16, Z1, Z4
	VPORD     Z25, Z4, Z4
	VMOVDQA32 Z4, K1, Z3
	VPMOVDW   Z2, Y2
	VPMOVDW   Z3, Y3
	VINSERTI64X4 $1, Y3, Z2, Z2
	KXNORW    K2, K2, K2
	VPSCATTERDD Z2, K2, (R13)(Z20*4)
	ADDQ      $128, R14
	ADDQ      $2048, R13
	DECQ      CX
	JNZ       block

	ADDQ R9, SI
	INCQ R12
	CMPQ R12, R10
	JLT  token
	VZEROUPPER
	RET

// func amxStoreT(out *float32, ldo int, c *float32, rows int, mask0, mask1 uint16)
//
// Writes amxBF16Kernel's tiles c, transposed, as rows (1 to 32) tokens' outputs: token j's
// 32 values (w's rows) to out[j·ldo ...], the first 16 where mask0 has their bit, the next
// 16 where mask1 has.
TEXT ·amxStoreT(SB), NOSPLIT, $0-36
	MOVQ out+0(FP), DI
	MOVQ ldo+8(FP), R9
	SHLQ $2, R9
	MOVQ c+16(FP), SI
	MOVQ rows+24(FP), R10
	KMOVW mask0+32(FP), K3
	KMOVW mask1+34(FP), K4
	VMOVDQU32 amxIdx<>(SB), Z20
	XORQ R12, R12

row:
	MOVQ R12, R13
	ANDQ $15, R13
	SHLQ $2, R13
	MOVQ R12, R14
	SHRQ $4, R14
	SHLQ $10, R14
	ADDQ R14, R13
	ADDQ SI, R13 // tile hm = j/16 (hn 0), column j%16
	KXNORW K1, K1, K1
	VPGATHERDD (R13)(Z20*4), K1, Z0
	KXNORW K2, K2, K2
	VPGATHERDD 2048(R13)(Z20*4), K2, Z1 // tile 2+hm: w's rows 16-31
	VMOVUPS Z0, K3, (DI)
	VMOVUPS Z1, K4, 64(DI)
	ADDQ R9, DI
	INCQ R12
	CMPQ R12, R10
	JLT  row
	VZEROUPPER
	RET

// func amxStoreT64(out *float32, ldo int, c *float32, rows int, mask0, mask1, mask2, mask3 uint16)
//
// amxStoreT for amxBF16Kernel64's tiles: token j's (j < rows ≤ 16) 64 values to
// out[j·ldo ...], the 16 of tile t where mask t has their bit.
TEXT ·amxStoreT64(SB), NOSPLIT, $0-40
	MOVQ out+0(FP), DI
	MOVQ ldo+8(FP), R9
	SHLQ $2, R9
	MOVQ c+16(FP), SI
	MOVQ rows+24(FP), R10
	KMOVW mask0+32(FP), K3
	KMOVW mask1+34(FP), K4
	KMOVW mask2+36(FP), K5
	KMOVW mask3+38(FP), K6
	VMOVDQU32 amxIdx<>(SB), Z20
	XORQ R12, R12

row64:
	LEAQ (SI)(R12*4), R13 // column j of each tile
	KXNORW K1, K1, K1
	VPGATHERDD (R13)(Z20*4), K1, Z0
	KXNORW K1, K1, K1
	VPGATHERDD 1024(R13)(Z20*4), K1, Z1
	KXNORW K1, K1, K1
	VPGATHERDD 2048(R13)(Z20*4), K1, Z2
	KXNORW K1, K1, K1
	VPGATHERDD 3072(R13)(Z20*4), K1, Z3
	VMOVUPS Z0, K3, (DI)
	VMOVUPS Z1, K4, 64(DI)
	VMOVUPS Z2, K5, 128(DI)
	VMOVUPS Z3, K6, 192(DI)
	ADDQ R9, DI
	INCQ R12
	CMPQ R12, R10
	JLT  row64
	VZEROUPPER
	RET
