//go:build linux || darwin || freebsd || netbsd

package emu

import "github.com/ebitengine/purego"

func dlopen(path string) (uintptr, error) {
	// RTLD_LOCAL: a module's symbols stay its own (the shim also hides them).
	return purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
}

func dlsym(h uintptr, name string) (uintptr, error) { return purego.Dlsym(h, name) }

func call(fn uintptr, args ...uintptr) uintptr {
	r, _, _ := purego.SyscallN(fn, args...)
	return r
}
