package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/cudart"
)

func TestDoctorWithoutGPU(t *testing.T) {
	t.Setenv("RESIN_KERNEL_CACHE", t.TempDir())
	cmd := newDoctorCmd()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"--sys-root", "../../core/cudart/testdata/topology/two-node"})
	if err := cmd.Execute(); err != nil {
		t.Fatalf("doctor failed: %v", err)
	}
	got := out.String()
	for _, want := range []string{"CUDA driver", "NVRTC", "node 0: cpus 0-3,8-11", "node 1: cpus 4-7,12-15",
		"NVIDIA PCI device 0000:86:00.0 (0x2335) on node 1", "Kernel cache", "0 kernels"} {
		if !strings.Contains(got, want) {
			t.Errorf("doctor output lacks %q:\n%s", want, got)
		}
	}
	if _, err := cudart.DeviceCount(); err != nil && !strings.Contains(got, "no GPU found") {
		t.Errorf("no driver here, but doctor does not say so:\n%s", got)
	}
}
