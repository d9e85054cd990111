package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	goruntime "runtime"
	"time"

	"github.com/spf13/cobra"

	"github.com/resin-llm/resin/core/blas"
	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/kernels/ref"
)

// newDoctorCmd is `resin doctor`: what this machine offers Resin. It always exits 0; a
// machine without a GPU or a BLAS is a normal answer, stated plainly.
func newDoctorCmd() *cobra.Command {
	var sysRoot string
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Report the BLAS, CUDA driver, libraries, GPUs, NUMA layout and kernel cache found",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			doctor(cmd.OutOrStdout(), sysRoot)
			return nil
		},
	}
	cmd.Flags().StringVar(&sysRoot, "sys-root", "/", "root of the sysfs tree to read the topology from")
	cmd.Flags().MarkHidden("sys-root")
	return cmd
}

// doctor prints the report, one section after another; each section prints its own
// heading, so a new one is one more function and one more line here.
func doctor(w io.Writer, sysRoot string) {
	fmt.Fprintf(w, "resin doctor: %s/%s, %s, %d CPUs, GOMAXPROCS %d\n", goruntime.GOOS, goruntime.GOARCH, goruntime.Version(),
		goruntime.NumCPU(), goruntime.GOMAXPROCS(0))
	doctorBLAS(w, blas.Info())
	doctorCPUWeights(w)
	gpus := doctorDriver(w)
	top, topErr := cudart.ReadTopology(sysRoot)
	doctorGPUs(w, gpus, top)
	doctorQuantLinears(w, gpus)
	doctorCUDALibraries(w)
	doctorNUMA(w, top, topErr)
	doctorGPURuntime(w, gpus, top, sysRoot)
	doctorKernelCache(w)
}

// doctorBLAS reports the library the CPU path's GEMMs run on (core/blas), or why none
// does and whether Resin's own GEMM or gonum runs them.
func doctorBLAS(w io.Writer, b blas.Backend) {
	fmt.Fprintln(w, "\nBLAS (CPU GEMM)")
	switch {
	case b.Own:
		fmt.Fprintf(w, "  own       GEMM runs on Resin's own (core/kernels/ref: %s micro-kernel on the worker pool); no library: %s\n", ref.GEMMKernel(), b.Fallback)
	case !b.Loaded():
		fmt.Fprintf(w, "  none: GEMM runs on gonum (pure Go, slower): %s\n", b.Fallback)
	default:
		fmt.Fprintf(w, "  %s  %s\n", b.Vendor, b.Path)
		if b.Config != "" {
			fmt.Fprintf(w, "  version   %s\n", b.Config)
		}
		source := "the default: resin's worker pool splits GEMMs across GOMAXPROCS; RESIN_BLAS_THREADS sets it"
		if v := os.Getenv("RESIN_BLAS_THREADS"); v != "" {
			source = "RESIN_BLAS_THREADS=" + v
		}
		if b.Threads > 0 {
			fmt.Fprintf(w, "  threads   %d (%s)\n", b.Threads, source)
		} else {
			fmt.Fprintln(w, "  threads   unknown (the library has no thread-count call)")
		}
	}
	for _, warn := range b.Warnings {
		fmt.Fprintf(w, "  warning: %s\n", warn)
	}
	fmt.Fprintf(w, "  kernels   %s (core/kernels/ref's vector forms around the GEMMs; scalar loops otherwise)\n", ref.CPUKernels())
	fmt.Fprintf(w, "  pool      GOMAXPROCS %d goroutines share each parallel loop; %s (%s)\n", goruntime.GOMAXPROCS(0), poolSpinLine(ref.PoolSpinDuration()), ref.PoolSpinSource())
}

// doctorDriver reports the CUDA driver and returns the GPUs it lists.
func doctorDriver(w io.Writer) []cudart.DeviceInfo {
	fmt.Fprintln(w, "\nCUDA driver")
	fmt.Fprintf(w, "  CUDA: %s\n", cudaInUse())
	v, err := cudart.DriverVersion()
	if err != nil {
		fmt.Fprintf(w, "  not available: %v\n", err)
		return nil
	}
	fmt.Fprintf(w, "  libcuda %s, CUDA %d.%d\n", cudart.DriverPath(), v/1000, v%1000/10)
	gpus, err := cudart.Devices()
	if err != nil {
		fmt.Fprintf(w, "  listing GPUs failed: %v\n", err)
	}
	return gpus
}

// cudaInUse says which CUDA this process uses: the emulated device (RESIN_CUDA=emulate,
// as --device cuda-emu selects it), or a GPU's libraries.
func cudaInUse() string {
	if cudart.Emulated() {
		return "emulated device (core/cudart/emu), not a GPU: RESIN_CUDA=emulate; kernels run on the CPU"
	}
	return "a GPU's libraries (the driver's libcuda; RESIN_CUDA=emulate or --device cuda-emu selects the emulated device)"
}

func doctorGPUs(w io.Writer, gpus []cudart.DeviceInfo, top *cudart.Topology) {
	fmt.Fprintln(w, "\nGPUs")
	if len(gpus) == 0 {
		fmt.Fprintln(w, "  no GPU found: Resin runs its CPU reference paths here; GPU kernels cannot run")
	}
	for _, g := range gpus {
		node := -1
		if top != nil {
			node = top.GPUNode(g.PCIBusID)
		}
		fmt.Fprintf(w, "  %d: %s  %s  %d SMs  %.1f GiB  L2 %d MiB  bus %s  NUMA node %s\n", g.Ordinal, g.Name, g.Arch(), g.SMs,
			float64(g.TotalMem)/(1<<30), g.L2Bytes>>20, g.PCIBusID, nodeName(node))
	}
}

func doctorCUDALibraries(w io.Writer) {
	fmt.Fprintln(w, "\nLibraries")
	if v, err := cudart.NVRTCVersion(); err != nil {
		fmt.Fprintf(w, "  NVRTC     not available: %v\n", err)
	} else {
		archs, _ := cudart.NVRTCArchs()
		fmt.Fprintf(w, "  NVRTC     %s (%s), archs %v\n", v, cudart.NVRTCPath(), archs)
	}
	if v, err := cudart.CublasLtVersion(); err != nil {
		fmt.Fprintf(w, "  cuBLASLt  not available: %v\n", short(err))
	} else {
		fmt.Fprintf(w, "  cuBLASLt  %d\n", v)
	}
	if v, err := cudart.NCCLVersion(); err != nil {
		fmt.Fprintf(w, "  NCCL      not available: %v\n", short(err))
	} else {
		fmt.Fprintf(w, "  NCCL      %d.%d.%d\n", v/10000, v/100%100, v%100)
	}
}

func doctorNUMA(w io.Writer, top *cudart.Topology, topErr error) {
	fmt.Fprintln(w, "\nNUMA")
	if topErr != nil {
		fmt.Fprintf(w, "  topology unreadable: %v\n", topErr)
	} else {
		for _, n := range top.Nodes {
			fmt.Fprintf(w, "  node %d: cpus %s, %.1f GiB\n", n.ID, cudart.FormatCPUList(n.CPUs), float64(n.MemBytes)/(1<<30))
		}
		for _, g := range top.GPUs {
			fmt.Fprintf(w, "  NVIDIA PCI device %s (%s) on node %s\n", g.BusID, g.Device, nodeName(g.Node))
		}
	}
	if cpus, err := cudart.ProcessAffinity(); err == nil {
		fmt.Fprintf(w, "  this process may run on cpus %s\n", cudart.FormatCPUList(cpus))
	}
}

func doctorKernelCache(w io.Writer) {
	fmt.Fprintln(w, "\nKernel cache")
	kc, err := cudart.OpenKernelCache("")
	if err != nil {
		fmt.Fprintf(w, "  unavailable: %v\n", err)
		return
	}
	entries, err := kc.List()
	if err != nil {
		fmt.Fprintf(w, "  %s: %v\n", kc.Dir, err)
		return
	}
	var total int64
	for _, e := range entries {
		total += e.Bytes
	}
	fmt.Fprintf(w, "  %s: %d kernels, %d bytes (cap %d MiB)\n", kc.Dir, len(entries), total, cudart.DefaultCacheBytes>>20)
}

func nodeName(n int) string {
	if n < 0 {
		return "unknown"
	}
	return fmt.Sprint(n)
}

// short drops the loader's detail from a missing-library error.
func short(err error) string {
	for _, s := range []error{cudart.ErrNoCUBLAS, cudart.ErrNoNCCL} {
		if errors.Is(err, s) {
			return "library not found (set RESIN_CUDA_LIB_DIR to its directory)"
		}
	}
	return err.Error()
}

// poolSpinLine says what the CPU kernels' idle workers do between loops.
func poolSpinLine(spin time.Duration) string {
	if spin <= 0 {
		return "idle ones sleep at once"
	}
	return fmt.Sprintf("idle ones poll %v for the next loop before they sleep", spin)
}
