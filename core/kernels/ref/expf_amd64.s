#include "textflag.h"

// func expfAVX2(dst, src *float32, n int, c *[expfConsts][8]uint32) int
//
// expf of src[0:n] into dst, 8 lanes at a time (n a multiple of 8), the steps and
// roundings of the scalar expf (no FMA: each product and sum rounded as Go rounds them).
// It stops before the first block holding an argument outside [minArg, maxArg] (or a
// NaN) and returns how many it computed. c holds the constants, each in 8 lanes:
// log2e, magic, ln2Hi, ln2Lo, the polynomial's 6 coefficients, 1, minArg, maxArg, 127.
TEXT ·expfAVX2(SB), NOSPLIT, $0-40
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	MOVQ c+24(FP), R8
	XORQ AX, AX

loop:
	CMPQ AX, CX
	JAE  done
	VMOVUPS (SI)(AX*4), Y0
	VCMPPS  $0x1d, 352(R8), Y0, Y1 // x >= minArg
	VCMPPS  $0x12, 384(R8), Y0, Y2 // x <= maxArg
	VANDPS  Y2, Y1, Y1
	VMOVMSKPS Y1, DX
	CMPL    DX, $0xff
	JNE     done
	VMULPS  0(R8), Y0, Y1          // x·log2e
	VADDPS  32(R8), Y1, Y1         // t = x·log2e + magic
	VPSUBD  32(R8), Y1, Y2         // n = bits(t) - bits(magic)
	VSUBPS  32(R8), Y1, Y3         // fn = t - magic
	VMULPS  64(R8), Y3, Y4         // fn·ln2Hi
	VSUBPS  Y4, Y0, Y4             // x - fn·ln2Hi
	VMULPS  96(R8), Y3, Y5         // fn·ln2Lo
	VSUBPS  Y5, Y4, Y4             // r
	VMULPS  128(R8), Y4, Y5
	VADDPS  160(R8), Y5, Y5
	VMULPS  Y4, Y5, Y5
	VADDPS  192(R8), Y5, Y5
	VMULPS  Y4, Y5, Y5
	VADDPS  224(R8), Y5, Y5
	VMULPS  Y4, Y5, Y5
	VADDPS  256(R8), Y5, Y5
	VMULPS  Y4, Y5, Y5
	VADDPS  288(R8), Y5, Y5        // p
	VMULPS  Y4, Y5, Y5             // p·r
	VMULPS  Y4, Y5, Y5             // p·r·r
	VADDPS  Y4, Y5, Y5             // + r
	VADDPS  320(R8), Y5, Y5        // + 1
	VPADDD  416(R8), Y2, Y2        // n + 127
	VPSLLD  $23, Y2, Y2            // 2^n
	VMULPS  Y2, Y5, Y5
	VMOVUPS Y5, (DI)(AX*4)
	ADDQ    $8, AX
	JMP     loop

done:
	VZEROUPPER
	MOVQ AX, ret+32(FP)
	RET
