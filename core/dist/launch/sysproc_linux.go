package launch

import "syscall"

// sysProcAttr makes a worker die with its launcher (SIGKILL on the parent's death), so
// that no worker outlives a launcher that crashed.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
