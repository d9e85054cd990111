//go:build !(linux || darwin || freebsd || netbsd)

package cudart

import (
	"errors"
	"runtime"
)

var errNoDlopen = errors.New("dynamic loading of CUDA libraries is supported on Linux only, not " + runtime.GOOS)

func dlopen(string) (uintptr, error)         { return 0, errNoDlopen }
func dlsym(uintptr, string) (uintptr, error) { return 0, errNoDlopen }
