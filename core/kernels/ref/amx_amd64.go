package ref

import (
	"fmt"
	"sync"

	"golang.org/x/sys/cpu"
)

// AMXStatus says whether this process may run AMX tile instructions, and why not.
type AMXStatus struct {
	// CPU: CPUID reports AMX-TILE; BF16 and Int8 its TDPBF16PS and TDPB*D forms.
	CPU, BF16, Int8 bool
	// OSEnabled: XCR0 has the tile state components (17 XTILECFG, 18 XTILEDATA), which
	// a kernel with AMX support sets.
	OSEnabled bool
	// Granted: Linux granted this process the tile data state (arch_prctl
	// ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA, checked by ARCH_GET_XCOMP_PERM); a
	// tile instruction before that dies with SIGILL.
	Granted bool
	// Reason says why AMX does not run, or that it may.
	Reason string
}

// xgetbv0 is in amx_amd64.s.
func xgetbv0() (eax, edx uint32)

var (
	amxOnce   sync.Once
	amxStatus AMXStatus
)

// AMX checks, once a process, whether AMX tile instructions may run here, requesting the
// tile data state from the OS if the CPU and OS have it. MatMulTBF16's prefill runs on
// AMX tiles where it is granted (amxBF16Gemm); the int8 products run on AVX-512 VNNI
// (DType.Kernel says which).
func AMX() AMXStatus {
	amxOnce.Do(func() { amxStatus = checkAMX() })
	return amxStatus
}

func checkAMX() AMXStatus {
	s := AMXStatus{CPU: cpu.X86.HasAMXTile, BF16: cpu.X86.HasAMXBF16, Int8: cpu.X86.HasAMXInt8}
	if !s.CPU {
		s.Reason = "the CPU reports no AMX-TILE (CPUID leaf 7)"
		return s
	}
	if !cpu.X86.HasOSXSAVE {
		s.Reason = "the CPU reports AMX but the OS does not enable XSAVE"
		return s
	}
	const tileCfg, tileData = 17, 18
	if eax, _ := xgetbv0(); eax&(1<<tileCfg) == 0 || eax&(1<<tileData) == 0 {
		s.Reason = fmt.Sprintf("the CPU reports AMX but the OS has not enabled the tile state (XCR0 = %#x lacks bits 17 and 18: a kernel without AMX support, or a hypervisor hiding it)", eax)
		return s
	}
	s.OSEnabled = true
	if err := requestTileData(tileData); err != nil {
		s.Reason = "the CPU and OS have AMX but " + err.Error()
		return s
	}
	s.Granted = true
	s.Reason = "granted (arch_prctl ARCH_REQ_XCOMP_PERM XTILEDATA)"
	return s
}
