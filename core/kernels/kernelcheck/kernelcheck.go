// Package kernelcheck compiles CUDA kernel sources on a machine without a GPU and reports
// what the assembler says about each kernel: NVRTC through core/cudart (and its kernel
// cache) for each architecture of Arches (sm_90a, sm_100a), clang-16 as a second opinion,
// and ptxas -v for registers, spills, stack and shared memory. The core's kernels, every generated runtime's kernels and
// scripts/check-kernels.sh all check through it, so that a fix reaches each of them.
//
// NVRTC and Clang are the library functions; TestNVRTC and TestClang wrap them for go test,
// skipping with a clear message where a compiler is not installed.
package kernelcheck

import (
	"errors"
	"fmt"

	"github.com/resin-llm/resin/core/cudart"
)

// DefaultArch is the architecture kernels are checked for when Options.Arch is empty.
const DefaultArch = "sm_90a"

// Arches are the architectures Resin's kernels must compile for without spills: Hopper
// (H100, H200) and Blackwell (B200, GB200). NVRTC and ptxas 12.8 or newer know sm_100a.
var Arches = []string{"sm_90a", "sm_100a"}

// ClangArch is the architecture clang-16 compiles for (it has no sm_90a).
const ClangArch = "sm_90"

var (
	// ErrNoPtxas reports that no ptxas was found (RESIN_PTXAS unset and none on PATH).
	ErrNoPtxas = errors.New("kernelcheck: ptxas not found (set RESIN_PTXAS)")
	// ErrNoClang reports that no clang 16 or newer was found.
	ErrNoClang = errors.New("kernelcheck: clang-16 not found (apt-get install clang-16)")
	// ErrSpill reports a kernel that spills registers to local memory.
	ErrSpill = errors.New("kernelcheck: register spill")
	// ErrWarnings reports a compiler that printed warnings (they count as errors).
	ErrWarnings = errors.New("kernelcheck: compiler warnings")
	// ErrEntry reports a source whose output lacks an entry point it must define.
	ErrEntry = errors.New("kernelcheck: missing entry point")
)

// Options say how sources are compiled and what they must contain.
type Options struct {
	// Arch is the real architecture for NVRTC's cubin and for ptxas (default DefaultArch);
	// the PTX is compiled for the matching virtual architecture (sm_90a -> compute_90a).
	Arch string
	// Flags are the NVRTC options, e.g. core/kernels/cuda.Options.
	Flags []string
	// Includes are header texts by the name sources #include "..." them with, e.g.
	// {"prelude.cuh": cuda.Prelude()}. A quoted include not listed here is read from the
	// source's own directory in the fs.FS.
	Includes map[string]string
	// Entries lists, per source name, the extern "C" kernels its output must define.
	// A source not listed must define at least one.
	Entries map[string][]string
	// Cache stores NVRTC's output; nil compiles without a cache. TestNVRTC uses a fresh
	// one when nil.
	Cache *cudart.KernelCache
	// AllowWarnings accepts a compiler that prints warnings; by default they fail.
	AllowWarnings bool
	// Ptxas is the ptxas binary; empty: $RESIN_PTXAS, then ptxas on PATH. When none is
	// found, sources are compiled but not assembled, and Result.Kernels stays nil.
	Ptxas string
	// Clang is the clang binary; empty: FindClang.
	Clang string
}

func (o Options) arch() string {
	if o.Arch == "" {
		return DefaultArch
	}
	return o.Arch
}

// Result is what checking one source found.
type Result struct {
	Source   string   // the source's name in the fs.FS
	Compiler string   // e.g. "nvrtc 12.9" or "clang-16"
	Arch     string   // the architecture ptxas assembled for
	Cubin    []byte   // NVRTC's cubin for Arch (NVRTC only)
	PTX      []byte   // the PTX
	Log      string   // the compiler's messages
	Cached   bool     // NVRTC: the cubin and the PTX both came from the cache
	Kernels  []Kernel // ptxas -v's report, in the order ptxas gave it; nil without ptxas
	Err      error    // why the source fails the check; nil when it passes
}

// Kernel is what ptxas -v says about one entry function.
type Kernel struct {
	Name                    string
	Regs                    int // registers per thread
	SpillStores, SpillLoads int // bytes
	Stack                   int // stack frame bytes
	Smem                    int // static shared memory bytes
}

// Spills reports whether the kernel spills registers.
func (k Kernel) Spills() bool { return k.SpillStores != 0 || k.SpillLoads != 0 }

// virtualArch maps a real architecture to its virtual one: sm_90a -> compute_90a.
func virtualArch(arch string) (string, error) {
	var rest string
	if _, err := fmt.Sscanf(arch, "sm_%s", &rest); err != nil || rest == "" {
		return "", fmt.Errorf("kernelcheck: architecture %q is not of the form sm_XX", arch)
	}
	return "compute_" + rest, nil
}
