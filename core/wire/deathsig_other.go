//go:build unix && !linux

package wire

import "syscall"

// dieWithEngine does nothing where the system has no parent-death signal: a runner sees
// the engine's death as the end of its stdin once it next reads it.
func dieWithEngine(*syscall.SysProcAttr) {}
