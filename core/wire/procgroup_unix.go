//go:build unix

package wire

import (
	"os/exec"
	"syscall"
)

// ownGroup runs an exec runner in a process group of its own, so that killing it also
// kills what its command line started (a wrapper script's children, a pipeline), which
// would otherwise outlive the runner holding its pipes or its memory. Where the system
// can (Linux), the runner is also killed when the engine's process dies without closing
// the session (SIGKILL, the OOM killer): a runner busy in a step, or hung, does not read
// its stdin, so it would not see the engine go, and would keep its memory (a GPU's) from
// the engine restarted in its place.
func ownGroup(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	dieWithEngine(cmd.SysProcAttr)
}

// killGroup kills the runner's process group (the runner, and anything it started that
// is still there).
func killGroup(cmd *exec.Cmd) {
	syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
}
