package cudart

import (
	"os"
	"reflect"
	"runtime"
	"strings"
	"testing"
)

func TestReadTopologyTwoNodes(t *testing.T) {
	top, err := ReadTopology("testdata/topology/two-node")
	if err != nil {
		t.Fatal(err)
	}
	want := []NUMANode{
		{ID: 0, CPUs: []int{0, 1, 2, 3, 8, 9, 10, 11}, MemBytes: 263921092 * 1024},
		{ID: 1, CPUs: []int{4, 5, 6, 7, 12, 13, 14, 15}, MemBytes: 264207488 * 1024},
	}
	if !reflect.DeepEqual(top.Nodes, want) {
		t.Fatalf("nodes = %+v\nwant    %+v", top.Nodes, want)
	}
	// The Mellanox NIC and the NVIDIA audio function are not GPUs.
	wantGPUs := []PCIGPU{
		{BusID: "0000:3b:00.0", Device: "0x2335", Node: 0},
		{BusID: "0000:86:00.0", Device: "0x2335", Node: 1},
		{BusID: "0000:87:00.0", Device: "0x26b9", Node: -1},
	}
	if !reflect.DeepEqual(top.GPUs, wantGPUs) {
		t.Fatalf("gpus = %+v\nwant   %+v", top.GPUs, wantGPUs)
	}
	// CUDA writes bus ids with an 8-digit domain and upper case.
	for id, node := range map[string]int{"00000000:86:00.0": 1, "0000:3B:00.0": 0, "87:00.0": -1, "0000:99:00.0": -1} {
		if got := top.GPUNode(id); got != node {
			t.Errorf("GPUNode(%s) = %d, want %d", id, got, node)
		}
	}
}

func TestReadTopologyWithoutNUMA(t *testing.T) {
	top, err := ReadTopology("testdata/topology/no-numa")
	if err != nil {
		t.Fatal(err)
	}
	if len(top.Nodes) != 1 || FormatCPUList(top.Nodes[0].CPUs) != "0-5" || len(top.GPUs) != 0 {
		t.Fatalf("topology = %+v", top)
	}
	if _, err := ReadTopology(t.TempDir()); err == nil {
		t.Fatal("an empty tree gave no error")
	}
}

func TestCPUList(t *testing.T) {
	for in, want := range map[string][]int{"0-3,8,10-11\n": {0, 1, 2, 3, 8, 10, 11}, "5": {5}, "": nil} {
		got, err := ParseCPUList(in)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("ParseCPUList(%q) = %v, %v", in, got, err)
		}
		if want != nil && FormatCPUList(got) != strings.TrimSpace(in) {
			t.Errorf("FormatCPUList(%v) = %q", got, FormatCPUList(got))
		}
	}
	for _, bad := range []string{"a", "3-1", "1-", "-2"} {
		if _, err := ParseCPUList(bad); err == nil {
			t.Errorf("ParseCPUList(%q): no error", bad)
		}
	}
}

// TestBindThisMachine binds the process for real: every thread's affinity, and the
// calling thread's memory policy.
func TestBindThisMachine(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("binding is Linux only")
	}
	top, err := ReadTopology("")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("this machine: %d NUMA node(s), node 0 cpus %s, %d NVIDIA GPU(s)", len(top.Nodes), FormatCPUList(top.Nodes[0].CPUs), len(top.GPUs))
	orig, err := ProcessAffinity()
	if err != nil {
		t.Fatal(err)
	}
	defer SetProcessAffinity(orig)

	// Narrow every thread to the first allowed CPU, then check each thread's mask.
	if err := SetProcessAffinity(orig[:1]); err != nil {
		t.Fatal(err)
	}
	checkAllThreads(t, FormatCPUList(orig[:1]))

	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	node := top.Nodes[0]
	err = BindNode(top, node.ID)
	if err != nil && strings.Contains(err.Error(), "set_mempolicy") {
		t.Skipf("memory policy not available here: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer func() { SetPreferredNode(-1); preferredNode.Store(-1) }()
	var allowed []int // the node's CPUs this cgroup lets us use
	for _, c := range node.CPUs {
		for _, o := range orig {
			if c == o {
				allowed = append(allowed, c)
			}
		}
	}
	checkAllThreads(t, FormatCPUList(allowed))
	mode, pref, err := PreferredNode()
	if err != nil {
		t.Fatal(err)
	}
	if mode != mpolPreferred || pref != node.ID {
		t.Fatalf("memory policy mode %d node %d, want MPOL_PREFERRED (%d) node %d", mode, pref, mpolPreferred, node.ID)
	}
	if err := BindNode(top, 99); err == nil {
		t.Fatal("binding to a missing node gave no error")
	}
}

// checkAllThreads asserts that every thread of the process may run on exactly cpus.
func checkAllThreads(t *testing.T, cpus string) {
	t.Helper()
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range tasks {
		status, err := os.ReadFile("/proc/self/task/" + task.Name() + "/status")
		if err != nil {
			continue // exited
		}
		for _, line := range strings.Split(string(status), "\n") {
			if v, ok := strings.CutPrefix(line, "Cpus_allowed_list:"); ok && strings.TrimSpace(v) != cpus {
				t.Fatalf("thread %s may run on %s, want %s", task.Name(), strings.TrimSpace(v), cpus)
			}
		}
	}
	if len(tasks) < 2 {
		t.Fatalf("only %d threads: the check would prove little", len(tasks))
	}
}
