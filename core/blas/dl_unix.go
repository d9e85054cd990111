//go:build linux || darwin || freebsd || netbsd

package blas

import "github.com/ebitengine/purego"

// dlopen opens a library without adding its symbols to the global namespace, so a BLAS
// cannot shadow symbols of another library the process loads.
func dlopen(path string) (uintptr, error) {
	return purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
}

func dlsym(h uintptr, name string) (uintptr, error) { return purego.Dlsym(h, name) }

func dlclose(h uintptr) { purego.Dlclose(h) }
