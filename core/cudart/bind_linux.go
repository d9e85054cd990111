package cudart

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync/atomic"
	"syscall"
	"unsafe"
)

const (
	mpolDefault   = 0
	mpolPreferred = 1
	maskWords     = 16 // 1024 CPUs / nodes
)

type cpuMask [maskWords]uint64

func (m *cpuMask) set(i int) error {
	if i < 0 || i >= maskWords*64 {
		return fmt.Errorf("cpu or node %d beyond %d", i, maskWords*64)
	}
	m[i/64] |= 1 << (i % 64)
	return nil
}

// preferredNode is the node BindNode chose, applied to each Device's thread as it starts;
// -1 when the process is not bound.
var preferredNode atomic.Int64

func init() { preferredNode.Store(-1) }

// BindNode binds the whole process to NUMA node id of t: every thread's CPU affinity is
// set to the node's CPUs (threads created later inherit it), and the calling thread's
// memory policy prefers the node. Linux's memory policy is per thread, so call BindNode
// early in main; each Device's thread also takes the preferred node when it starts.
func BindNode(t *Topology, id int) error {
	n, ok := t.Node(id)
	if !ok {
		return fmt.Errorf("bind: no NUMA node %d", id)
	}
	if len(n.CPUs) == 0 {
		return fmt.Errorf("bind: node %d has no CPUs", id)
	}
	if err := SetProcessAffinity(n.CPUs); err != nil {
		return fmt.Errorf("bind node %d: %w", id, err)
	}
	if err := SetPreferredNode(id); err != nil {
		return fmt.Errorf("bind node %d: %w", id, err)
	}
	preferredNode.Store(int64(id))
	return nil
}

// SetProcessAffinity sets the CPU affinity of every thread of the process.
func SetProcessAffinity(cpus []int) error {
	var mask cpuMask
	for _, c := range cpus {
		if err := mask.set(c); err != nil {
			return err
		}
	}
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return fmt.Errorf("list threads: %w", err)
	}
	for _, task := range tasks {
		tid, err := strconv.Atoi(task.Name())
		if err != nil {
			continue
		}
		_, _, e := syscall.RawSyscall(syscall.SYS_SCHED_SETAFFINITY, uintptr(tid), unsafe.Sizeof(mask), uintptr(unsafe.Pointer(&mask)))
		if e != 0 && e != syscall.ESRCH { // a thread that exited meanwhile is fine
			return fmt.Errorf("sched_setaffinity thread %d to cpus %s: %w", tid, FormatCPUList(cpus), e)
		}
	}
	return nil
}

// ProcessAffinity returns the CPUs the calling thread may run on.
func ProcessAffinity() ([]int, error) {
	var mask cpuMask
	_, _, e := syscall.RawSyscall(syscall.SYS_SCHED_GETAFFINITY, 0, unsafe.Sizeof(mask), uintptr(unsafe.Pointer(&mask)))
	if e != 0 {
		return nil, fmt.Errorf("sched_getaffinity: %w", e)
	}
	var cpus []int
	for i := 0; i < maskWords*64; i++ {
		if mask[i/64]&(1<<(i%64)) != 0 {
			cpus = append(cpus, i)
		}
	}
	return cpus, nil
}

// SetPreferredNode sets the calling thread's memory policy to MPOL_PREFERRED on node (or
// back to the default policy when node is -1).
func SetPreferredNode(node int) error {
	if node < 0 {
		_, _, e := syscall.RawSyscall(syscall.SYS_SET_MEMPOLICY, mpolDefault, 0, 0)
		if e != 0 {
			return fmt.Errorf("set_mempolicy default: %w", e)
		}
		return nil
	}
	var mask cpuMask
	if err := mask.set(node); err != nil {
		return err
	}
	_, _, e := syscall.RawSyscall(syscall.SYS_SET_MEMPOLICY, mpolPreferred, uintptr(unsafe.Pointer(&mask)), maskWords*64+1)
	if e != 0 {
		if e == syscall.ENOSYS || e == syscall.EPERM {
			return fmt.Errorf("set_mempolicy preferred node %d: %w (kernel without NUMA or a sandbox forbids it)", node, e)
		}
		return fmt.Errorf("set_mempolicy preferred node %d: %w", node, e)
	}
	return nil
}

// PreferredNode returns the calling thread's memory policy mode and preferred node (-1
// when the policy names none).
func PreferredNode() (mode, node int, err error) {
	var m int32
	var mask cpuMask
	_, _, e := syscall.RawSyscall6(syscall.SYS_GET_MEMPOLICY, uintptr(unsafe.Pointer(&m)), uintptr(unsafe.Pointer(&mask)), maskWords*64+1, 0, 0, 0)
	if e != 0 {
		return 0, -1, fmt.Errorf("get_mempolicy: %w", e)
	}
	for i := 0; i < maskWords*64; i++ {
		if mask[i/64]&(1<<(i%64)) != 0 {
			return int(m), i, nil
		}
	}
	return int(m), -1, nil
}

// applyPreferredNode gives the calling (locked) device thread the process's preferred
// node, when BindNode chose one.
func applyPreferredNode() error {
	n := preferredNode.Load()
	if n < 0 {
		return nil
	}
	err := SetPreferredNode(int(n))
	if errors.Is(err, syscall.ENOSYS) {
		return nil
	}
	return err
}
