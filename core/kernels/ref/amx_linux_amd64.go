package ref

import (
	"fmt"
	"syscall"
	"unsafe"
)

// The arch_prctl codes of Linux's dynamic XSAVE features (asm/prctl.h).
const (
	archGetXcompPerm = 0x1022
	archReqXcompPerm = 0x1023
)

// requestTileData asks Linux for permission to use XSAVE feature bit (18, XTILEDATA) in
// this process and checks that it was granted.
func requestTileData(bit uint) error {
	if _, _, e := syscall.RawSyscall(syscall.SYS_ARCH_PRCTL, archReqXcompPerm, uintptr(bit), 0); e != 0 {
		return fmt.Errorf("arch_prctl(ARCH_REQ_XCOMP_PERM, %d) refused the tile data state: %v", bit, e)
	}
	var perm uint64
	if _, _, e := syscall.RawSyscall(syscall.SYS_ARCH_PRCTL, archGetXcompPerm, uintptr(unsafe.Pointer(&perm)), 0); e != 0 {
		return fmt.Errorf("arch_prctl(ARCH_GET_XCOMP_PERM): %v", e)
	}
	if perm&(1<<bit) == 0 {
		return fmt.Errorf("after arch_prctl(ARCH_REQ_XCOMP_PERM) the permitted XSAVE features %#x lack bit %d: the tile data state is not granted", perm, bit)
	}
	return nil
}
