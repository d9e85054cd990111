package blas

import (
	"fmt"
	"runtime"
	"strings"

	"golang.org/x/sys/cpu"
)

// preAVX2Cores are OpenBLAS core names of CPUs without AVX2. An OpenBLAS that names one on
// a CPU with AVX2 did not recognise the CPU (Debian bookworm's 0.3.21 on recent Xeons says
// Prescott) and runs SSE kernels several times slower than the CPU allows.
var preAVX2Cores = []string{"Katmai", "Coppermine", "Northwood", "Banias", "Prescott", "Core2", "Penryn",
	"Dunnington", "Nehalem", "Sandybridge", "Atom", "Opteron", "Barcelona"}

// coreWarning returns a warning when an OpenBLAS configuration string names a pre-AVX2
// core on a CPU with AVX2 (AVX-512 when avx512), saying how to pick the right kernels; ""
// otherwise.
func coreWarning(vendor, config string, avx2, avx512 bool) string {
	if vendor != "OpenBLAS" || !avx2 {
		return ""
	}
	fields := strings.Fields(config)
	for _, field := range fields {
		for _, core := range preAVX2Cores {
			if !strings.EqualFold(field, core) {
				continue
			}
			name := strings.Join(fields[:min(2, len(fields))], " ") // "OpenBLAS 0.3.21"
			isa, want := "AVX2", "Haswell"
			if avx512 {
				isa, want = "AVX-512", "SkylakeX"
			}
			return fmt.Sprintf("%s runs its %s kernels on this CPU, which has %s: it did not recognise the CPU and its GEMM "+
				"is several times slower than it could be; set OPENBLAS_CORETYPE=%s before starting, or point RESIN_BLAS_LIB "+
				"at a newer OpenBLAS (pip install scipy-openblas32)", name, field, isa, want)
		}
	}
	return ""
}

// cpuWarning is coreWarning for this machine's CPU.
func cpuWarning(l *Library) string {
	if runtime.GOARCH != "amd64" {
		return ""
	}
	return coreWarning(l.Vendor, l.Config, cpu.X86.HasAVX2, cpu.X86.HasAVX512F)
}
