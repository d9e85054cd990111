package kernelcheck

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/resin-llm/resin/core/cudart"
)

const report = `ptxas info    : 0 bytes gmem
ptxas info    : Function properties for helper
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function 'resin_softmax' for 'sm_90a'
ptxas info    : Function properties for resin_softmax
    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 18 registers, 128 bytes smem, 380 bytes cmem[0]
ptxas info    : Compiling entry function 'resin_argmax' for 'sm_90a'
ptxas info    : Function properties for resin_argmax
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 12 registers, 380 bytes cmem[0]
`

func TestParsePtxas(t *testing.T) {
	got := ParsePtxas(report)
	want := []Kernel{
		{Name: "resin_softmax", Regs: 18, SpillStores: 4, SpillLoads: 4, Smem: 128, Stack: 8},
		{Name: "resin_argmax", Regs: 12},
	}
	if len(got) != len(want) {
		t.Fatalf("parsed %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("kernel %d: parsed %+v, want %+v", i, got[i], want[i])
		}
	}
	if !got[0].Spills() || got[1].Spills() {
		t.Error("Spills disagrees with the spill bytes")
	}
	if ks := ParsePtxas("ptxas fatal   : Unresolved extern function 'f'\n"); len(ks) != 0 {
		t.Errorf("a report without entry functions parsed as %+v", ks)
	}
}

var tree = fstest.MapFS{
	"k/a.cu":      {Data: []byte("// a\n#include \"prelude.cuh\"\n  #include \"local.cuh\"\n#include \"prelude.cuh\"\nRESIN_KERNEL void a() {}\n")},
	"k/local.cuh": {Data: []byte("#include \"prelude.cuh\"\n#define LOCAL 1\n")},
	"k/bad.cu":    {Data: []byte("#include \"absent.cuh\"\n")},
	"k/loop.cu":   {Data: []byte("#include \"loop.cu\"\n")},
}

func TestLoadInlinesEachHeaderOnce(t *testing.T) {
	inc := map[string]string{"prelude.cuh": "#define RESIN_KERNEL extern \"C\" __global__\n"}
	got, err := Load(tree, "k/a.cu", inc)
	if err != nil {
		t.Fatal(err)
	}
	// Each header between #line directives: its own lines, then the includer's again.
	want := "// a\n" +
		"#line 1 \"prelude.cuh\"\n#define RESIN_KERNEL extern \"C\" __global__\n#line 3 \"k/a.cu\"\n" +
		"#line 1 \"local.cuh\"\n\n#define LOCAL 1\n#line 4 \"k/a.cu\"\n" +
		"\n" + // the second include of prelude.cuh: an empty line
		"RESIN_KERNEL void a() {}\n"
	if got != want {
		t.Errorf("Load gave\n%q\nwant\n%q", got, want)
	}
	// The same replacement the runtimes make (cuda.InlinePrelude of the include line).
	plain := strings.Replace("#include \"prelude.cuh\"\nx\n", `#include "prelude.cuh"`, cudart.InlineHeader(inc["prelude.cuh"], "prelude.cuh", "p.cu", 1), 1)
	mfs := fstest.MapFS{"p.cu": {Data: []byte("#include \"prelude.cuh\"\nx\n")}}
	if got, _ := Load(mfs, "p.cu", inc); got != plain {
		t.Errorf("Load gave %q, the runtimes' Source %q", got, plain)
	}
	hdrs, err := headers(tree, "k/a.cu", inc)
	if err != nil || len(hdrs) != 2 || hdrs["local.cuh"] == "" || hdrs["prelude.cuh"] == "" {
		t.Errorf("headers = %v, %v; want prelude.cuh and local.cuh", hdrs, err)
	}
	// Self-inclusion is cut by the each-header-once rule.
	if _, err := Load(tree, "k/loop.cu", nil); err != nil {
		t.Errorf("a self-including source: %v", err)
	}
}

func TestLoadErrors(t *testing.T) {
	if _, err := Load(tree, "k/bad.cu", nil); err == nil || !strings.Contains(err.Error(), `"absent.cuh"`) || !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing header: %v", err)
	}
	if _, err := Load(tree, "k/none.cu", nil); err == nil || !strings.Contains(err.Error(), "none.cu") {
		t.Errorf("missing source: %v", err)
	}
	if _, err := headers(tree, "k/bad.cu", nil); err == nil {
		t.Error("headers accepted a missing header")
	}
}

func TestArchitectures(t *testing.T) {
	if v, err := virtualArch("sm_90a"); err != nil || v != "compute_90a" {
		t.Errorf("virtualArch(sm_90a) = %q, %v", v, err)
	}
	for _, bad := range []string{"compute_90a", "90", "sm_"} {
		if _, err := virtualArch(bad); err == nil {
			t.Errorf("architecture %q accepted", bad)
		}
		// NVRTC rejects a bad architecture before loading anything.
		if _, err := NVRTC(tree, []string{"k/a.cu"}, Options{Arch: bad}); err == nil || !strings.Contains(err.Error(), bad) {
			t.Errorf("NVRTC with arch %q: %v", bad, err)
		}
	}
}

func TestChecks(t *testing.T) {
	ptx := []byte(".visible .entry resin_a(\n.visible .entry resin_b(\n")
	if err := checkEntries("x.cu", ptx, []string{"resin_a", "resin_b"}); err != nil {
		t.Error(err)
	}
	if err := checkEntries("x.cu", ptx, []string{"resin_c"}); !errors.Is(err, ErrEntry) || !strings.Contains(err.Error(), "resin_c") {
		t.Errorf("missing entry: %v", err)
	}
	if err := checkEntries("x.cu", []byte(".func f("), nil); !errors.Is(err, ErrEntry) {
		t.Errorf("PTX without a kernel: %v", err)
	}
	ks := ParsePtxas(report)
	if err := checkReport("x.cu", ks, nil, []string{"resin_argmax"}); !errors.Is(err, ErrSpill) || !strings.Contains(err.Error(), "resin_softmax") {
		t.Errorf("spilling kernel: %v", err)
	}
	if err := checkReport("x.cu", ks[1:], nil, []string{"resin_argmax", "resin_topk"}); !errors.Is(err, ErrEntry) || errors.Is(err, ErrSpill) {
		t.Errorf("kernel missing from the report: %v", err)
	}
	if err := checkReport("x.cu", ks[1:], nil, nil); err != nil {
		t.Errorf("clean report: %v", err)
	}
}

func TestTable(t *testing.T) {
	rs := []Result{
		{Source: "softmax.cu", PTX: []byte("x"), Kernels: ParsePtxas(report)},
		{Source: "plain.cu", PTX: []byte("12345")},
		{Source: "broken.cu"},
		{Source: "spilled.cu", PTX: []byte("x"), Err: ErrSpill},
	}
	got := Table(rs, func(r Result) string { return "m/" + r.Source })
	for _, want := range []string{
		"  m/softmax.cu         resin_softmax            regs  18  spill st/ld 4/4  smem   128  stack 8\n",
		"  m/softmax.cu         resin_argmax             regs  12  spill st/ld 0/0  smem     0  stack 0\n",
		"  m/plain.cu           PTX      5 bytes (no ptxas: no register report)\n",
		"  m/broken.cu          FAILED to compile\n",
		"  m/spilled.cu         FAILED (see the errors)",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("table lacks %q:\n%s", want, got)
		}
	}
}

// fakeTool writes an executable shell script standing in for ptxas or clang.
func fakeTool(t *testing.T, script string) string {
	t.Helper()
	if runtime.GOOS == "windows" {
		t.Skip("needs a POSIX shell")
	}
	p := filepath.Join(t.TempDir(), "tool")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+script), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestAssemble(t *testing.T) {
	ok := fakeTool(t, "cat <<'EOF' >&2\n"+report+"EOF\n")
	ks, err := Assemble(ok, []byte("ptx"), "sm_90a")
	if err != nil || len(ks) != 2 || ks[0].Regs != 18 {
		t.Fatalf("Assemble = %+v, %v", ks, err)
	}
	bad := fakeTool(t, "echo \"ptxas fatal   : Unresolved extern function 'f'\" >&2; exit 255\n")
	if _, err := Assemble(bad, []byte("ptx"), "sm_90a"); err == nil || !strings.Contains(err.Error(), "Unresolved extern") {
		t.Errorf("failing ptxas: %v", err)
	}
	silent := fakeTool(t, "exit 0\n")
	if _, err := Assemble(silent, []byte("ptx"), "sm_90a"); err == nil {
		t.Error("a ptxas that reported nothing was accepted")
	}
}

func TestMissingTools(t *testing.T) {
	if _, err := FindPtxas(filepath.Join(t.TempDir(), "no-ptxas")); !errors.Is(err, ErrNoPtxas) {
		t.Errorf("FindPtxas of a missing file: %v", err)
	}
	if _, err := FindClang(filepath.Join(t.TempDir(), "no-clang")); !errors.Is(err, ErrNoClang) {
		t.Errorf("FindClang of a missing file: %v", err)
	}
	if _, err := Clang(tree, []string{"k/a.cu"}, Options{Clang: filepath.Join(t.TempDir(), "no-clang")}); !errors.Is(err, ErrNoClang) {
		t.Errorf("Clang without clang: %v", err)
	}
}

// TestClangResults runs Clang against a stand-in clang that writes fixed PTX, so the
// checks after compiling run without clang-16: an entry missing, an external call, a
// compile failure.
func TestClangResults(t *testing.T) {
	cc := fakeTool(t, `out=""; prev=""
for a in "$@"; do [ "$prev" = "-o" ] && out=$a; prev=$a; done
case "$out" in
*good.ptx) printf '.visible .entry k_good(\n' >"$out" ;;
*extern.ptx) printf '.extern .func f;\n.visible .entry k_ext(\ncall.uni f;\n' >"$out" ;;
*) echo "error: broken.cu:1: expected ';'" >&2; exit 1 ;;
esac
`)
	fsys := fstest.MapFS{
		"good.cu":   {Data: []byte("#include \"prelude.cuh\"\n")},
		"extern.cu": {Data: []byte("x\n")},
		"broken.cu": {Data: []byte("x\n")},
	}
	o := Options{Clang: cc, Ptxas: filepath.Join(t.TempDir(), "none"), Includes: map[string]string{"prelude.cuh": "//\n"},
		Entries: map[string][]string{"good.cu": {"k_good", "k_other"}}}
	t.Setenv("PATH", "")
	rs, err := Clang(fsys, []string{"good.cu", "extern.cu", "broken.cu"}, o)
	if err != nil {
		t.Fatal(err)
	}
	if !errors.Is(rs[0].Err, ErrEntry) || !strings.Contains(rs[0].Err.Error(), "k_other") {
		t.Errorf("good.cu: %v (want k_other missing)", rs[0].Err)
	}
	if rs[1].Err == nil || !strings.Contains(rs[1].Err.Error(), "external function") {
		t.Errorf("extern.cu: %v", rs[1].Err)
	}
	if rs[2].Err == nil || !strings.Contains(rs[2].Err.Error(), "expected ';'") || rs[2].PTX != nil {
		t.Errorf("broken.cu: %v", rs[2].Err)
	}
}

func TestWarnings(t *testing.T) {
	log := `softmax.cu(63): warning #177-D: function "resin_global_tid" was declared but never referenced
  RESIN_DEVICE long long resin_global_tid() {
                         ^

Remark: The warnings can be suppressed with "-diag-suppress <warning-number>"

softmax.cu(113): warning #177-D: function "resin_warp_argmax" was declared but never referenced
  RESIN_DEVICE void resin_warp_argmax(float* v, int* i) {
                    ^
`
	if w := warnings(log); w != "" {
		t.Errorf("unused prelude helpers counted as warnings: %q", w)
	}
	other := log + `softmax.cu(20): warning #177-D: variable "x" was declared but never referenced
    int x = 0;
        ^
`
	if w := warnings(other); !strings.HasPrefix(w, `softmax.cu(20): warning #177-D: variable "x"`) || strings.Contains(w, "function") || !strings.Contains(w, "int x = 0;") {
		t.Errorf("warnings kept %q", w)
	}
}
