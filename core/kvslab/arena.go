package kvslab

import "fmt"

// Arena is the memory a Pool cuts into slabs: host memory for CPU runners, device memory
// (core/cudart) for GPU ones. Offsets are bytes from the arena's start.
type Arena interface {
	// Size is the arena's length in bytes.
	Size() int64
	// Copy copies n bytes from offset src to offset dst inside the arena: a page copy
	// (copy-on-write of a shared block, a recurrent state restored from a checkpoint),
	// done by the pool at once or, with DeferCopies, by whoever executes the recorded
	// copies (Pool.CopyPage). The ranges never overlap.
	Copy(dst, src, n int64) error
}

// HostMemory is an Arena whose bytes the CPU can address; CPU runners read and write the
// cache through it.
type HostMemory interface {
	Arena
	// Bytes returns the n bytes at offset off, aliasing the arena.
	Bytes(off, n int64) []byte
}

// HostArena is an Arena backed by a Go byte slice.
type HostArena struct{ buf []byte }

// NewHostArena allocates a zeroed host arena of size bytes.
func NewHostArena(size int64) (*HostArena, error) {
	if size <= 0 {
		return nil, fmt.Errorf("kvslab: host arena size must be positive, got %d", size)
	}
	return &HostArena{buf: make([]byte, size)}, nil
}

// Size implements Arena.
func (a *HostArena) Size() int64 { return int64(len(a.buf)) }

// Copy implements Arena.
func (a *HostArena) Copy(dst, src, n int64) error {
	if err := a.check(dst, n); err != nil {
		return err
	}
	if err := a.check(src, n); err != nil {
		return err
	}
	copy(a.buf[dst:dst+n], a.buf[src:src+n])
	return nil
}

// Bytes implements HostMemory.
func (a *HostArena) Bytes(off, n int64) []byte {
	return a.buf[off : off+n : off+n]
}

func (a *HostArena) check(off, n int64) error {
	if off < 0 || n < 0 || off+n > int64(len(a.buf)) {
		return fmt.Errorf("kvslab: range [%d, %d) outside a host arena of %d bytes", off, off+n, len(a.buf))
	}
	return nil
}
