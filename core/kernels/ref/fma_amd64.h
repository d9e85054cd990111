// Macros shared by attn_amd64.s and skinny_amd64.s.

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
