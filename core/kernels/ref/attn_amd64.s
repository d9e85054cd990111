#include "textflag.h"
#include "fma_amd64.h"

// func attnDotsAVX2(s *float32, sstride int, q *float32, heads, dim int, k *float32, kstride, n int)
//
// s[h*sstride + i] = Σ_j q[h*d + j]·k[i*kstride + j] for h < heads, i < n, j < d = dim (a
// positive multiple of 8): the scores of the query heads against n keys kstride values
// apart, in float32 with FMAs. Per head, 8 keys at a time: 8 accumulators of 8 lanes,
// summed across by a transposing horizontal add into the 8 scores; the keys left one at a
// time.
TEXT ·attnDotsAVX2(SB), NOSPLIT, $0-64
	MOVQ s+0(FP), DI
	MOVQ sstride+8(FP), R9
	SHLQ $2, R9
	MOVQ q+16(FP), SI
	MOVQ heads+24(FP), R10
	MOVQ dim+32(FP), R11
	SHLQ $2, R11            // d in bytes
	MOVQ kstride+48(FP), R12
	SHLQ $2, R12            // the key stride in bytes

dhead:
	MOVQ k+40(FP), DX       // key i
	MOVQ n+56(FP), CX       // keys left
	MOVQ DI, R14            // s[h*sstride + i]

block8:
	CMPQ CX, $8
	JB   one
	// Keys i..i+7 sit at DX + {0, 1, 2, 4}·stride, BX = DX + 3·stride, R8 = DX + {5, 6, 7}·stride.
	LEAQ (DX)(R12*2), BX
	ADDQ R12, BX
	LEAQ (BX)(R12*2), R8
	MOVQ DX, R15
	ZERO8
	XORQ AX, AX             // byte offset in the rows

col:
	VMOVUPS     (SI)(AX*1), Y8
	VFMADD231PS (R15), Y8, Y0
	VFMADD231PS (R15)(R12*1), Y8, Y1
	VFMADD231PS (R15)(R12*2), Y8, Y2
	VFMADD231PS (BX), Y8, Y3
	VFMADD231PS (R15)(R12*4), Y8, Y4
	VFMADD231PS (R8), Y8, Y5
	VFMADD231PS (R8)(R12*1), Y8, Y6
	VFMADD231PS (R8)(R12*2), Y8, Y7
	ADDQ $32, R15
	ADDQ $32, BX
	ADDQ $32, R8
	ADDQ $32, AX
	CMPQ AX, R11
	JB   col
	HSUM8
	VMOVUPS    Y1, (R14)
	LEAQ (DX)(R12*8), DX
	ADDQ $32, R14
	SUBQ $8, CX
	JMP  block8

one:
	TESTQ CX, CX
	JZ    dnext
	VXORPS Y0, Y0, Y0
	XORQ   AX, AX

onecol:
	VMOVUPS     (DX)(AX*1), Y2
	VFMADD231PS (SI)(AX*1), Y2, Y0
	ADDQ $32, AX
	CMPQ AX, R11
	JB   onecol
	VEXTRACTF128 $1, Y0, X1
	VADDPS       X1, X0, X0
	VMOVHLPS     X0, X0, X1
	VADDPS       X1, X0, X0
	VMOVSHDUP    X0, X1
	VADDSS       X1, X0, X0
	VMOVSS       X0, (R14)
	ADDQ R12, DX
	ADDQ $4, R14
	DECQ CX
	JMP  one

dnext:
	ADDQ R11, SI
	ADDQ R9, DI
	DECQ R10
	JNZ  dhead
	VZEROUPPER
	RET

// func attnAxpysAVX2(o *float32, ostride int, w *float32, wstride, heads, dim int, v *float32, vstride, n int)
//
// o[h*ostride + j] += Σ_i w[h*wstride + i]·v[i*vstride + j] for h < heads, j < d = dim (a positive
// multiple of 8), i < n: the weighted sums of n value rows vstride values apart into g
// heads' outputs, in float32 with FMAs, the tokens in order. Columns go 64 at a time in 8
// accumulators, then 8 at a time.
TEXT ·attnAxpysAVX2(SB), NOSPLIT, $0-72
	MOVQ o+0(FP), DI
	MOVQ ostride+8(FP), R8
	SHLQ $2, R8
	MOVQ w+16(FP), SI
	MOVQ wstride+24(FP), R9
	SHLQ $2, R9
	MOVQ heads+32(FP), R10
	MOVQ dim+40(FP), R11
	SHLQ $2, R11            // d in bytes
	MOVQ v+48(FP), DX
	MOVQ vstride+56(FP), R12
	SHLQ $2, R12
	MOVQ n+64(FP), CX
	TESTQ CX, CX
	JZ    adone

ahead:
	XORQ AX, AX             // byte offset of the column block

col64:
	LEAQ 256(AX), BX
	CMPQ BX, R11
	JA   col8
	VMOVUPS (DI)(AX*1), Y0
	VMOVUPS 32(DI)(AX*1), Y1
	VMOVUPS 64(DI)(AX*1), Y2
	VMOVUPS 96(DI)(AX*1), Y3
	VMOVUPS 128(DI)(AX*1), Y4
	VMOVUPS 160(DI)(AX*1), Y5
	VMOVUPS 192(DI)(AX*1), Y6
	VMOVUPS 224(DI)(AX*1), Y7
	MOVQ SI, R13            // w of head h, token i
	LEAQ (DX)(AX*1), R14    // v row i, column block
	MOVQ CX, R15

tok64:
	VBROADCASTSS (R13), Y8
	VFMADD231PS (R14), Y8, Y0
	VFMADD231PS 32(R14), Y8, Y1
	VFMADD231PS 64(R14), Y8, Y2
	VFMADD231PS 96(R14), Y8, Y3
	VFMADD231PS 128(R14), Y8, Y4
	VFMADD231PS 160(R14), Y8, Y5
	VFMADD231PS 192(R14), Y8, Y6
	VFMADD231PS 224(R14), Y8, Y7
	ADDQ $4, R13
	ADDQ R12, R14
	DECQ R15
	JNZ  tok64
	VMOVUPS Y0, (DI)(AX*1)
	VMOVUPS Y1, 32(DI)(AX*1)
	VMOVUPS Y2, 64(DI)(AX*1)
	VMOVUPS Y3, 96(DI)(AX*1)
	VMOVUPS Y4, 128(DI)(AX*1)
	VMOVUPS Y5, 160(DI)(AX*1)
	VMOVUPS Y6, 192(DI)(AX*1)
	VMOVUPS Y7, 224(DI)(AX*1)
	ADDQ $256, AX
	JMP  col64

col8:
	CMPQ AX, R11
	JAE  nexthead
	VMOVUPS (DI)(AX*1), Y0
	MOVQ SI, R13
	LEAQ (DX)(AX*1), R14
	MOVQ CX, R15

tok8:
	VBROADCASTSS (R13), Y8
	VFMADD231PS (R14), Y8, Y0
	ADDQ $4, R13
	ADDQ R12, R14
	DECQ R15
	JNZ  tok8
	VMOVUPS Y0, (DI)(AX*1)
	ADDQ $32, AX
	JMP  col8

nexthead:
	ADDQ R8, DI
	ADDQ R9, SI
	DECQ R10
	JNZ  ahead

adone:
	VZEROUPPER
	RET

// func prefetchT1(p *float32, n int)
//
// Asks for the n > 0 bytes at p into L2, a cache line at a time (PREFETCHT1: a hint; it
// neither faults nor waits).
TEXT ·prefetchT1(SB), NOSPLIT, $0-16
	MOVQ p+0(FP), SI
	MOVQ n+8(FP), CX
	LEAQ (SI)(CX*1), CX

prefetcht1_line:
	PREFETCHT1 (SI)
	ADDQ $64, SI
	CMPQ SI, CX
	JB   prefetcht1_line
	RET
