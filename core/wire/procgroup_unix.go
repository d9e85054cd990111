//go:build unix

package wire

import (
	"os/exec"
	"syscall"
)

// ownGroup runs an exec runner in a process group of its own, so that killing it also
// kills what its command line started (a wrapper script's children, a pipeline), which
// would otherwise outlive the runner holding its pipes or its memory.
func ownGroup(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
}

// killGroup kills the runner's process group (the runner, and anything it started that
// is still there).
func killGroup(cmd *exec.Cmd) {
	syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
}
