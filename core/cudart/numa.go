package cudart

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// preferredNode is the node BindNode or BindNUMA chose, applied to each Device's thread as
// it starts; -1 when the process is not bound.
var preferredNode atomic.Int64

func init() { preferredNode.Store(-1) }

// maskWords is the size of the CPU and node masks passed to the kernel: 1024 bits.
const maskWords = 16

// Memory policy modes (MPOL_*) of set_mempolicy and mbind.
const (
	mpolDefault   = 0
	mpolPreferred = 1
)

// NUMAKind is how a runner chooses the NUMA node it binds to.
type NUMAKind int

const (
	// NUMAAuto binds to the GPU's own node, when the machine has more than one node and
	// the firmware says which one the GPU sits on. It is the zero value.
	NUMAAuto NUMAKind = iota
	// NUMAOff leaves the process's CPU affinity and memory policy alone.
	NUMAOff
	// NUMAFixed binds to the node the user named.
	NUMAFixed
)

// NUMAMode is the choice behind `--numa auto|off|N`. Its zero value is auto. *NUMAMode
// implements flag.Value and pflag.Value (String, Set, Type), so a command can take it as a
// flag directly.
type NUMAMode struct {
	Kind NUMAKind
	Node int // the node, for NUMAFixed
}

// ParseNUMAMode parses "auto", "off" or a node number such as "1".
func ParseNUMAMode(s string) (NUMAMode, error) {
	switch v := strings.ToLower(strings.TrimSpace(s)); v {
	case "auto", "":
		return NUMAMode{Kind: NUMAAuto}, nil
	case "off", "none":
		return NUMAMode{Kind: NUMAOff}, nil
	default:
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return NUMAMode{}, fmt.Errorf("numa mode %q: want auto, off or a node number (0, 1, ...)", s)
		}
		if n >= maskWords*64 {
			return NUMAMode{}, fmt.Errorf("numa mode %q: node %d is beyond the %d nodes Linux addresses here", s, n, maskWords*64)
		}
		return NUMAMode{Kind: NUMAFixed, Node: n}, nil
	}
}

// String writes the mode as ParseNUMAMode reads it.
func (m NUMAMode) String() string {
	switch m.Kind {
	case NUMAOff:
		return "off"
	case NUMAFixed:
		return strconv.Itoa(m.Node)
	default:
		return "auto"
	}
}

// Set implements flag.Value.
func (m *NUMAMode) Set(s string) error {
	v, err := ParseNUMAMode(s)
	if err != nil {
		return err
	}
	*m = v
	return nil
}

// Type implements pflag.Value.
func (m *NUMAMode) Type() string { return "auto|off|N" }

// NUMADecision is what a NUMA mode means for one GPU on this machine: the node chosen
// (-1: none), its CPUs the process may use, whether the binding was applied, and why.
// `resin doctor` prints it; a runner logs it at start.
type NUMADecision struct {
	Mode   NUMAMode
	BusID  string // the GPU's PCI address ("" when no GPU was named)
	GPU    int    // the GPU's NUMA node as sysfs reports it, -1 when unknown
	Node   int    // the node to bind to, -1 for no binding
	CPUs   []int  // the CPUs the process is bound to: the node's, within those allowed
	Bound  bool   // BindNUMA applied it (affinity and memory policy)
	Reason string // why this node, or why no binding
}

// String is the one-line summary doctor and runners print.
func (d NUMADecision) String() string {
	if d.Node < 0 {
		return fmt.Sprintf("numa %s: not bound: %s", d.Mode, d.Reason)
	}
	state := "would bind"
	if d.Bound {
		state = "bound"
	}
	return fmt.Sprintf("numa %s: %s to node %d (cpus %s): %s", d.Mode, state, d.Node, FormatCPUList(d.CPUs), d.Reason)
}

// PlanNUMA decides, without touching the process, where mode puts a runner for the GPU at
// PCI address busID on topology top. allowed lists the CPUs the process may use (its
// cpuset; nil means no limit): a node none of whose CPUs are allowed cannot be bound to.
// Auto mode never fails, it explains why it binds nowhere; a node number that does not
// exist or has no usable CPU is an error.
func PlanNUMA(top *Topology, mode NUMAMode, busID string, allowed []int) (NUMADecision, error) {
	d := NUMADecision{Mode: mode, BusID: busID, GPU: -1, Node: -1}
	if top == nil {
		return d, fmt.Errorf("numa %s: no topology", mode)
	}
	if busID != "" {
		d.GPU = top.GPUNode(busID)
	}
	switch mode.Kind {
	case NUMAOff:
		d.Reason = "binding turned off (--numa off)"
		return d, nil
	case NUMAFixed:
		n, ok := top.Node(mode.Node)
		if !ok {
			return d, fmt.Errorf("numa node %d: no such node (this machine has nodes %s)", mode.Node, nodeIDs(top))
		}
		cpus := intersect(n.CPUs, allowed)
		if len(cpus) == 0 {
			return d, fmt.Errorf("numa node %d: none of its CPUs (%s) may be used by this process (allowed: %s)",
				n.ID, FormatCPUList(n.CPUs), FormatCPUList(allowed))
		}
		d.Node, d.CPUs = n.ID, cpus
		d.Reason = fmt.Sprintf("node %d requested", n.ID)
		switch {
		case busID == "":
		case d.GPU < 0:
			d.Reason += fmt.Sprintf("; the GPU's node at %s is unknown", busID)
		case d.GPU != n.ID:
			d.Reason += fmt.Sprintf("; the GPU at %s sits on node %d, so host-device copies cross the socket link", busID, d.GPU)
		default:
			d.Reason += fmt.Sprintf(", the GPU's own node (bus %s)", busID)
		}
		return d, nil
	}
	// Auto.
	switch {
	case busID == "":
		d.Reason = "no GPU named"
	case len(top.Nodes) < 2:
		d.Reason = "one NUMA node: every CPU is as close to the GPU as any other"
	case !hasGPU(top, busID):
		d.Reason = fmt.Sprintf("GPU %s not found under /sys/bus/pci/devices", busID)
	case d.GPU < 0:
		d.Reason = fmt.Sprintf("the firmware reports no NUMA node for the GPU at %s", busID)
	default:
		n, ok := top.Node(d.GPU)
		if !ok {
			d.Reason = fmt.Sprintf("the GPU at %s reports node %d, which is not among the nodes %s", busID, d.GPU, nodeIDs(top))
			return d, nil
		}
		cpus := intersect(n.CPUs, allowed)
		if len(cpus) == 0 {
			if len(n.CPUs) == 0 {
				d.Reason = fmt.Sprintf("the GPU's node %d has no CPUs", n.ID)
			} else {
				d.Reason = fmt.Sprintf("none of node %d's CPUs (%s) may be used by this process (allowed: %s)",
					n.ID, FormatCPUList(n.CPUs), FormatCPUList(allowed))
			}
			return d, nil
		}
		d.Node, d.CPUs = n.ID, cpus
		d.Reason = fmt.Sprintf("the GPU at %s sits on node %d", busID, n.ID)
	}
	return d, nil
}

func hasGPU(top *Topology, busID string) bool {
	want := NormalizeBusID(busID)
	for _, g := range top.GPUs {
		if g.BusID == want {
			return true
		}
	}
	return false
}

func nodeIDs(top *Topology) string {
	ids := make([]int, len(top.Nodes))
	for i, n := range top.Nodes {
		ids[i] = n.ID
	}
	return FormatCPUList(ids)
}

// intersect returns the CPUs of a that are in allowed (all of a when allowed is nil).
func intersect(a, allowed []int) []int {
	if allowed == nil {
		return append([]int(nil), a...)
	}
	ok := make(map[int]bool, len(allowed))
	for _, c := range allowed {
		ok[c] = true
	}
	var out []int
	for _, c := range a {
		if ok[c] {
			out = append(out, c)
		}
	}
	return out
}

var (
	numaMu      sync.Mutex
	numaCurrent *NUMADecision
)

// CurrentNUMA returns the decision the last BindNUMA of this process made, if any.
func CurrentNUMA() (NUMADecision, bool) {
	numaMu.Lock()
	defer numaMu.Unlock()
	if numaCurrent == nil {
		return NUMADecision{}, false
	}
	return *numaCurrent, true
}

// BindNUMA applies mode for GPU dev to this process: with a node chosen, every thread's
// CPU affinity becomes that node's CPUs and the memory policy prefers the node (the
// calling thread's and every open Device thread's at once, later Device threads' as they
// start). Pinned host buffers follow through Ctx.AllocHostOn with the decision's Node. It
// reads the machine's topology from sysfs and records the decision for CurrentNUMA. It must
// not be called inside Device.Do.
func BindNUMA(mode NUMAMode, dev DeviceInfo) (NUMADecision, error) {
	return bindNUMA("/", mode, dev.PCIBusID, osBinder{})
}

// binder is the part of BindNUMA that changes the process, replaced by a fake in tests.
type binder interface {
	allowedCPUs() ([]int, error)
	bind(top *Topology, node int, cpus []int) error
}

func bindNUMA(root string, mode NUMAMode, busID string, b binder) (NUMADecision, error) {
	top, err := ReadTopology(root)
	if err != nil {
		return NUMADecision{Mode: mode, BusID: busID, GPU: -1, Node: -1}, fmt.Errorf("numa %s: %w", mode, err)
	}
	var allowed []int
	if mode.Kind != NUMAOff {
		if allowed, err = b.allowedCPUs(); err != nil {
			allowed = nil // not knowing the cpuset only loses the check
		}
	}
	d, err := PlanNUMA(top, mode, busID, allowed)
	if err != nil {
		return d, err
	}
	if d.Node >= 0 {
		if err := b.bind(top, d.Node, d.CPUs); err != nil {
			return d, fmt.Errorf("numa %s: bind to node %d: %w", mode, d.Node, err)
		}
		d.Bound = true
	}
	numaMu.Lock()
	numaCurrent = &d
	numaMu.Unlock()
	return d, nil
}

// osBinder binds the real process.
type osBinder struct{}

func (osBinder) allowedCPUs() ([]int, error) { return ProcessAffinity() }

func (osBinder) bind(_ *Topology, node int, cpus []int) error {
	if err := bindProcess(node, cpus); err != nil {
		return err
	}
	return applyPreferredToOpenDevices()
}
