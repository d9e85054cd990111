//go:build !(linux || darwin || freebsd || netbsd)

package blas

import (
	"errors"
	"runtime"
)

var errNoDlopen = errors.New("loading a BLAS at run time is supported on Linux only, not " + runtime.GOOS)

func dlopen(string) (uintptr, error)         { return 0, errNoDlopen }
func dlsym(uintptr, string) (uintptr, error) { return 0, errNoDlopen }
func dlclose(uintptr)                        {}
