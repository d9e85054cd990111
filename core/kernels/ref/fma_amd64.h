// Macros shared by attn_amd64.s, skinny_amd64.s and int8_amd64.s.

// ZERO8 clears the eight accumulators Y0–Y7.
#define ZERO8 \
	VXORPS Y0, Y0, Y0; \
	VXORPS Y1, Y1, Y1; \
	VXORPS Y2, Y2, Y2; \
	VXORPS Y3, Y3, Y3; \
	VXORPS Y4, Y4, Y4; \
	VXORPS Y5, Y5, Y5; \
	VXORPS Y6, Y6, Y6; \
	VXORPS Y7, Y7, Y7

// HSUM8 sums each of Y0–Y7 across its 8 lanes into lane i of Y1 (a transposing
// horizontal add: pairs, then quads per 128-bit half, then the halves). It overwrites
// Y0, Y2, Y4 and Y6.
#define HSUM8 \
	VHADDPS    Y1, Y0, Y0; \
	VHADDPS    Y3, Y2, Y2; \
	VHADDPS    Y5, Y4, Y4; \
	VHADDPS    Y7, Y6, Y6; \
	VHADDPS    Y2, Y0, Y0; \
	VHADDPS    Y6, Y4, Y4; \
	VPERM2F128 $0x20, Y4, Y0, Y1; \
	VPERM2F128 $0x31, Y4, Y0, Y2; \
	VADDPS     Y2, Y1, Y1

// HALVE8 adds the upper 8 lanes of each of Z0–Z7 into its lower 8 (Y0–Y7), with Y16 as
// scratch (AVX-512).
#define HALVE8 \
	VEXTRACTF64X4 $1, Z0, Y16; \
	VADDPS        Y16, Y0, Y0; \
	VEXTRACTF64X4 $1, Z1, Y16; \
	VADDPS        Y16, Y1, Y1; \
	VEXTRACTF64X4 $1, Z2, Y16; \
	VADDPS        Y16, Y2, Y2; \
	VEXTRACTF64X4 $1, Z3, Y16; \
	VADDPS        Y16, Y3, Y3; \
	VEXTRACTF64X4 $1, Z4, Y16; \
	VADDPS        Y16, Y4, Y4; \
	VEXTRACTF64X4 $1, Z5, Y16; \
	VADDPS        Y16, Y5, Y5; \
	VEXTRACTF64X4 $1, Z6, Y16; \
	VADDPS        Y16, Y6, Y6; \
	VEXTRACTF64X4 $1, Z7, Y16; \
	VADDPS        Y16, Y7, Y7

// SKINNY_ARGS loads skinny's arguments: DI = ct, R8–R11 = x's 4 rows, CX = k in bytes,
// SI and R12 = w's first two rows, BX = ldw in bytes, DX = n.
#define SKINNY_ARGS \
	MOVQ ct+0(FP), DI; \
	MOVQ x+8(FP), R8; \
	MOVQ k+16(FP), CX; \
	SHLQ $2, CX; \
	LEAQ (R8)(CX*1), R9; \
	LEAQ (R9)(CX*1), R10; \
	LEAQ (R10)(CX*1), R11; \
	MOVQ w+24(FP), SI; \
	MOVQ ldw+32(FP), BX; \
	SHLQ $2, BX; \
	LEAQ (SI)(BX*1), R12; \
	MOVQ n+40(FP), DX

// SKINNY_PAIR_STEP is one step of skinny's pair loop at byte offset AX, in registers of
// either width (Y or Z): w's rows in W0, W1, x's rows through T0, T1, the products of
// w row 0 with x rows 0–3 into A0–A3 and of w row 1 into A4–A7.
#define SKINNY_PAIR_STEP(W0, W1, T0, T1, A0, A1, A2, A3, A4, A5, A6, A7) \
	VMOVUPS     (SI)(AX*1), W0; \
	VMOVUPS     (R12)(AX*1), W1; \
	VMOVUPS     (R8)(AX*1), T0; \
	VFMADD231PS T0, W0, A0; \
	VFMADD231PS T0, W1, A4; \
	VMOVUPS     (R9)(AX*1), T1; \
	VFMADD231PS T1, W0, A1; \
	VFMADD231PS T1, W1, A5; \
	VMOVUPS     (R10)(AX*1), T0; \
	VFMADD231PS T0, W0, A2; \
	VFMADD231PS T0, W1, A6; \
	VMOVUPS     (R11)(AX*1), T1; \
	VFMADD231PS T1, W0, A3; \
	VFMADD231PS T1, W1, A7

// SKINNY_SINGLE_STEP is one step of skinny's last odd row of w (in W0) against x's 4 rows
// into A0–A3.
#define SKINNY_SINGLE_STEP(W0, A0, A1, A2, A3) \
	VMOVUPS     (SI)(AX*1), W0; \
	VFMADD231PS (R8)(AX*1), W0, A0; \
	VFMADD231PS (R9)(AX*1), W0, A1; \
	VFMADD231PS (R10)(AX*1), W0, A2; \
	VFMADD231PS (R11)(AX*1), W0, A3

// PREFETCH512(R) asks for the 512 bytes at R into L2 and steps R past them: the AVX-512
// GEMVs run R along the rows after the ones they read (8 rows, or int8's next group of
// 16; contiguous in a weight), one step's bytes a step, so those rows are in cache when their turn comes. Left to the
// hardware's prefetchers, each row of a weight is a stream of its own that ends after a
// row's bytes (2 KiB of bfloat16 at k = 1024), too short for them to run ahead: the
// streams then wait on memory at ~10 GB/s a core where the prefetched ones read at 16-18
// (BenchmarkDecodeWeights with -cpu 1).
#define PREFETCH512(R) \
	PREFETCHT1 (R); \
	PREFETCHT1 64(R); \
	PREFETCHT1 128(R); \
	PREFETCHT1 192(R); \
	PREFETCHT1 256(R); \
	PREFETCHT1 320(R); \
	PREFETCHT1 384(R); \
	PREFETCHT1 448(R); \
	ADDQ       $512, R
