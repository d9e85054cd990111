//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package cudart

import (
	"os"
	"syscall"
)

// lockFile takes an exclusive flock on path (created if needed), blocking until it is
// free, and returns the function that releases it. flock locks belong to the open file,
// so they exclude other goroutines of this process as well as other processes.
func lockFile(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
		if err != syscall.EINTR {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}
