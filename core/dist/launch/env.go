// Package launch is the process side of Resin's parallel layouts: where a node sits in a
// multi-node group (read from flags or from the environment torchrun and Kubernetes'
// LeaderWorkerSet give a pod), which GPU and NUMA node each local rank is bound to, and
// the supervision of the worker processes of one host (a worker that dies fails the
// step in flight with an error naming it, and the group stops, no process left behind).
//
// The collectives themselves are core/dist's; this package starts processes and hands
// them their place.
package launch

import (
	"fmt"
	"net"
	"strconv"
)

// DefaultPort is the rendezvous port when the environment names a host only
// (LWS_LEADER_ADDRESS; torchrun's MASTER_PORT default).
const DefaultPort = "29500"

// Node is this node's place in a multi-node group: the rendezvous address node 0 listens
// on (--dist-init-addr HOST:PORT), the number of nodes and this node's rank.
type Node struct {
	InitAddr string
	NNodes   int
	NodeRank int
	// LocalRank is torchrun's LOCAL_RANK, the process's index on its machine (0 when unset
	// or not torchrun's): a GPU rank runs on GPU --gpu+LocalRank, as torchrun's processes
	// of one machine each take their own GPU.
	LocalRank int
	// From says where it came from: "flags", "torchrun" or "leaderworkerset".
	From string
}

// NodeFromEnv reads a multi-node layout from getenv (os.Getenv): Kubernetes'
// LeaderWorkerSet (LWS_LEADER_ADDRESS, LWS_GROUP_SIZE, LWS_WORKER_INDEX, the port from
// RESIN_DIST_PORT, else MASTER_PORT, else DefaultPort) first, then torchrun's
// (MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK, and LOCAL_RANK when set: one process per
// rank, each a "node" of one rank here). ok is false when neither is set; a layout
// that is set but malformed is an error naming the variable.
func NodeFromEnv(getenv func(string) string) (n Node, ok bool, err error) {
	port := func() string {
		for _, v := range []string{"RESIN_DIST_PORT", "MASTER_PORT"} {
			if p := getenv(v); p != "" {
				return p
			}
		}
		return DefaultPort
	}
	atoi := func(name string) (int, error) {
		s := getenv(name)
		v, err := strconv.Atoi(s)
		if err != nil {
			return 0, fmt.Errorf("launch: %s=%q is not an integer", name, s)
		}
		return v, nil
	}
	switch {
	case getenv("LWS_LEADER_ADDRESS") != "":
		n.From = "leaderworkerset"
		if n.NNodes, err = atoi("LWS_GROUP_SIZE"); err != nil {
			return n, true, err
		}
		if n.NodeRank, err = atoi("LWS_WORKER_INDEX"); err != nil {
			return n, true, err
		}
		n.InitAddr = net.JoinHostPort(getenv("LWS_LEADER_ADDRESS"), port())
	case getenv("MASTER_ADDR") != "" && getenv("WORLD_SIZE") != "":
		n.From = "torchrun"
		if n.NNodes, err = atoi("WORLD_SIZE"); err != nil {
			return n, true, err
		}
		if n.NodeRank, err = atoi("RANK"); err != nil {
			return n, true, err
		}
		if getenv("LOCAL_RANK") != "" {
			if n.LocalRank, err = atoi("LOCAL_RANK"); err != nil {
				return n, true, err
			}
			if n.LocalRank < 0 {
				return n, true, fmt.Errorf("launch: LOCAL_RANK=%d is negative", n.LocalRank)
			}
		}
		p := getenv("MASTER_PORT")
		if p == "" {
			p = DefaultPort
		}
		n.InitAddr = net.JoinHostPort(getenv("MASTER_ADDR"), p)
	default:
		return Node{}, false, nil
	}
	return n, true, n.Check()
}

// Check validates the layout: at least one node, the rank among them, and a HOST:PORT
// address with a numeric port.
func (n Node) Check() error {
	if n.NNodes < 1 {
		return fmt.Errorf("launch: %d nodes (%s)", n.NNodes, n.From)
	}
	if n.NodeRank < 0 || n.NodeRank >= n.NNodes {
		return fmt.Errorf("launch: node rank %d outside [0, %d) (%s)", n.NodeRank, n.NNodes, n.From)
	}
	host, port, err := net.SplitHostPort(n.InitAddr)
	if err != nil || host == "" {
		return fmt.Errorf("launch: rendezvous address %q is not HOST:PORT (%s)", n.InitAddr, n.From)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return fmt.Errorf("launch: rendezvous port %q of %s is not a port number (%s)", port, n.InitAddr, n.From)
	}
	return nil
}
