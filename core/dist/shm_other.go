//go:build !unix

package dist

import "fmt"

// ShmDir is where JoinShm would put its files.
func ShmDir() string { return "" }

// JoinShm needs mmap: on this platform it fails.
func JoinShm(name string, rank, size int, o Options) (Communicator, error) {
	return nil, fmt.Errorf("dist: shared-memory groups need a unix host")
}
