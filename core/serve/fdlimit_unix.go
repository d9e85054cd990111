//go:build unix

package serve

import "syscall"

// fdLimit returns the process's soft limit on open file descriptors, or 0 if unknown.
func fdLimit() int {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil || rl.Cur > 1<<30 {
		return 0
	}
	return int(rl.Cur)
}
