package cudart

import (
	"errors"
	"reflect"
	"runtime"
	"strings"
	"syscall"
	"testing"
)

func TestParseNUMAMode(t *testing.T) {
	for in, want := range map[string]NUMAMode{
		"auto": {Kind: NUMAAuto}, "AUTO": {Kind: NUMAAuto}, "": {Kind: NUMAAuto},
		"off": {Kind: NUMAOff}, " none ": {Kind: NUMAOff},
		"0": {Kind: NUMAFixed, Node: 0}, "3": {Kind: NUMAFixed, Node: 3},
	} {
		got, err := ParseNUMAMode(in)
		if err != nil || got != want {
			t.Errorf("ParseNUMAMode(%q) = %+v, %v; want %+v", in, got, err, want)
		}
		if back, _ := ParseNUMAMode(got.String()); back != got {
			t.Errorf("%+v does not round-trip through %q", got, got.String())
		}
	}
	for _, in := range []string{"-1", "yes", "node1", "1.5", "99999"} {
		_, err := ParseNUMAMode(in)
		if err == nil || !strings.Contains(err.Error(), in) {
			t.Errorf("ParseNUMAMode(%q): error %v, want one naming the input", in, err)
		}
	}
	var m NUMAMode // the zero value is auto, and the flag interface sets it
	if m.String() != "auto" || m.Type() != "auto|off|N" {
		t.Fatalf("zero mode = %q, type %q", m.String(), m.Type())
	}
	if err := m.Set("1"); err != nil || m != (NUMAMode{Kind: NUMAFixed, Node: 1}) {
		t.Fatalf("Set(1) = %+v, %v", m, err)
	}
	if err := m.Set("bogus"); err == nil || m.Node != 1 {
		t.Fatalf("Set(bogus) = %v and changed the mode to %+v", err, m)
	}
}

func readFixture(t *testing.T, name string) *Topology {
	t.Helper()
	top, err := ReadTopology("testdata/topology/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return top
}

func TestPlanNUMA(t *testing.T) {
	two := readFixture(t, "two-node")
	node1 := []int{4, 5, 6, 7, 12, 13, 14, 15}
	cases := []struct {
		name     string
		top      *Topology
		mode     string
		bus      string
		allowed  []int
		node     int
		cpus     []int
		reason   string // a phrase the reason must hold
		gpuNode  int
		wantsErr string
	}{
		{name: "auto picks the GPU's node", top: two, mode: "auto", bus: "00000000:86:00.0", node: 1, cpus: node1, reason: "sits on node 1", gpuNode: 1},
		{name: "auto keeps to the allowed cpus", top: two, mode: "auto", bus: "0000:86:00.0", allowed: []int{0, 1, 5, 13}, node: 1, cpus: []int{5, 13}, gpuNode: 1, reason: "node 1"},
		{name: "auto without allowed cpus on the node", top: two, mode: "auto", bus: "0000:86:00.0", allowed: []int{0, 1}, node: -1, gpuNode: 1, reason: "may be used by this process"},
		{name: "auto, node unknown", top: two, mode: "auto", bus: "0000:87:00.0", node: -1, gpuNode: -1, reason: "reports no NUMA node"},
		{name: "auto, GPU not on the bus", top: two, mode: "auto", bus: "0000:99:00.0", node: -1, gpuNode: -1, reason: "not found"},
		{name: "auto, no GPU", top: two, mode: "auto", node: -1, gpuNode: -1, reason: "no GPU named"},
		{name: "auto, one node", top: readFixture(t, "no-numa"), mode: "auto", bus: "0000:3b:00.0", node: -1, gpuNode: -1, reason: "one NUMA node"},
		{name: "auto, GPU on a CPU-less node", top: readFixture(t, "gpu-cpuless-node"), mode: "auto", bus: "0009:01:00.0", node: -1, gpuNode: 1, reason: "has no CPUs"},
		{name: "off", top: two, mode: "off", bus: "0000:86:00.0", node: -1, gpuNode: 1, reason: "turned off"},
		{name: "fixed, the GPU's own node", top: two, mode: "1", bus: "0000:86:00.0", node: 1, cpus: node1, gpuNode: 1, reason: "GPU's own node"},
		{name: "fixed, the far node", top: two, mode: "0", bus: "0000:86:00.0", node: 0, cpus: []int{0, 1, 2, 3, 8, 9, 10, 11}, gpuNode: 1, reason: "cross the socket link"},
		{name: "fixed, no such node", top: two, mode: "2", bus: "0000:86:00.0", wantsErr: "no such node (this machine has nodes 0-1)"},
		{name: "fixed, cpus not allowed", top: two, mode: "1", allowed: []int{0}, wantsErr: "none of its CPUs (4-7,12-15)"},
		{name: "fixed, CPU-less node", top: readFixture(t, "gpu-cpuless-node"), mode: "1", wantsErr: "none of its CPUs"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			mode, err := ParseNUMAMode(c.mode)
			if err != nil {
				t.Fatal(err)
			}
			d, err := PlanNUMA(c.top, mode, c.bus, c.allowed)
			if c.wantsErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantsErr) {
					t.Fatalf("err = %v, want one containing %q", err, c.wantsErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d.Node != c.node || !reflect.DeepEqual(d.CPUs, c.cpus) || d.GPU != c.gpuNode || d.Bound {
				t.Fatalf("decision = %+v, want node %d cpus %v gpu node %d, not bound", d, c.node, c.cpus, c.gpuNode)
			}
			if !strings.Contains(d.Reason, c.reason) || !strings.Contains(d.String(), d.Reason) {
				t.Fatalf("reason %q (line %q) lacks %q", d.Reason, d.String(), c.reason)
			}
		})
	}
}

// fakeBinder records what bindNUMA asked of the process.
type fakeBinder struct {
	allowed []int
	err     error
	node    int
	cpus    []int
	calls   int
}

func (f *fakeBinder) allowedCPUs() ([]int, error) { return f.allowed, nil }

func (f *fakeBinder) bind(_ *Topology, node int, cpus []int) error {
	f.calls++
	f.node, f.cpus = node, cpus
	return f.err
}

func TestBindNUMAApplies(t *testing.T) {
	root := "testdata/topology/two-node"
	f := &fakeBinder{allowed: []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}}
	d, err := bindNUMA(root, NUMAMode{}, "00000000:3B:00.0", f)
	if err != nil || !d.Bound || f.calls != 1 || f.node != 0 || FormatCPUList(f.cpus) != "0-3,8-11" {
		t.Fatalf("auto bind: %+v, %v; binder %+v", d, err, f)
	}
	if cur, ok := CurrentNUMA(); !ok || cur.Node != 0 || !cur.Bound {
		t.Fatalf("CurrentNUMA = %+v, %v", cur, ok)
	}
	// Off binds nothing; an unknown node binds nothing and records nothing new.
	f = &fakeBinder{}
	if d, err := bindNUMA(root, NUMAMode{Kind: NUMAOff}, "0000:3b:00.0", f); err != nil || d.Bound || f.calls != 0 {
		t.Fatalf("off: %+v, %v, %d binds", d, err, f.calls)
	}
	if _, err := bindNUMA(root, NUMAMode{Kind: NUMAFixed, Node: 7}, "", f); err == nil || f.calls != 0 {
		t.Fatalf("node 7: err %v, %d binds", err, f.calls)
	}
	if cur, _ := CurrentNUMA(); cur.Mode.Kind != NUMAOff {
		t.Fatalf("a failed plan replaced the recorded decision: %+v", cur)
	}
	// A bind the kernel refuses is an error naming the node.
	f = &fakeBinder{err: syscall.EPERM}
	if _, err := bindNUMA(root, NUMAMode{Kind: NUMAFixed, Node: 1}, "", f); !errors.Is(err, syscall.EPERM) || !strings.Contains(err.Error(), "node 1") {
		t.Fatalf("refused bind: %v", err)
	}
	if _, err := bindNUMA(t.TempDir(), NUMAMode{}, "", f); err == nil {
		t.Fatal("an unreadable topology gave no error")
	}
}

// TestBindMemory mbinds a mapping of its own to node 0 (every Linux machine has one) and
// reads the policy and the page's node back from the kernel.
func TestBindMemory(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("NUMA binding is Linux only")
	}
	b, err := mapHost(1<<20, 0)
	if errors.Is(err, syscall.ENOSYS) || errors.Is(err, syscall.EPERM) {
		t.Skipf("mbind is not allowed here: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer unmapHost(b)
	mode, node, err := MemoryPolicy(b)
	if err != nil {
		t.Fatal(err)
	}
	if mode != mpolPreferred || node != 0 {
		t.Fatalf("policy of the buffer = mode %d node %d, want MPOL_PREFERRED on node 0", mode, node)
	}
	if n, err := MemoryNode(b[len(b)-1:]); err != nil || n != 0 {
		t.Fatalf("last page on node %d, %v", n, err)
	}
	if err := BindMemory(b, maskWords*64); err == nil {
		t.Fatal("a node beyond the mask was accepted")
	}
}

// TestBindReachesOpenDeviceThreads checks that a binding made after a device opened sets
// that device thread's memory policy, not only the caller's.
func TestBindReachesOpenDeviceThreads(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("NUMA binding is Linux only")
	}
	d := fakeDevice(t, &driverAPI{})
	openDevices.add(d)
	defer openDevices.remove(d)
	defer preferredNode.Store(-1)
	preferredNode.Store(0)
	if err := applyPreferredToOpenDevices(); errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.ENOSYS) {
		t.Skipf("set_mempolicy is not allowed here: %v", err)
	} else if err != nil {
		t.Fatal(err)
	}
	var mode, node int
	var err error
	d.Do(func(*Ctx) error { mode, node, err = PreferredNode(); return nil })
	if err != nil || mode != mpolPreferred || node != 0 {
		t.Fatalf("device thread's policy: mode %d node %d (%v), want MPOL_PREFERRED on node 0", mode, node, err)
	}
	// A closed device is skipped, not an error.
	d.Close()
	if err := applyPreferredToOpenDevices(); err != nil {
		t.Fatalf("closed device: %v", err)
	}
}
