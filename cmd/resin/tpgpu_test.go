package main

import (
	"testing"

	"github.com/resin-llm/resin/core/cudart"
)

// TestGPUBindings: on the two-socket fixture (a GPU on each node, a third whose firmware
// gives no node) each GPU worker starts on its GPU's node with the node's CPUs under
// --numa auto, unbound (the reason said) for the GPU without a node and under --numa off.
func TestGPUBindings(t *testing.T) {
	top, err := cudart.ReadTopology("../../core/cudart/testdata/topology/two-node")
	if err != nil {
		t.Fatal(err)
	}
	buses := []string{"0000:3b:00.0", "0000:86:00.0", "0000:87:00.0"}
	auto, _ := cudart.ParseNUMAMode("auto")
	bs := gpuBindings(top, buses, auto, nil)
	want := []struct {
		node int
		cpus string
	}{{0, "0-3,8-11"}, {1, "4-7,12-15"}, {-1, ""}}
	for r, w := range want {
		if b := bs[r]; b.Node != w.node || cudart.FormatCPUList(b.CPUs) != w.cpus || b.BusID != buses[r] || b.Reason == "" {
			t.Errorf("rank %d: %v, want node %d cpus %q", r, b, w.node, w.cpus)
		}
	}
	off, _ := cudart.ParseNUMAMode("off")
	for r, b := range gpuBindings(top, buses, off, nil) {
		if b.Node != -1 {
			t.Errorf("--numa off, rank %d: %v", r, b)
		}
	}
}
