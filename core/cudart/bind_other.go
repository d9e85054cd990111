//go:build !linux

package cudart

import (
	"fmt"
	"runtime"
)

var errNoBind = fmt.Errorf("NUMA binding is supported on Linux only, not %s", runtime.GOOS)

// BindNode is supported on Linux only.
func BindNode(t *Topology, id int) error { return errNoBind }

// SetProcessAffinity is supported on Linux only.
func SetProcessAffinity(cpus []int) error { return errNoBind }

// ProcessAffinity is supported on Linux only.
func ProcessAffinity() ([]int, error) { return nil, errNoBind }

// SetPreferredNode is supported on Linux only.
func SetPreferredNode(node int) error { return errNoBind }

// PreferredNode is supported on Linux only.
func PreferredNode() (mode, node int, err error) { return 0, -1, errNoBind }

func applyPreferredNode() error { return nil }

// BindMemory is supported on Linux only.
func BindMemory(b []byte, node int) error { return errNoBind }

// MemoryNode is supported on Linux only.
func MemoryNode(b []byte) (int, error) { return -1, errNoBind }

// MemoryPolicy is supported on Linux only.
func MemoryPolicy(b []byte) (mode, node int, err error) { return 0, -1, errNoBind }

func bindProcess(node int, cpus []int) error { return errNoBind }

func mapHost(n int64, node int) ([]byte, error) { return nil, errNoBind }

func unmapHost(b []byte) error { return errNoBind }
