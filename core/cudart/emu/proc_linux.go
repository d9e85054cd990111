package emu

import (
	"os/exec"
	"syscall"
)

// ownGroup puts cmd's process in a process group of its own, killed whole when cmd's
// context ends (CommandContext), and killed with this process if it dies first.
func ownGroup(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
}
