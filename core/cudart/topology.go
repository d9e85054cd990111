package cudart

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// NUMANode is one memory node and the CPUs closest to it.
type NUMANode struct {
	ID       int
	CPUs     []int
	MemBytes int64 // 0 when the kernel does not say
}

// PCIGPU is an NVIDIA display or 3D controller found on the PCI bus.
type PCIGPU struct {
	BusID  string // normalised: dddd:bb:dd.f, lower case
	Device string // PCI device id, e.g. 0x2335
	Node   int    // NUMA node, -1 when the firmware does not say
}

// Topology is the machine's NUMA layout and where its GPUs sit, read from sysfs.
type Topology struct {
	Nodes []NUMANode
	GPUs  []PCIGPU
}

// ReadTopology reads the topology under root ("" or "/" for this machine; tests pass a
// fixture tree holding sys/devices/system/node and sys/bus/pci/devices). A kernel without
// NUMA support is reported as one node holding every online CPU.
func ReadTopology(root string) (*Topology, error) {
	if root == "" {
		root = "/"
	}
	t := &Topology{}
	nodeDir := filepath.Join(root, "sys/devices/system/node")
	entries, err := os.ReadDir(nodeDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("topology: %w", err)
	}
	for _, e := range entries {
		idStr, ok := strings.CutPrefix(e.Name(), "node")
		id, err := strconv.Atoi(idStr)
		if !ok || err != nil {
			continue
		}
		n := NUMANode{ID: id}
		list, err := os.ReadFile(filepath.Join(nodeDir, e.Name(), "cpulist"))
		if err != nil {
			return nil, fmt.Errorf("topology: node %d: %w", id, err)
		}
		if n.CPUs, err = ParseCPUList(string(list)); err != nil {
			return nil, fmt.Errorf("topology: node %d cpulist: %w", id, err)
		}
		if mi, err := os.ReadFile(filepath.Join(nodeDir, e.Name(), "meminfo")); err == nil {
			n.MemBytes = parseMemTotal(string(mi))
		}
		t.Nodes = append(t.Nodes, n)
	}
	if len(t.Nodes) == 0 {
		online, err := os.ReadFile(filepath.Join(root, "sys/devices/system/cpu/online"))
		if err != nil {
			return nil, fmt.Errorf("topology: no NUMA nodes and no online CPU list: %w", err)
		}
		cpus, err := ParseCPUList(string(online))
		if err != nil {
			return nil, fmt.Errorf("topology: cpu/online: %w", err)
		}
		t.Nodes = []NUMANode{{ID: 0, CPUs: cpus}}
	}
	sort.Slice(t.Nodes, func(i, j int) bool { return t.Nodes[i].ID < t.Nodes[j].ID })

	pciDir := filepath.Join(root, "sys/bus/pci/devices")
	devs, err := os.ReadDir(pciDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("topology: %w", err)
	}
	for _, d := range devs {
		dir := filepath.Join(pciDir, d.Name())
		vendor := readTrim(filepath.Join(dir, "vendor"))
		class := readTrim(filepath.Join(dir, "class"))
		// 0x10de is NVIDIA; class 0x0300xx is a VGA controller, 0x0302xx a 3D controller.
		if vendor != "0x10de" || !(strings.HasPrefix(class, "0x0300") || strings.HasPrefix(class, "0x0302")) {
			continue
		}
		g := PCIGPU{BusID: NormalizeBusID(d.Name()), Device: readTrim(filepath.Join(dir, "device")), Node: -1}
		if n, err := strconv.Atoi(readTrim(filepath.Join(dir, "numa_node"))); err == nil && n >= 0 {
			g.Node = n
		}
		t.GPUs = append(t.GPUs, g)
	}
	sort.Slice(t.GPUs, func(i, j int) bool { return t.GPUs[i].BusID < t.GPUs[j].BusID })
	return t, nil
}

// Node returns the node with the given id.
func (t *Topology) Node(id int) (NUMANode, bool) {
	for _, n := range t.Nodes {
		if n.ID == id {
			return n, true
		}
	}
	return NUMANode{}, false
}

// GPUNode returns the NUMA node of the GPU at a PCI bus id (as CUDA or sysfs writes it),
// or -1 when the GPU is not found or its node is unknown.
func (t *Topology) GPUNode(busID string) int {
	want := NormalizeBusID(busID)
	for _, g := range t.GPUs {
		if g.BusID == want {
			return g.Node
		}
	}
	return -1
}

// NormalizeBusID writes a PCI address as dddd:bb:dd.f in lower case, so that CUDA's
// "00000000:3B:00.0" and sysfs's "0000:3b:00.0" compare equal.
func NormalizeBusID(id string) string {
	id = strings.ToLower(strings.TrimSpace(id))
	parts := strings.SplitN(id, ":", 3)
	if len(parts) == 3 {
		dom := strings.TrimLeft(parts[0], "0")
		for len(dom) < 4 {
			dom = "0" + dom
		}
		return dom + ":" + parts[1] + ":" + parts[2]
	}
	if len(parts) == 2 { // bb:dd.f without a domain
		return "0000:" + id
	}
	return id
}

// ParseCPUList parses the kernel's list format, e.g. "0-3,8,10-11".
func ParseCPUList(s string) ([]int, error) {
	s = strings.TrimSpace(s)
	var cpus []int
	if s == "" {
		return cpus, nil
	}
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil || a < 0 {
			return nil, fmt.Errorf("bad cpu %q in %q", lo, s)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a {
				return nil, fmt.Errorf("bad cpu range %q in %q", part, s)
			}
		}
		for c := a; c <= b; c++ {
			cpus = append(cpus, c)
		}
	}
	return cpus, nil
}

// FormatCPUList writes CPUs in the kernel's list format.
func FormatCPUList(cpus []int) string {
	c := append([]int(nil), cpus...)
	sort.Ints(c)
	var b strings.Builder
	for i := 0; i < len(c); {
		j := i
		for j+1 < len(c) && c[j+1] == c[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		if j == i {
			fmt.Fprint(&b, c[i])
		} else {
			fmt.Fprintf(&b, "%d-%d", c[i], c[j])
		}
		i = j + 1
	}
	return b.String()
}

func parseMemTotal(meminfo string) int64 {
	for _, line := range strings.Split(meminfo, "\n") {
		if _, rest, ok := strings.Cut(line, "MemTotal:"); ok {
			f := strings.Fields(rest)
			if len(f) >= 1 {
				kb, err := strconv.ParseInt(f[0], 10, 64)
				if err == nil {
					return kb * 1024
				}
			}
		}
	}
	return 0
}

func readTrim(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
