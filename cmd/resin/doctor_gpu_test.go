package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/cudart"
)

func TestDoctorGPURuntime(t *testing.T) {
	const root = "../../core/cudart/testdata/topology/two-node"
	top, err := cudart.ReadTopology(root)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	doctorGPURuntime(&out, nil, top, root)
	got := out.String()
	for _, want := range []string{
		"GPU runtime",
		"NVIDIA PCI device 0000:3b:00.0: numa auto: would bind to node 0 (cpus 0-3,8-11): the GPU at 0000:3b:00.0 sits on node 0",
		"NVIDIA PCI device 0000:86:00.0: numa auto: would bind to node 1 (cpus 4-7,12-15)",
		"NVIDIA PCI device 0000:87:00.0: numa auto: not bound: the firmware reports no NUMA node",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("doctor's GPU runtime section lacks %q:\n%s", want, got)
		}
	}
	if _, err := cudart.DriverVersion(); err != nil && !strings.Contains(got, "NVRTC and driver versions not compared") {
		t.Errorf("no driver here, but the section does not say the versions went unchecked:\n%s", got)
	}
}

// TestDoctorSaysWhichCUDA: doctor names the emulated device when RESIN_CUDA=emulate selects
// it, and a GPU's libraries otherwise.
func TestDoctorSaysWhichCUDA(t *testing.T) {
	t.Setenv("RESIN_CUDA", "")
	if got := cudaInUse(); !strings.Contains(got, "a GPU's libraries") {
		t.Errorf("without RESIN_CUDA: %q", got)
	}
	t.Setenv("RESIN_CUDA", "emulate")
	if got := cudaInUse(); !strings.Contains(got, "emulated device") || !strings.Contains(got, "not a GPU") {
		t.Errorf("RESIN_CUDA=emulate: %q", got)
	}
}
