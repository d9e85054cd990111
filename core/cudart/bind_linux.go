package cudart

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"unsafe"

	"golang.org/x/sys/unix"
)

const (
	mpolFNode  = 1 << 0 // MPOL_F_NODE: get_mempolicy returns a node
	mpolFAddr  = 1 << 1 // MPOL_F_ADDR: get_mempolicy reports on an address
	mpolMFMove = 1 << 1 // MPOL_MF_MOVE: mbind moves pages already placed
)

type cpuMask [maskWords]uint64

func (m *cpuMask) set(i int) error {
	if i < 0 || i >= maskWords*64 {
		return fmt.Errorf("cpu or node %d beyond %d", i, maskWords*64)
	}
	m[i/64] |= 1 << (i % 64)
	return nil
}

// cpuSet builds the affinity mask of cpus.
func cpuSet(cpus []int) (unix.CPUSet, error) {
	var set unix.CPUSet
	set.Zero()
	for _, c := range cpus {
		if c < 0 || c >= len(set)*64 {
			return set, fmt.Errorf("cpu %d beyond the %d this mask holds", c, len(set)*64)
		}
		set.Set(c)
	}
	return set, nil
}

// BindNode binds the whole process to NUMA node id of t: every thread's CPU affinity is
// set to the node's CPUs (threads created later inherit it), and the calling thread's
// memory policy prefers the node. Linux's memory policy is per thread: open Devices'
// threads take the preferred node at once, later ones when they start. It must not be
// called inside Device.Do.
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
	return applyPreferredToOpenDevices()
}

// SetProcessAffinity sets the CPU affinity of every thread of the process.
func SetProcessAffinity(cpus []int) error {
	if len(cpus) == 0 {
		return errors.New("set affinity: no CPUs given")
	}
	set, err := cpuSet(cpus)
	if err != nil {
		return err
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
		err = unix.SchedSetaffinity(tid, &set)
		if err != nil && !errors.Is(err, unix.ESRCH) { // a thread that exited meanwhile is fine
			return fmt.Errorf("sched_setaffinity thread %d to cpus %s: %w", tid, FormatCPUList(cpus), err)
		}
	}
	return nil
}

// ProcessAffinity returns the CPUs the calling thread may run on.
func ProcessAffinity() ([]int, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil, fmt.Errorf("sched_getaffinity: %w", err)
	}
	var cpus []int
	for i := 0; i < len(set)*64; i++ {
		if set.IsSet(i) {
			cpus = append(cpus, i)
		}
	}
	return cpus, nil
}

// SetPreferredNode sets the calling thread's memory policy to MPOL_PREFERRED on node (or
// back to the default policy when node is -1).
func SetPreferredNode(node int) error {
	if node < 0 {
		_, _, e := unix.RawSyscall(unix.SYS_SET_MEMPOLICY, mpolDefault, 0, 0)
		if e != 0 {
			return fmt.Errorf("set_mempolicy default: %w", e)
		}
		return nil
	}
	var mask cpuMask
	if err := mask.set(node); err != nil {
		return err
	}
	_, _, e := unix.RawSyscall(unix.SYS_SET_MEMPOLICY, mpolPreferred, uintptr(unsafe.Pointer(&mask)), maskWords*64+1)
	if e != 0 {
		if e == unix.ENOSYS || e == unix.EPERM {
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
	_, _, e := unix.RawSyscall6(unix.SYS_GET_MEMPOLICY, uintptr(unsafe.Pointer(&m)), uintptr(unsafe.Pointer(&mask)), maskWords*64+1, 0, 0, 0)
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
	if errors.Is(err, unix.ENOSYS) {
		return nil
	}
	return err
}

// bindProcess sets every thread's affinity to cpus and the memory policy to prefer node,
// for the calling thread now and for each Device thread as it starts.
func bindProcess(node int, cpus []int) error {
	if err := SetProcessAffinity(cpus); err != nil {
		return err
	}
	if err := SetPreferredNode(node); err != nil {
		return err
	}
	preferredNode.Store(int64(node))
	return nil
}

// BindMemory sets the memory policy of the pages under b to prefer node (mbind with
// MPOL_PREFERRED), moving pages already placed elsewhere when the kernel can. b should be
// page-aligned memory of its own mapping (Ctx.AllocHostOn makes such buffers); pages of the
// Go heap are shared with other objects.
func BindMemory(b []byte, node int) error {
	if len(b) == 0 {
		return nil
	}
	var mask cpuMask
	if err := mask.set(node); err != nil {
		return err
	}
	addr := uintptr(unsafe.Pointer(&b[0]))
	page := uintptr(os.Getpagesize())
	start := addr &^ (page - 1)
	length := addr + uintptr(len(b)) - start
	_, _, e := unix.Syscall6(unix.SYS_MBIND, start, length, mpolPreferred,
		uintptr(unsafe.Pointer(&mask)), maskWords*64+1, mpolMFMove)
	if e != 0 {
		return fmt.Errorf("mbind %d bytes to node %d: %w", len(b), node, e)
	}
	return nil
}

// MemoryNode returns the node holding the page at &b[0] (get_mempolicy with MPOL_F_NODE
// and MPOL_F_ADDR); the page must have been touched.
func MemoryNode(b []byte) (int, error) {
	if len(b) == 0 {
		return -1, errors.New("memory node of an empty buffer")
	}
	var node int32
	_, _, e := unix.Syscall6(unix.SYS_GET_MEMPOLICY, uintptr(unsafe.Pointer(&node)), 0, 0,
		uintptr(unsafe.Pointer(&b[0])), mpolFNode|mpolFAddr, 0)
	if e != 0 {
		return -1, fmt.Errorf("get_mempolicy of an address: %w", e)
	}
	return int(node), nil
}

// MemoryPolicy returns the policy mode and preferred node set on the page at &b[0] (-1 when
// the policy names none).
func MemoryPolicy(b []byte) (mode, node int, err error) {
	if len(b) == 0 {
		return 0, -1, errors.New("memory policy of an empty buffer")
	}
	var m int32
	var mask cpuMask
	_, _, e := unix.Syscall6(unix.SYS_GET_MEMPOLICY, uintptr(unsafe.Pointer(&m)), uintptr(unsafe.Pointer(&mask)),
		maskWords*64+1, uintptr(unsafe.Pointer(&b[0])), mpolFAddr, 0)
	if e != 0 {
		return 0, -1, fmt.Errorf("get_mempolicy of an address: %w", e)
	}
	return int(m), mask.first(), nil
}

func (m *cpuMask) first() int {
	for i := 0; i < maskWords*64; i++ {
		if m[i/64]&(1<<(i%64)) != 0 {
			return i
		}
	}
	return -1
}

// mapHost maps n bytes of anonymous memory, preferring node when it is not negative, and
// touches every page so they are placed before the driver pins them.
func mapHost(n int64, node int) ([]byte, error) {
	b, err := unix.Mmap(-1, 0, int(n), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("mmap %d bytes: %w", n, err)
	}
	if node >= 0 {
		if err := BindMemory(b, node); err != nil {
			unix.Munmap(b)
			return nil, err
		}
	}
	page := os.Getpagesize()
	for i := 0; i < len(b); i += page {
		b[i] = 0
	}
	return b, nil
}

func unmapHost(b []byte) error { return unix.Munmap(b) }
