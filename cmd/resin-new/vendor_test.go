package main

import (
	"os"
	"path/filepath"
	"testing"
)

// TestVendorSkipsBuildOutputs: what a build or test run leaves in the checkout's core/ (go
// test -c's binary, a CPU profile, go build's binary beside its main package) is not
// vendored into a fork, the sources beside it are (a .out that is text too):
// a fork once carried core/kernels/ref/ref.test, a binary naming this checkout.
func TestVendorSkipsBuildOutputs(t *testing.T) {
	dir := t.TempDir()
	for name, body := range map[string]string{
		"go.mod": "module example.com/x\n", "go.sum": "", "LICENSE": "x",
		"core/a/a.go": "package a\n", "core/a/a_amd64.s": "// asm\n",
		"core/a/a.test": "\x7fELF", "core/a/cpu.prof": "p", "core/a/cmd/tool/tool": "\x7fELF\x02\x01",
		"core/a/notes.out": "kept: not a binary",
	} {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	files, err := vendorCore(dir, false)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, f := range files {
		got[f.rel] = true
	}
	for _, want := range []string{"core/a/a.go", "core/a/a_amd64.s", "core/a/notes.out"} {
		if !got[want] {
			t.Errorf("%s not vendored (%v)", want, got)
		}
	}
	for _, not := range []string{"core/a/a.test", "core/a/cpu.prof", "core/a/cmd/tool/tool"} {
		if got[not] {
			t.Errorf("%s vendored: a build output", not)
		}
	}
}
