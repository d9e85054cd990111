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
