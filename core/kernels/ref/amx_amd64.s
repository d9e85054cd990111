#include "textflag.h"

// func xgetbv0() (eax, edx uint32)
//
// XCR0, the state components the OS has enabled (XGETBV with ECX = 0); the caller checks
// that the CPU has OSXSAVE first.
TEXT ·xgetbv0(SB), NOSPLIT, $0-8
	MOVL $0, CX
	XGETBV
	MOVL AX, eax+0(FP)
	MOVL DX, edx+4(FP)
	RET
