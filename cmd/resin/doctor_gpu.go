package main

import (
	"errors"
	"fmt"
	"io"

	"github.com/resin-llm/resin/core/cudart"
)

// doctorGPURuntime reports what the CUDA runner path would decide on this machine: whether
// NVRTC's kernels load on the driver, a stale RESIN_NVRTC_LIB passed over, and where
// `--numa auto` binds a runner for each GPU (sysRoot is the sysfs tree the topology came
// from; the process's own CPU mask is applied only to the real one).
func doctorGPURuntime(w io.Writer, gpus []cudart.DeviceInfo, top *cudart.Topology, sysRoot string) {
	fmt.Fprintln(w, "\nGPU runtime")
	switch err := cudart.CheckNVRTCDriver(); {
	case err == nil:
		v, _ := cudart.NVRTCVersion()
		dv, _ := cudart.DriverVersion()
		fmt.Fprintf(w, "  NVRTC %s builds kernels the driver (CUDA %d.%d) loads\n", v, dv/1000, dv%1000/10)
	case errors.Is(err, cudart.ErrNoCUDA):
		fmt.Fprintln(w, "  NVRTC and driver versions not compared: no CUDA driver")
	case errors.Is(err, cudart.ErrNoNVRTC):
		fmt.Fprintln(w, "  NVRTC and driver versions not compared: NVRTC not found (set RESIN_NVRTC_LIB or RESIN_CUDA_LIB_DIR)")
	default:
		fmt.Fprintf(w, "  error: %v\n", err)
	}
	if warn := cudart.NVRTCWarning(); warn != "" {
		fmt.Fprintf(w, "  warning: %s\n", warn)
	}

	if top == nil {
		fmt.Fprintln(w, "  NUMA binding: topology unreadable")
		return
	}
	var allowed []int
	if sysRoot == "" || sysRoot == "/" {
		allowed, _ = cudart.ProcessAffinity()
	}
	mode := cudart.NUMAMode{Kind: cudart.NUMAAuto}
	plan := func(name, bus string) {
		d, err := cudart.PlanNUMA(top, mode, bus, allowed)
		if err != nil {
			fmt.Fprintf(w, "  %s: %v\n", name, err)
			return
		}
		fmt.Fprintf(w, "  %s: %s\n", name, d)
	}
	if len(gpus) > 0 {
		for _, g := range gpus {
			plan(fmt.Sprintf("GPU %d (%s)", g.Ordinal, g.PCIBusID), g.PCIBusID)
		}
	} else {
		// No driver: the NVIDIA devices sysfs lists show what a runner would do there.
		for _, g := range top.GPUs {
			plan("NVIDIA PCI device "+g.BusID, g.BusID)
		}
		if len(top.GPUs) == 0 {
			fmt.Fprintln(w, "  NUMA binding: no GPU to bind next to")
		}
	}
	if d, ok := cudart.CurrentNUMA(); ok {
		fmt.Fprintf(w, "  this process: %s\n", d)
	}
}
