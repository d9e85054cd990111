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
