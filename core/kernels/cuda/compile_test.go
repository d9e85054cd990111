package cuda

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/cudart"
)

// wantKernels lists the entry points each source must define.
var wantKernels = map[string][]string{
	"argmax.cu":          {"resin_argmax"},
	"embedding.cu":       {"resin_embedding"},
	"moe_topk.cu":        {"resin_moe_topk"},
	"paged_attention.cu": {"resin_paged_attention"},
	"rmsnorm.cu":         {"resin_rmsnorm"},
	"rotary.cu":          {"resin_rope_neox", "resin_rope_interleaved"},
	"silu_mul.cu":        {"resin_silu_mul", "resin_silu_mul_split"},
	"softmax.cu":         {"resin_softmax"},
}

func TestSourcesListed(t *testing.T) {
	names := Names()
	if len(names) != len(wantKernels) {
		t.Fatalf("sources %v, want the %d of wantKernels", names, len(wantKernels))
	}
	for _, n := range names {
		src, err := Source(n)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(src, `#include "prelude.cuh"`) || !strings.Contains(src, "RESIN_PRELUDE") {
			t.Errorf("%s: prelude not inlined", n)
		}
		for _, k := range wantKernels[n] {
			if !strings.Contains(src, "RESIN_KERNEL void "+k+"(") {
				t.Errorf("%s: no kernel %s", n, k)
			}
		}
	}
	if _, err := Source("nope.cu"); err == nil {
		t.Error("a missing source gave no error")
	}
}

// ptxasReport is what ptxas -v says about one kernel.
type ptxasReport struct {
	Regs, SpillStores, SpillLoads, Smem, Stack int
}

var (
	reFunc  = regexp.MustCompile(`Compiling entry function '(\w+)'`)
	reRegs  = regexp.MustCompile(`Used (\d+) registers`)
	reSmem  = regexp.MustCompile(`(\d+) bytes smem`)
	reSpill = regexp.MustCompile(`(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads`)
)

// parsePtxas reads ptxas -v output into a report per kernel.
func parsePtxas(out string) map[string]ptxasReport {
	reports := map[string]ptxasReport{}
	cur := ""
	for _, line := range strings.Split(out, "\n") {
		if m := reFunc.FindStringSubmatch(line); m != nil {
			cur = m[1]
			reports[cur] = ptxasReport{}
			continue
		}
		if cur == "" {
			continue
		}
		r := reports[cur]
		if m := reSpill.FindStringSubmatch(line); m != nil {
			r.Stack, _ = strconv.Atoi(m[1])
			r.SpillStores, _ = strconv.Atoi(m[2])
			r.SpillLoads, _ = strconv.Atoi(m[3])
		}
		if m := reRegs.FindStringSubmatch(line); m != nil {
			r.Regs, _ = strconv.Atoi(m[1])
		}
		if m := reSmem.FindStringSubmatch(line); m != nil {
			r.Smem, _ = strconv.Atoi(m[1])
		}
		reports[cur] = r
	}
	return reports
}

func TestParsePtxas(t *testing.T) {
	out := `ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'resin_softmax' for 'sm_90a'
ptxas info    : Function properties for resin_softmax
    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 18 registers, 128 bytes smem, 380 bytes cmem[0]`
	got := parsePtxas(out)["resin_softmax"]
	if got != (ptxasReport{Regs: 18, SpillStores: 4, SpillLoads: 4, Smem: 128, Stack: 8}) {
		t.Fatalf("parsed %+v", got)
	}
}

// TestCompileAllKernelsSM90a compiles every kernel for sm_90a with NVRTC through
// core/cudart (both the cubin the runtime loads and PTX), stores them through the kernel
// cache, reads them back, and assembles the PTX with ptxas -v, printing registers, spills
// and shared memory per kernel. No GPU is needed.
func TestCompileAllKernelsSM90a(t *testing.T) {
	ver, err := cudart.NVRTCVersion()
	if errors.Is(err, cudart.ErrNoNVRTC) {
		t.Skipf("NVRTC not found (run .ci/setup.d/10-cuda-wheels.sh or set RESIN_NVRTC_LIB): %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("NVRTC %s from %s", ver, cudart.NVRTCPath())
	cache, err := cudart.OpenKernelCache(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ptxas := os.Getenv("RESIN_PTXAS")
	if ptxas == "" {
		ptxas, _ = exec.LookPath("ptxas")
	}
	dir := t.TempDir()
	var table []string
	for _, name := range Names() {
		src, _ := Source(name)
		cubin, err := cudart.CompileCached(cache, src, name, "sm_90a", Options...)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !strings.HasPrefix(string(cubin), "\x7fELF") {
			t.Fatalf("%s: sm_90a output is not a cubin", name)
		}
		ptx, err := cudart.CompileCached(cache, src, name, "compute_90a", Options...)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for _, k := range wantKernels[name] {
			if !strings.Contains(string(ptx), ".entry "+k+"(") {
				t.Errorf("%s: PTX has no entry %s", name, k)
			}
		}
		// A second request is served from the cache, byte for byte.
		again, err := cudart.CompileCached(cache, src, name, "compute_90a", Options...)
		if err != nil || string(again) != string(ptx) {
			t.Fatalf("%s: cached PTX differs (%v)", name, err)
		}
		if ptxas == "" {
			continue
		}
		ptxFile := filepath.Join(dir, strings.TrimSuffix(name, ".cu")+".ptx")
		if err := os.WriteFile(ptxFile, ptx, 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(ptxas, "-v", "-arch=sm_90a", "-o", ptxFile+".cubin", ptxFile).CombinedOutput()
		if err != nil {
			t.Fatalf("ptxas %s: %v\n%s", name, err, out)
		}
		reports := parsePtxas(string(out))
		for _, k := range wantKernels[name] {
			r, ok := reports[k]
			if !ok {
				t.Fatalf("ptxas said nothing about %s:\n%s", k, out)
			}
			table = append(table, fmt.Sprintf("%-24s %-22s regs %3d  spill st/ld %d/%d  stack %d  smem %5d",
				name, k, r.Regs, r.SpillStores, r.SpillLoads, r.Stack, r.Smem))
			if r.SpillStores != 0 || r.SpillLoads != 0 {
				t.Errorf("%s spills: %d bytes stored, %d loaded", k, r.SpillStores, r.SpillLoads)
			}
		}
	}
	entries, _ := cache.List()
	if len(entries) != 2*len(Names()) {
		t.Errorf("kernel cache holds %d entries, want %d", len(entries), 2*len(Names()))
	}
	if ptxas == "" {
		t.Skip("compiled every kernel with NVRTC, but ptxas was not found (set RESIN_PTXAS): no register report")
	}
	t.Logf("ptxas -v -arch=sm_90a (NVRTC %s):\n%s", ver, strings.Join(table, "\n"))
}
