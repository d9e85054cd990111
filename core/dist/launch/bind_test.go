package launch_test

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/dist/launch"
)

func topology(t *testing.T, name string) *cudart.Topology {
	top, err := cudart.ReadTopology("../../cudart/testdata/topology/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return top
}

// TestPlanBindingsGPUs: on the two-socket fixture (a GPU on each node, a third whose
// firmware gives no node), each local rank gets its GPU and that GPU's node, within the
// CPUs the process may use; the launcher's CUDA_VISIBLE_DEVICES is followed.
func TestPlanBindingsGPUs(t *testing.T) {
	top := topology(t, "two-node")
	bs, err := launch.PlanBindings(top, 3, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		gpu, bus string
		node     int
		cpus     string
	}{{"0", "0000:3b:00.0", 0, "0-3,8-11"}, {"1", "0000:86:00.0", 1, "4-7,12-15"}, {"2", "0000:87:00.0", -1, ""}}
	for r, w := range want {
		b := bs[r]
		if b.GPU != w.gpu || b.BusID != w.bus || b.Node != w.node || cudart.FormatCPUList(b.CPUs) != w.cpus {
			t.Errorf("rank %d: %v", r, b)
		}
	}
	if !strings.Contains(bs[2].Reason, "no NUMA node") {
		t.Errorf("rank 2's reason: %q", bs[2].Reason)
	}
	env := bs[1].Env()
	for _, kv := range []string{"CUDA_DEVICE_ORDER=PCI_BUS_ID", "CUDA_VISIBLE_DEVICES=1", "RESIN_BIND_NODE=1", "RESIN_BIND_CPUS=4-7,12-15"} {
		if !slices.Contains(env, kv) {
			t.Errorf("rank 1's env %v lacks %s", env, kv)
		}
	}
	if env := bs[2].Env(); slices.ContainsFunc(env, func(s string) bool { return strings.HasPrefix(s, "RESIN_BIND") }) {
		t.Errorf("rank 2 (no node) binds: %v", env)
	}
	// The launcher may use only node 1's first CPUs and sees GPUs 1 and 0, in that order.
	bs, err = launch.PlanBindings(top, 2, []string{"1", "0"}, []int{4, 5, 0})
	if err != nil {
		t.Fatal(err)
	}
	if bs[0].GPU != "1" || bs[0].Node != 1 || !reflect.DeepEqual(bs[0].CPUs, []int{4, 5}) || bs[1].GPU != "0" || !reflect.DeepEqual(bs[1].CPUs, []int{0}) {
		t.Fatalf("with CUDA_VISIBLE_DEVICES=1,0: %v; %v", bs[0], bs[1])
	}
	// A UUID has no PCI address here: the GPU is passed on, the node left alone.
	bs, err = launch.PlanBindings(top, 1, []string{"GPU-5d3c"}, nil)
	if err != nil || bs[0].GPU != "GPU-5d3c" || bs[0].Node != -1 {
		t.Fatalf("uuid: %v %v", bs, err)
	}
	if _, err := launch.PlanBindings(top, 4, nil, nil); err == nil || !strings.Contains(err.Error(), "4 local ranks for 3 GPUs") {
		t.Fatalf("4 ranks on 3 GPUs: %v", err)
	}
}

// TestPlanBindingsCPU: without GPUs the ranks go round-robin over the NUMA nodes that
// have usable CPUs; a GPU whose node has no CPU is bound nowhere.
func TestPlanBindingsCPU(t *testing.T) {
	top := topology(t, "two-node")
	top.GPUs = nil
	bs, err := launch.PlanBindings(top, 3, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if bs[0].Node != 0 || bs[1].Node != 1 || bs[2].Node != 0 || bs[0].GPU != "" {
		t.Fatalf("cpu ranks: %v; %v; %v", bs[0], bs[1], bs[2])
	}
	if env := bs[1].Env(); slices.ContainsFunc(env, func(s string) bool { return strings.HasPrefix(s, "CUDA_") }) {
		t.Errorf("a CPU rank gets CUDA variables: %v", env)
	}
	// Only node 1's CPUs allowed: every rank there.
	bs, _ = launch.PlanBindings(top, 2, nil, []int{6, 7})
	if bs[0].Node != 1 || bs[1].Node != 1 {
		t.Fatalf("allowed 6,7: %v; %v", bs[0], bs[1])
	}
	bs, err = launch.PlanBindings(topology(t, "gpu-cpuless-node"), 1, nil, nil)
	if err != nil || bs[0].Node != -1 || !strings.Contains(bs[0].Reason, "has no CPU") {
		t.Fatalf("gpu on a cpu-less node: %v %v", bs, err)
	}
}
