//go:build !(linux || darwin || freebsd || netbsd)

package emu

import "errors"

var errNoDL = errors.New("emu: loading modules needs dlopen (Linux, macOS, FreeBSD, NetBSD)")

func dlopen(string) (uintptr, error)         { return 0, errNoDL }
func dlsym(uintptr, string) (uintptr, error) { return 0, errNoDL }
func call(uintptr, ...uintptr) uintptr       { return 1 }
