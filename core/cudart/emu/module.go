package emu

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"unsafe"
)

// Schedule is the order in which the emulator runs a block's threads between barriers
// and warp operations (and its blocks). A correct kernel gives the same bits under all.
type Schedule int

const (
	Forward   Schedule = iota // thread 0 to its next barrier, then thread 1, ...; blocks in order
	Reverse                   // the last thread first; blocks in reverse order
	Random                    // a seeded random runnable thread each time; blocks shuffled
	WarpAhead                 // one warp (chosen by the seed) runs whenever it can, the rest forward
)

// Schedules lists every schedule.
var Schedules = []Schedule{Forward, Reverse, Random, WarpAhead}

func (s Schedule) String() string {
	switch s {
	case Forward:
		return "forward"
	case Reverse:
		return "reverse"
	case Random:
		return "random"
	case WarpAhead:
		return "warp-ahead"
	}
	return fmt.Sprintf("Schedule(%d)", int(s))
}

// Counts are an emulated device's cumulative counters.
type Counts struct {
	Launches, Blocks, Threads, Barriers, Shuffles, Atomics uint64
}

func (c Counts) String() string {
	return fmt.Sprintf("%d launches, %d blocks, %d threads, %d barriers, %d warp operations, %d atomics",
		c.Launches, c.Blocks, c.Threads, c.Barriers, c.Shuffles, c.Atomics)
}

// Sub returns c - o, the counts between two readings.
func (c Counts) Sub(o Counts) Counts {
	return Counts{c.Launches - o.Launches, c.Blocks - o.Blocks, c.Threads - o.Threads,
		c.Barriers - o.Barriers, c.Shuffles - o.Shuffles, c.Atomics - o.Atomics}
}

// Module is a built module loaded into the process (Open). Its launches run one at a
// time; a Module is safe for concurrent use.
type Module struct {
	path                          string
	launch, has, statsAddr, sizes uintptr
}

var (
	openMu  sync.Mutex
	opened  = map[string]*Module{}
	modList []*Module
)

// Open loads the module at path (from Build); opening a path twice gives the same Module.
func Open(path string) (*Module, error) {
	openMu.Lock()
	defer openMu.Unlock()
	if m := opened[path]; m != nil {
		return m, nil
	}
	h, err := dlopen(path)
	if err != nil {
		return nil, fmt.Errorf("emu: open %s: %w", path, err)
	}
	m := &Module{path: path}
	for _, s := range []struct {
		name string
		dst  *uintptr
	}{{"resin_emu_launch", &m.launch}, {"resin_emu_has_kernel", &m.has}, {"resin_emu_stats", &m.statsAddr},
		{"resin_emu_param_sizes", &m.sizes}} {
		if *s.dst, err = dlsym(h, s.name); err != nil {
			return nil, fmt.Errorf("emu: %s is not an emulator module: %w", path, err)
		}
	}
	opened[path] = m
	modList = append(modList, m)
	return m, nil
}

// Path is the module's file.
func (m *Module) Path() string { return m.path }

// HasKernel reports whether the module defines kernel.
func (m *Module) HasKernel(kernel string) bool {
	name := cstr(kernel)
	var pin runtime.Pinner
	pin.Pin(&name[0])
	defer pin.Unpin()
	return call(m.has, uintptr(unsafe.Pointer(&name[0]))) == 1
}

// ParamSizes returns the byte size of each parameter of kernel, from its C signature as
// compiled: what each params[i] of a launch must point at.
func (m *Module) ParamSizes(kernel string) ([]uint32, error) {
	name := cstr(kernel)
	out := make([]uint32, 64)
	var pin runtime.Pinner
	pin.Pin(&name[0])
	pin.Pin(&out[0])
	defer pin.Unpin()
	n := int32(call(m.sizes, uintptr(unsafe.Pointer(&name[0])), uintptr(unsafe.Pointer(&out[0])), uintptr(len(out))))
	switch {
	case n < 0:
		return nil, fmt.Errorf("emu: %s defines no kernel %s", m.path, kernel)
	case int(n) > len(out):
		return nil, fmt.Errorf("emu: %s takes %d parameters, more than %d", kernel, n, len(out))
	}
	return out[:n], nil
}

// Launch runs kernel over grid blocks of block threads, with shmem bytes of dynamic
// shared memory, to its end. params[i] points at the value of the kernel's parameter i
// (cuLaunchKernel's convention); a pointer parameter's value is a host address of memory
// that does not move while the kernel runs (C memory, or a Go heap object kept alive:
// not a goroutine's stack, which moves). It
// returns the emulator's error: a barrier or warp operation not reached by every thread
// at one call site, a deadlock, a stack overrun, a launch shape a GPU refuses.
func (m *Module) Launch(kernel string, grid, block [3]uint32, shmem uint32, params []unsafe.Pointer, sched Schedule, seed uint64) error {
	// Everything the C side reads or writes is pinned: a goroutine's stack can move
	// between taking an address and the call, and the caller's parameter values may be
	// on it (pinning moves them to the heap).
	var pin runtime.Pinner
	defer pin.Unpin()
	name := cstr(kernel)
	pin.Pin(&name[0])
	errBuf := make([]byte, 1024)
	pin.Pin(&errBuf[0])
	var pp uintptr
	if len(params) > 0 {
		arr := make([]unsafe.Pointer, len(params))
		copy(arr, params)
		for _, p := range arr {
			if p != nil {
				pin.Pin(p)
			}
		}
		pin.Pin(&arr[0])
		pp = uintptr(unsafe.Pointer(&arr[0]))
	}
	rc := call(m.launch, uintptr(unsafe.Pointer(&name[0])), uintptr(grid[0]), uintptr(grid[1]), uintptr(grid[2]),
		uintptr(block[0]), uintptr(block[1]), uintptr(block[2]), uintptr(shmem), pp, uintptr(sched), uintptr(seed),
		uintptr(unsafe.Pointer(&errBuf[0])), uintptr(len(errBuf)))
	if int32(rc) != 0 {
		msg := string(errBuf) // the C side NUL-terminates
		if i := strings.IndexByte(msg, 0); i >= 0 {
			msg = msg[:i]
		}
		return fmt.Errorf("emu: %s", msg)
	}
	return nil
}

// Stats returns the module's cumulative counters.
func (m *Module) Stats() Counts {
	v := make([]uint64, 8)
	var pin runtime.Pinner
	pin.Pin(&v[0])
	call(m.statsAddr, uintptr(unsafe.Pointer(&v[0])))
	pin.Unpin()
	return Counts{v[0], v[1], v[2], v[3], v[4], v[5]}
}

// Stats returns the counters summed over every module opened in this process.
func Stats() Counts {
	openMu.Lock()
	mods := append([]*Module(nil), modList...)
	openMu.Unlock()
	var c Counts
	for _, m := range mods {
		s := m.Stats()
		c.Launches += s.Launches
		c.Blocks += s.Blocks
		c.Threads += s.Threads
		c.Barriers += s.Barriers
		c.Shuffles += s.Shuffles
		c.Atomics += s.Atomics
	}
	return c
}

func cstr(s string) []byte {
	b := make([]byte, len(s)+1)
	copy(b, s)
	return b
}
