#include "textflag.h"

// EXPF8 computes Y5 = expf(Y0) in 8 lanes for arguments at most maxArg, with the steps
// and roundings of the scalar expf (no FMA: each product and sum rounded as Go rounds
// them), and 0 in the lanes below minArg, as expf gives; R8 holds the constants. It
// overwrites Y1–Y5. The steps: t = x·log2e + magic; n = bits(t) − bits(magic);
// fn = t − magic; r = x − fn·ln2Hi − fn·ln2Lo; p = ((((P0·r + P1)·r + P2)·r + P3)·r + P4)·r
// + P5; e = (p·r·r + r + 1)·2ⁿ.
#define EXPF8 \
	VCMPPS $0x1d, 352(R8), Y0, Y1; \
	VMULPS 0(R8), Y0, Y2; \
	VADDPS 32(R8), Y2, Y2; \
	VSUBPS 32(R8), Y2, Y3; \
	VPSUBD 32(R8), Y2, Y2; \
	VMULPS 64(R8), Y3, Y4; \
	VSUBPS Y4, Y0, Y4; \
	VMULPS 96(R8), Y3, Y3; \
	VSUBPS Y3, Y4, Y4; \
	VMULPS 128(R8), Y4, Y5; \
	VADDPS 160(R8), Y5, Y5; \
	VMULPS Y4, Y5, Y5; \
	VADDPS 192(R8), Y5, Y5; \
	VMULPS Y4, Y5, Y5; \
	VADDPS 224(R8), Y5, Y5; \
	VMULPS Y4, Y5, Y5; \
	VADDPS 256(R8), Y5, Y5; \
	VMULPS Y4, Y5, Y5; \
	VADDPS 288(R8), Y5, Y5; \
	VMULPS Y4, Y5, Y5; \
	VMULPS Y4, Y5, Y5; \
	VADDPS Y4, Y5, Y5; \
	VADDPS 320(R8), Y5, Y5; \
	VPADDD 416(R8), Y2, Y2; \
	VPSLLD $23, Y2, Y2; \
	VMULPS Y2, Y5, Y5; \
	VANDPS Y1, Y5, Y5

// func rowMaxAVX2(p *float32, n int) float32
//
// The largest of p[0:n] (n a positive multiple of 8), NaNs skipped; -Inf when every
// value is a NaN.
TEXT ·rowMaxAVX2(SB), NOSPLIT, $0-20
	MOVQ p+0(FP), SI
	MOVQ n+8(FP), CX
	VPCMPEQD Y0, Y0, Y0
	VPSLLD   $23, Y0, Y0 // -Inf (0xff800000) in every lane
	VMOVAPS Y0, Y1
	XORQ AX, AX
	CMPQ CX, $16
	JB   tail8

loop16:
	VMOVUPS (SI)(AX*4), Y2
	VMOVUPS 32(SI)(AX*4), Y3
	VMAXPS  Y0, Y2, Y0 // max(x, acc): acc when x is a NaN
	VMAXPS  Y1, Y3, Y1
	ADDQ    $16, AX
	LEAQ    16(AX), DX
	CMPQ    DX, CX
	JBE     loop16

tail8:
	CMPQ AX, CX
	JAE  reduce
	VMOVUPS (SI)(AX*4), Y2
	VMAXPS  Y0, Y2, Y0

reduce:
	VMAXPS       Y1, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VMAXPS       X1, X0, X0
	VPERMILPS    $0x4e, X0, X1
	VMAXPS       X1, X0, X0
	VPERMILPS    $0xb1, X0, X1
	VMAXPS       X1, X0, X0
	VZEROUPPER
	MOVSS X0, ret+16(FP)
	RET

// func softmaxExpAVX2(row *float32, n int, scale, mx float32, c *[expfConsts][8]uint32, acc *[8]float64) int
//
// row[i] = expf(row[i]·scale − mx) for i in [0, n) (n a multiple of 8), each product and
// difference rounded as Go rounds them, 8 at a time; it adds the results, as float64, into
// acc's 8 lanes. It stops before the first block holding an argument above maxArg (or a
// NaN) and returns how many it computed.
TEXT ·softmaxExpAVX2(SB), NOSPLIT, $0-48
	MOVQ row+0(FP), DI
	MOVQ n+8(FP), CX
	VBROADCASTSS scale+16(FP), Y10
	VBROADCASTSS mx+20(FP), Y11
	MOVQ c+24(FP), R8
	MOVQ acc+32(FP), R9
	VMOVUPD (R9), Y8
	VMOVUPD 32(R9), Y9
	XORQ AX, AX

sloop:
	CMPQ AX, CX
	JAE  sdone
	VMOVUPS (DI)(AX*4), Y0
	VMULPS  Y10, Y0, Y0
	VSUBPS  Y11, Y0, Y0
	VCMPPS  $0x12, 384(R8), Y0, Y6 // x <= maxArg (false for NaN)
	VMOVMSKPS Y6, DX
	CMPL    DX, $0xff
	JNE     sdone
	EXPF8
	VMOVUPS Y5, (DI)(AX*4)
	VCVTPS2PD    X5, Y6
	VEXTRACTF128 $1, Y5, X7
	VCVTPS2PD    X7, Y7
	VADDPD  Y6, Y8, Y8
	VADDPD  Y7, Y9, Y9
	ADDQ    $8, AX
	JMP     sloop

sdone:
	VMOVUPD Y8, (R9)
	VMOVUPD Y9, 32(R9)
	VZEROUPPER
	MOVQ AX, ret+40(FP)
	RET

// func siluMulAVX2(out, gate, up *float32, n int, c *[expfConsts][8]uint32, lim float32) int
//
// out[i] = g / (1 + expf(−g)) · u with g = min(gate[i], lim), u = min(max(up[i], −lim), lim)
// for i in [0, n) (n a multiple of 8), rounded as Go rounds each step and with Go's min and
// max on NaN (a NaN gate or up stays NaN; lim = +Inf clamps nothing), 8 at a time. It
// stops before the first block holding a clamped gate below −maxArg (or a NaN) and returns
// how many it computed.
TEXT ·siluMulAVX2(SB), NOSPLIT, $0-56
	MOVQ out+0(FP), DI
	MOVQ gate+8(FP), SI
	MOVQ up+16(FP), DX
	MOVQ n+24(FP), CX
	MOVQ c+32(FP), R8
	VBROADCASTSS lim+40(FP), Y12
	VPCMPEQD Y9, Y9, Y9
	VPSLLD   $31, Y9, Y9 // the sign bit in every lane
	VXORPS   Y9, Y12, Y13 // −lim
	XORQ AX, AX

mloop:
	CMPQ AX, CX
	JAE  mdone
	VMOVUPS (SI)(AX*4), Y7
	VMINPS  Y7, Y12, Y7 // min(gate, lim): the second operand, gate, when either is a NaN
	VMOVUPS (DX)(AX*4), Y10
	VMAXPS  Y10, Y13, Y10 // max(up, −lim)
	VMINPS  Y10, Y12, Y10 // min(…, lim)
	VXORPS  Y9, Y7, Y0 // x = −gate
	VCMPPS  $0x12, 384(R8), Y0, Y6
	VMOVMSKPS Y6, BX
	CMPL    BX, $0xff
	JNE     mdone
	EXPF8
	VADDPS  320(R8), Y5, Y5 // 1 + e
	VDIVPS  Y5, Y7, Y5      // gate / (1 + e)
	VMULPS  Y10, Y5, Y5
	VMOVUPS Y5, (DI)(AX*4)
	ADDQ    $8, AX
	JMP     mloop

mdone:
	VZEROUPPER
	MOVQ AX, ret+48(FP)
	RET

// func axpyF64AVX2(acc *float64, a float64, x *float32, n int)
//
// acc[i] += a·float64(x[i]) for i < n (a multiple of 8), the product and the sum each
// rounded (no FMA), 8 at a time.
TEXT ·axpyF64AVX2(SB), NOSPLIT, $0-32
	MOVQ acc+0(FP), DI
	VBROADCASTSD a+8(FP), Y4
	MOVQ x+16(FP), SI
	MOVQ n+24(FP), CX
	XORQ AX, AX

xloop:
	CMPQ AX, CX
	JAE  xdone
	VCVTPS2PD (SI)(AX*4), Y0
	VCVTPS2PD 16(SI)(AX*4), Y1
	VMULPD    Y4, Y0, Y0
	VMULPD    Y4, Y1, Y1
	VADDPD    (DI)(AX*8), Y0, Y0
	VADDPD    32(DI)(AX*8), Y1, Y1
	VMOVUPD   Y0, (DI)(AX*8)
	VMOVUPD   Y1, 32(DI)(AX*8)
	ADDQ $8, AX
	JMP  xloop

xdone:
	VZEROUPPER
	RET

// func ropeNeoXAVX2(x0, x1, cos, sin *float32, n int)
//
// (x0[i], x1[i]) ← (x0[i]·cos[i] − x1[i]·sin[i], x1[i]·cos[i] + x0[i]·sin[i]) for i < n (a
// multiple of 8), each product rounded before the sum (no FMA), 8 at a time.
TEXT ·ropeNeoXAVX2(SB), NOSPLIT, $0-40
	MOVQ x0+0(FP), DI
	MOVQ x1+8(FP), SI
	MOVQ cos+16(FP), DX
	MOVQ sin+24(FP), R8
	MOVQ n+32(FP), CX
	XORQ AX, AX

rloop:
	CMPQ AX, CX
	JAE  rdone
	VMOVUPS (DI)(AX*4), Y0 // x0
	VMOVUPS (SI)(AX*4), Y1 // x1
	VMOVUPS (DX)(AX*4), Y2 // cos
	VMOVUPS (R8)(AX*4), Y3 // sin
	VMULPS  Y2, Y0, Y4     // x0·cos
	VMULPS  Y3, Y1, Y5     // x1·sin
	VSUBPS  Y5, Y4, Y4
	VMULPS  Y2, Y1, Y6     // x1·cos
	VMULPS  Y3, Y0, Y7     // x0·sin
	VADDPS  Y7, Y6, Y6
	VMOVUPS Y4, (DI)(AX*4)
	VMOVUPS Y6, (SI)(AX*4)
	ADDQ $8, AX
	JMP  rloop

rdone:
	VZEROUPPER
	RET
