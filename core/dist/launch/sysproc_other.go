//go:build !linux

package launch

import "syscall"

// sysProcAttr has no parent-death signal outside Linux: Stop and Kill still reap every
// worker, but a launcher that crashes leaves its workers to notice their peers' absence
// (their collectives' deadlines).
func sysProcAttr() *syscall.SysProcAttr { return nil }
