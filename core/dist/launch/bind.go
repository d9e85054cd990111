package launch

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/resin-llm/resin/core/cudart"
)

// Binding is where one local rank runs: its GPU and that GPU's NUMA node (with the node's
// CPUs the process may use), or on a host without GPUs a NUMA node of its own.
type Binding struct {
	LocalRank int
	// GPU is what the worker's CUDA_VISIBLE_DEVICES holds (an index in PCI bus order, or
	// the entry of the launcher's own CUDA_VISIBLE_DEVICES); "" on a host without GPUs.
	GPU   string
	BusID string // the GPU's PCI address, "" when unknown
	// Node is the NUMA node to bind to, -1 for none; CPUs are its CPUs the process may
	// use.
	Node   int
	CPUs   []int
	Reason string // why this node, or why none
}

// String is the one-line summary a launcher logs per rank.
func (b Binding) String() string {
	gpu := "no gpu"
	if b.GPU != "" {
		gpu = "gpu " + b.GPU
		if b.BusID != "" {
			gpu += " (" + b.BusID + ")"
		}
	}
	if b.Node < 0 {
		return fmt.Sprintf("local rank %d: %s, numa not bound: %s", b.LocalRank, gpu, b.Reason)
	}
	return fmt.Sprintf("local rank %d: %s, numa node %d (cpus %s): %s", b.LocalRank, gpu, b.Node, cudart.FormatCPUList(b.CPUs), b.Reason)
}

// PlanBindings binds n local ranks on top. With GPUs, rank r gets the r-th GPU: the r-th
// entry of visible (the launcher's own CUDA_VISIBLE_DEVICES split at commas; nil: every
// GPU of top, in PCI bus order, which the worker's CUDA_DEVICE_ORDER=PCI_BUS_ID makes
// CUDA's order too) and that GPU's NUMA node. Without GPUs (a CPU server running TP
// across its sockets, as SGLang's CPU backend does), the ranks go round-robin over the
// nodes that have CPUs. allowed lists the CPUs the launcher may use (nil: no limit); a
// node none of whose CPUs are allowed is not bound to. More ranks than GPUs is an error.
func PlanBindings(top *cudart.Topology, n int, visible []string, allowed []int) ([]Binding, error) {
	if top == nil {
		return nil, fmt.Errorf("launch: bind %d ranks: no topology", n)
	}
	if n < 1 {
		return nil, fmt.Errorf("launch: bind %d ranks", n)
	}
	out := make([]Binding, n)
	gpus := len(top.GPUs)
	if visible != nil {
		gpus = len(visible)
	}
	if gpus == 0 {
		var nodes []cudart.NUMANode
		for _, nd := range top.Nodes {
			if len(usable(nd.CPUs, allowed)) > 0 {
				nodes = append(nodes, nd)
			}
		}
		for r := range out {
			out[r] = Binding{LocalRank: r, Node: -1, Reason: "no NUMA node has CPUs this process may use"}
			if len(nodes) > 0 {
				nd := nodes[r%len(nodes)]
				out[r].Node, out[r].CPUs = nd.ID, usable(nd.CPUs, allowed)
				out[r].Reason = fmt.Sprintf("no GPU: ranks round-robin over %d NUMA nodes", len(nodes))
			}
		}
		return out, nil
	}
	if n > gpus {
		return nil, fmt.Errorf("launch: %d local ranks for %d GPUs (one rank per GPU)", n, gpus)
	}
	for r := range out {
		b := Binding{LocalRank: r, Node: -1}
		idx := r
		if visible != nil {
			b.GPU = strings.TrimSpace(visible[r])
			var err error
			if idx, err = strconv.Atoi(b.GPU); err != nil {
				idx = -1 // a UUID or MIG name: no PCI address to find its node by
			}
		} else {
			b.GPU = strconv.Itoa(r)
		}
		switch {
		case idx < 0 || idx >= len(top.GPUs):
			b.Reason = fmt.Sprintf("CUDA_VISIBLE_DEVICES entry %q names no GPU of the PCI bus", b.GPU)
		default:
			g := top.GPUs[idx]
			b.BusID = g.BusID
			nd, ok := top.Node(g.Node)
			cpus := usable(nd.CPUs, allowed)
			switch {
			case g.Node < 0:
				b.Reason = "the firmware reports no NUMA node for the GPU"
			case !ok || len(cpus) == 0:
				b.Reason = fmt.Sprintf("the GPU's node %d has no CPU this process may use", g.Node)
			default:
				b.Node, b.CPUs, b.Reason = g.Node, cpus, "the GPU's node"
			}
		}
		out[r] = b
	}
	return out, nil
}

func usable(cpus, allowed []int) []int {
	if allowed == nil {
		return slices.Clone(cpus)
	}
	var out []int
	for _, c := range cpus {
		if slices.Contains(allowed, c) {
			out = append(out, c)
		}
	}
	return out
}

// The environment a binding gives a worker.
const (
	EnvNode = "RESIN_BIND_NODE" // the NUMA node, absent for none
	EnvCPUs = "RESIN_BIND_CPUS" // its CPUs, as a cpulist (0-3,8)
)

// Env is the binding as the worker's environment: CUDA_DEVICE_ORDER=PCI_BUS_ID and
// CUDA_VISIBLE_DEVICES with its one GPU (so the worker's device 0 is its GPU), and the
// NUMA node and CPUs that ApplyEnv binds to.
func (b Binding) Env() []string {
	var env []string
	if b.GPU != "" {
		env = append(env, "CUDA_DEVICE_ORDER=PCI_BUS_ID", "CUDA_VISIBLE_DEVICES="+b.GPU)
	}
	if b.Node >= 0 {
		env = append(env, EnvNode+"="+strconv.Itoa(b.Node), EnvCPUs+"="+cudart.FormatCPUList(b.CPUs))
	}
	return env
}

// ApplyEnv binds this process (a worker) as its environment says: every thread's CPU
// affinity to RESIN_BIND_CPUS and the memory policy preferring RESIN_BIND_NODE (the
// calling thread's; cudart's device threads take cudart.BindNUMA's). It returns the node
// bound, or -1 when the environment names none.
func ApplyEnv() (int, error) {
	ns := os.Getenv(EnvNode)
	if ns == "" {
		return -1, nil
	}
	node, err := strconv.Atoi(ns)
	if err != nil || node < 0 {
		return -1, fmt.Errorf("launch: %s=%q is not a NUMA node", EnvNode, ns)
	}
	cpus, err := cudart.ParseCPUList(os.Getenv(EnvCPUs))
	if err != nil || len(cpus) == 0 {
		return -1, fmt.Errorf("launch: %s=%q is not a CPU list", EnvCPUs, os.Getenv(EnvCPUs))
	}
	if err := cudart.SetProcessAffinity(cpus); err != nil {
		return -1, fmt.Errorf("launch: bind to node %d: %w", node, err)
	}
	if err := cudart.SetPreferredNode(node); err != nil {
		return -1, fmt.Errorf("launch: prefer node %d's memory: %w", node, err)
	}
	return node, nil
}
