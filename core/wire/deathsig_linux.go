package wire

import "syscall"

// dieWithEngine has Linux kill the runner when the thread that started it ends, which
// startSupervised makes the end of the engine's process (see there).
func dieWithEngine(a *syscall.SysProcAttr) { a.Pdeathsig = syscall.SIGKILL }
