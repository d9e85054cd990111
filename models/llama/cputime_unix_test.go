//go:build unix

package llama

import (
	"syscall"
	"time"
)

// processCPU returns the CPU time (user and system) this process has used so far, or 0
// where it cannot say.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
