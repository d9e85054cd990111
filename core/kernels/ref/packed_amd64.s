#include "textflag.h"

// The packed-weight kernels of packed_amd64.go: FP8 e4m3 and FP4 e2m1 weights widened to
// float32 in registers as they are read, for a dot product with a row of activations
// (decode) or into scratch for the float32 GEMM (batches).
//
// e4m3 to float32 (fp8 kernels): the byte sign-extended to 16 bits and shifted up by 7
// puts its exponent and mantissa in bits 7–13 and its sign in bits 14–15; masked with
// 0xbf80 it is the float16 whose value is the e4m3's over 2^8 (e4m3's subnormals are
// float16 subnormals), which VCVTPH2PS widens exactly. The 2^8 goes into the scales (the
// dot kernels multiply their sum by 256 once, the widening kernel its scale). No float32
// subnormal arises: on this path they cost the CPU a microcode assist per vector. The NaN
// codes 0x7f and 0xff read as ±480 (a checkpoint holds none).
//
// e2m1 to float32 (fp4 kernels): a nibble indexes a 16-entry table (VPERMPS uses an
// index's low 4 bits); on AVX2 an 8-entry table of magnitudes, the nibble's bit 3 the sign.

#define E4M3MASK $0xbf80bf80
#define F32_256 $0x43800000

// BCAST32 sets every dword of vec to the 32-bit constant imm (through AX and x, vec's X
// register).
#define BCAST32(imm, x, vec) \
	MOVL         imm, AX; \
	MOVQ         AX, x; \
	VPBROADCASTD x, vec

// HSUM8 sums Y0's 8 lanes into X0's lowest (X1 is scratch).
#define HSUM8 \
	VEXTRACTF128 $1, Y0, X1; \
	VADDPS       X1, X0, X0; \
	VHADDPS      X0, X0, X0; \
	VHADDPS      X0, X0, X0

// MUL256 multiplies X0's lowest by 2^8 (the fp8 dot products' sum; X1 is scratch).
#define MUL256 \
	MOVL   F32_256, AX; \
	MOVQ   AX, X1; \
	VMULSS X1, X0, X0

// func cpuid1ECX() uint32
//
// CPUID leaf 1's ECX (bit 29: F16C).
TEXT ·cpuid1ECX(SB), NOSPLIT, $0-4
	MOVL  $1, AX
	XORL  CX, CX
	CPUID
	MOVL  CX, ret+0(FP)
	RET

// func fp8DotAVX512(x *float32, w *uint8, s *float32, nb, bc int) float32
//
// Σ_b s[b]·(Σ_j<bc x[b·bc+j]·e4m3(w[b·bc+j])) over nb > 0 blocks of bc columns, bc a
// positive multiple of 16.
TEXT ·fp8DotAVX512(SB), NOSPLIT, $0-44
	MOVQ         x+0(FP), DI
	MOVQ         w+8(FP), SI
	MOVQ         s+16(FP), BX
	MOVQ         nb+24(FP), CX
	MOVQ         bc+32(FP), DX
	BCAST32(E4M3MASK, X14, Y14)
	VXORPS       Z0, Z0, Z0

fp8b512:
	VXORPS Z1, Z1, Z1
	VXORPS Z2, Z2, Z2
	MOVQ   DX, R8

fp8l512:
	CMPQ        R8, $32
	JLT         fp8t512
	VPMOVSXBW   (SI), Y8
	VPMOVSXBW   16(SI), Y9
	VPSLLW      $7, Y8, Y8
	VPSLLW      $7, Y9, Y9
	VPAND       Y14, Y8, Y8
	VPAND       Y14, Y9, Y9
	VCVTPH2PS   Y8, Z8
	VCVTPH2PS   Y9, Z9
	VFMADD231PS (DI), Z8, Z1
	VFMADD231PS 64(DI), Z9, Z2
	ADDQ        $32, SI
	ADDQ        $128, DI
	SUBQ        $32, R8
	JMP         fp8l512

fp8t512:
	TESTQ       R8, R8
	JZ          fp8d512
	VPMOVSXBW   (SI), Y8
	VPSLLW      $7, Y8, Y8
	VPAND       Y14, Y8, Y8
	VCVTPH2PS   Y8, Z8
	VFMADD231PS (DI), Z8, Z1
	ADDQ        $16, SI
	ADDQ        $64, DI

fp8d512:
	VADDPS       Z2, Z1, Z1
	VBROADCASTSS (BX), Z3
	VFMADD231PS  Z3, Z1, Z0
	ADDQ         $4, BX
	DECQ         CX
	JNZ          fp8b512

	VEXTRACTF64X4 $1, Z0, Y1
	VADDPS        Y1, Y0, Y0
	HSUM8
	MUL256
	MOVSS X0, ret+40(FP)
	VZEROUPPER
	RET

// FP8X16 sets a and b (Y registers) to the float32 of the 16 e4m3 bytes at off(SI), over
// 2^8: a the first 8. Y14 holds the mask; b is scratch first, xb its X register.
#define FP8X16(off, a, b, xb) \
	VPMOVSXBW    off(SI), b; \
	VPSLLW       $7, b, b; \
	VPAND        Y14, b, b; \
	VCVTPH2PS    xb, a; \
	VEXTRACTI128 $1, b, xb; \
	VCVTPH2PS    xb, b

// func fp8DotAVX2(x *float32, w *uint8, s *float32, nb, bc int) float32
//
// fp8DotAVX512 in 8 lanes.
TEXT ·fp8DotAVX2(SB), NOSPLIT, $0-44
	MOVQ         x+0(FP), DI
	MOVQ         w+8(FP), SI
	MOVQ         s+16(FP), BX
	MOVQ         nb+24(FP), CX
	MOVQ         bc+32(FP), DX
	BCAST32(E4M3MASK, X14, Y14)
	VXORPS       Y0, Y0, Y0

fp8b2:
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	MOVQ   DX, R8

fp8l2:
	FP8X16(0, Y8, Y9, X9)
	VFMADD231PS (DI), Y8, Y1
	VFMADD231PS 32(DI), Y9, Y2
	ADDQ        $16, SI
	ADDQ        $64, DI
	SUBQ        $16, R8
	JNZ         fp8l2

	VADDPS       Y2, Y1, Y1
	VBROADCASTSS (BX), Y3
	VFMADD231PS  Y3, Y1, Y0
	ADDQ         $4, BX
	DECQ         CX
	JNZ          fp8b2

	HSUM8
	MUL256
	MOVSS X0, ret+40(FP)
	VZEROUPPER
	RET

// func fp8WidenAVX2(dst *float32, w *uint8, s *float32, nb, bc int)
//
// dst[b·bc+j] = e4m3(w[b·bc+j])·s[b] for nb > 0 blocks of bc columns, bc a positive
// multiple of 16: the float32 product, as weights.DequantFP8 rounds it (the e4m3 over 2^8
// times the scale times 2^8, both exact).
TEXT ·fp8WidenAVX2(SB), NOSPLIT, $0-40
	MOVQ         dst+0(FP), DI
	MOVQ         w+8(FP), SI
	MOVQ         s+16(FP), BX
	MOVQ         nb+24(FP), CX
	MOVQ         bc+32(FP), DX
	BCAST32(E4M3MASK, X14, Y14)
	BCAST32(F32_256, X15, Y15)

fp8wb:
	VBROADCASTSS (BX), Y3
	VMULPS       Y15, Y3, Y3
	MOVQ         DX, R8

fp8wl:
	FP8X16(0, Y8, Y9, X9)
	VMULPS  Y3, Y8, Y8
	VMULPS  Y3, Y9, Y9
	VMOVUPS Y8, (DI)
	VMOVUPS Y9, 32(DI)
	ADDQ    $16, SI
	ADDQ    $64, DI
	SUBQ    $16, R8
	JNZ     fp8wl

	ADDQ $4, BX
	DECQ CX
	JNZ  fp8wb
	VZEROUPPER
	RET

// func fp4DotAVX512(xd *float32, w *uint8, s *float32, ng int, lut *float32) float32
//
// Σ_g s[g]·(Σ_t<16 xd[32g+t]·e2m1(lo nibble of w[16g+t]) + xd[32g+16+t]·e2m1(hi nibble))
// over ng > 0 groups of 32: xd holds each group of a row of activations with its even
// columns first, then its odd ones (the low and high nibbles' columns). lut is the 16
// e2m1 values.
TEXT ·fp4DotAVX512(SB), NOSPLIT, $0-44
	MOVQ    xd+0(FP), DI
	MOVQ    w+8(FP), SI
	MOVQ    s+16(FP), BX
	MOVQ    ng+24(FP), CX
	MOVQ    lut+32(FP), AX
	VMOVUPS (AX), Z29
	VXORPS  Z0, Z0, Z0
	VXORPS  Z1, Z1, Z1

fp4l512:
	CMPQ         CX, $2
	JLT          fp4t512
	VPMOVZXBD    (SI), Z8
	VPMOVZXBD    16(SI), Z10
	VPSRLD       $4, Z8, Z9
	VPSRLD       $4, Z10, Z11
	VPERMPS      Z29, Z8, Z8
	VPERMPS      Z29, Z9, Z9
	VPERMPS      Z29, Z10, Z10
	VPERMPS      Z29, Z11, Z11
	VMULPS       (DI), Z8, Z8
	VMULPS       128(DI), Z10, Z10
	VFMADD231PS  64(DI), Z9, Z8
	VFMADD231PS  192(DI), Z11, Z10
	VBROADCASTSS (BX), Z3
	VBROADCASTSS 4(BX), Z4
	VFMADD231PS  Z3, Z8, Z0
	VFMADD231PS  Z4, Z10, Z1
	ADDQ         $32, SI
	ADDQ         $256, DI
	ADDQ         $8, BX
	SUBQ         $2, CX
	JMP          fp4l512

fp4t512:
	TESTQ        CX, CX
	JZ           fp4d512
	VPMOVZXBD    (SI), Z8
	VPSRLD       $4, Z8, Z9
	VPERMPS      Z29, Z8, Z8
	VPERMPS      Z29, Z9, Z9
	VMULPS       (DI), Z8, Z8
	VFMADD231PS  64(DI), Z9, Z8
	VBROADCASTSS (BX), Z3
	VFMADD231PS  Z3, Z8, Z0

fp4d512:
	VADDPS        Z1, Z0, Z0
	VEXTRACTF64X4 $1, Z0, Y1
	VADDPS        Y1, Y0, Y0
	HSUM8
	MOVSS         X0, ret+40(FP)
	VZEROUPPER
	RET

// FP4NIB8 sets Y(val) to the e2m1 values of the 8 nibbles in the low nibbles of the dwords
// of Y(idx) (higher bits of each dword zero): an 8-entry magnitude table in Y13, the
// sign (bit 3) moved to bit 31 and masked by Y14. Y12 is scratch.
#define FP4NIB8(idx, val) \
	VPSLLD  $28, idx, Y12; \
	VPAND   Y14, Y12, Y12; \
	VPERMPS Y13, idx, val; \
	VXORPS  Y12, val, val

// func fp4DotAVX2(xd *float32, w *uint8, s *float32, ng int, lut *float32) float32
//
// fp4DotAVX512 in 8 lanes; lut's first 8 values are the magnitudes.
TEXT ·fp4DotAVX2(SB), NOSPLIT, $0-44
	MOVQ         xd+0(FP), DI
	MOVQ         w+8(FP), SI
	MOVQ         s+16(FP), BX
	MOVQ         ng+24(FP), CX
	MOVQ         lut+32(FP), AX
	VMOVUPS      (AX), Y13
	BCAST32($0x80000000, X14, Y14)
	VXORPS       Y0, Y0, Y0

fp4l2:
	VPMOVZXBD    (SI), Y8
	VPMOVZXBD    8(SI), Y10
	VPSRLD       $4, Y8, Y9
	VPSRLD       $4, Y10, Y11
	FP4NIB8(Y8, Y4)
	FP4NIB8(Y9, Y5)
	FP4NIB8(Y10, Y6)
	FP4NIB8(Y11, Y7)
	VMULPS       (DI), Y4, Y4
	VMULPS       32(DI), Y6, Y6
	VFMADD231PS  64(DI), Y5, Y4
	VFMADD231PS  96(DI), Y7, Y6
	VADDPS       Y6, Y4, Y4
	VBROADCASTSS (BX), Y3
	VFMADD231PS  Y3, Y4, Y0
	ADDQ         $16, SI
	ADDQ         $128, DI
	ADDQ         $4, BX
	DECQ         CX
	JNZ          fp4l2

	HSUM8
	MOVSS        X0, ret+40(FP)
	VZEROUPPER
	RET

// func fp4WidenAVX2(dst *float32, w *uint8, s *float32, ng int, lut *float32)
//
// dst[32g+c] = e2m1(nibble c of group g)·s[g] for ng > 0 groups of 32 columns (column 2t
// the low nibble of w[16g+t], 2t+1 its high one), as weights.DequantFP4 rounds it; lut as
// fp4DotAVX2's.
TEXT ·fp4WidenAVX2(SB), NOSPLIT, $0-40
	MOVQ         dst+0(FP), DI
	MOVQ         w+8(FP), SI
	MOVQ         s+16(FP), BX
	MOVQ         ng+24(FP), CX
	MOVQ         lut+32(FP), AX
	VMOVUPS      (AX), Y13
	BCAST32($0x80000000, X14, Y14)
	BCAST32($0x0f0f0f0f, X15, X15)

fp4w2:
	VMOVDQU      (SI), X8
	VPSRLW       $4, X8, X9
	VPAND        X15, X8, X8
	VPAND        X15, X9, X9
	VPUNPCKLBW   X9, X8, X10
	VPUNPCKHBW   X9, X8, X11
	VBROADCASTSS (BX), Y3
	VPMOVZXBD    X10, Y4
	VPSHUFD      $0x4e, X10, X10
	VPMOVZXBD    X10, Y5
	VPMOVZXBD    X11, Y6
	VPSHUFD      $0x4e, X11, X11
	VPMOVZXBD    X11, Y7
	FP4NIB8(Y4, Y4)
	FP4NIB8(Y5, Y5)
	FP4NIB8(Y6, Y6)
	FP4NIB8(Y7, Y7)
	VMULPS       Y3, Y4, Y4
	VMULPS       Y3, Y5, Y5
	VMULPS       Y3, Y6, Y6
	VMULPS       Y3, Y7, Y7
	VMOVUPS      Y4, (DI)
	VMOVUPS      Y5, 32(DI)
	VMOVUPS      Y6, 64(DI)
	VMOVUPS      Y7, 96(DI)
	ADDQ         $16, SI
	ADDQ         $128, DI
	ADDQ         $4, BX
	DECQ         CX
	JNZ          fp4w2
	VZEROUPPER
	RET
