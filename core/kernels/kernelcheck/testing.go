package kernelcheck

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/cudart"
)

// TestNVRTC checks sources with NVRTC for go test: it skips, saying how to install it,
// where NVRTC is not found; fails on every Result.Err (compile error, warning, missing
// entry, spill); compiles everything a second time and fails unless each source comes
// back from the kernel cache byte for byte; and logs the register table. With no
// Options.Cache it uses a fresh one and checks it holds exactly a cubin and a PTX per
// source. Where ptxas is not found it skips at the end, after compiling, since there is
// no register report.
func TestNVRTC(t testing.TB, fsys fs.FS, names []string, o Options) []Result {
	t.Helper()
	if len(names) == 0 {
		t.Fatal("kernelcheck: no kernel sources to check")
	}
	ver, err := cudart.NVRTCVersion()
	if errors.Is(err, cudart.ErrNoNVRTC) {
		t.Skipf("NVRTC not found (run .ci/setup.d/10-cuda-wheels.sh in Resin, or set RESIN_NVRTC_LIB): %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	fresh := o.Cache == nil
	if fresh {
		if o.Cache, err = cudart.OpenKernelCache(t.TempDir()); err != nil {
			t.Fatal(err)
		}
	}
	results, err := NVRTC(fsys, names, o)
	if err != nil {
		t.Fatal(err)
	}
	failed := false
	for _, r := range results {
		if r.Err != nil {
			failed = true
			t.Error(r.Err)
		}
	}
	if failed {
		t.FailNow()
	}
	again, err := nvrtcCheck(fsys, names, o, false)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range again {
		switch {
		case r.Err != nil:
			t.Errorf("second request: %v", r.Err)
		case !r.Cached:
			t.Errorf("%s: the second request compiled again instead of reading the kernel cache", r.Source)
		case !bytes.Equal(r.Cubin, results[i].Cubin) || !bytes.Equal(r.PTX, results[i].PTX):
			t.Errorf("%s: the kernel cache returned different bytes", r.Source)
		}
	}
	if fresh {
		entries, err := o.Cache.List()
		if err != nil {
			t.Fatal(err)
		}
		if len(entries) != 2*len(names) {
			t.Errorf("kernel cache holds %d entries, want %d (a cubin and a PTX per source)", len(entries), 2*len(names))
		}
	}
	if _, err := FindPtxas(o.Ptxas); err != nil {
		t.Skipf("compiled %d sources with NVRTC %s, but %v: no register report", len(names), ver, err)
	}
	t.Logf("NVRTC %s from %s, ptxas -v -arch=%s:\n%s", ver, cudart.NVRTCPath(), o.arch(), Table(results, nil))
	return results
}

// TestClang checks sources with clang for go test (the second opinion on NVRTC): it skips
// where clang-16 is not installed, fails on every Result.Err, and logs the register table
// when ptxas is found.
func TestClang(t testing.TB, fsys fs.FS, names []string, o Options) []Result {
	t.Helper()
	if len(names) == 0 {
		t.Fatal("kernelcheck: no kernel sources to check")
	}
	results, err := Clang(fsys, names, o)
	if errors.Is(err, ErrNoClang) {
		t.Skipf("%v; NVRTC remains the checked compiler", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range results {
		if r.Err != nil {
			t.Error(r.Err)
		}
	}
	if _, err := FindPtxas(o.Ptxas); err != nil {
		t.Logf("compiled %d sources with %s; %v: no register report", len(names), results[0].Compiler, err)
		return results
	}
	t.Logf("%s -> %s PTX, ptxas -v -arch=%s:\n%s", results[0].Compiler, ClangArch, ClangArch, Table(results, nil))
	return results
}

// Table formats the register report, a line per kernel:
//
//	rmsnorm.cu           resin_rmsnorm            regs  18  spill st/ld 0/0  smem   128  stack 0
//
// label names each source (nil: its name). A source without a report gets one line
// saying why.
func Table(results []Result, label func(Result) string) string {
	if label == nil {
		label = func(r Result) string { return r.Source }
	}
	width := 20
	for _, r := range results {
		width = max(width, len(label(r))+1)
	}
	var b strings.Builder
	for _, r := range results {
		l := label(r)
		switch {
		case r.PTX == nil:
			fmt.Fprintf(&b, "  %-*s FAILED to compile\n", width, l)
		case r.Kernels == nil && r.Err != nil:
			fmt.Fprintf(&b, "  %-*s FAILED (see the errors)\n", width, l)
		case r.Kernels == nil:
			fmt.Fprintf(&b, "  %-*s PTX %6d bytes (no ptxas: no register report)\n", width, l, len(r.PTX))
		}
		for _, k := range r.Kernels {
			fmt.Fprintf(&b, "  %-*s %-24s regs %3d  spill st/ld %d/%d  smem %5d  stack %d\n",
				width, l, k.Name, k.Regs, k.SpillStores, k.SpillLoads, k.Smem, k.Stack)
		}
	}
	return strings.TrimSuffix(b.String(), "\n")
}
