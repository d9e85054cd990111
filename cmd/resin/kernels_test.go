package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/cudart"
)

func runKernels(t *testing.T, args ...string) string {
	t.Helper()
	cmd := newKernelsCmd()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	if err := cmd.Execute(); err != nil {
		t.Fatalf("resin kernels %v: %v\n%s", args, err, out.String())
	}
	return out.String()
}

func TestKernelsCommands(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("RESIN_KERNEL_CACHE", dir)
	if got := strings.TrimSpace(runKernels(t, "path")); got != dir {
		t.Fatalf("path = %q, want %q", got, dir)
	}
	if got := runKernels(t, "ls"); !strings.Contains(got, "no kernels cached") {
		t.Fatalf("ls of an empty cache:\n%s", got)
	}
	c, err := cudart.OpenKernelCache(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"a.cu", "b.cu"} {
		key := cudart.KernelKey{Name: name, Source: name, Arch: "sm_90a", Compiler: "nvrtc 12.9"}
		if _, err := c.GetOrCompile(key, func() ([]byte, error) { return []byte("image"), nil }); err != nil {
			t.Fatal(err)
		}
	}
	ls := runKernels(t, "ls")
	for _, want := range []string{"a.cu", "b.cu", "sm_90a", "nvrtc 12.9", "2 kernels"} {
		if !strings.Contains(ls, want) {
			t.Errorf("ls lacks %q:\n%s", want, ls)
		}
	}
	if got := runKernels(t, "clear"); !strings.Contains(got, "removed 2 kernels") {
		t.Fatalf("clear: %s", got)
	}
	if got := runKernels(t, "--dir", t.TempDir(), "ls"); !strings.Contains(got, "no kernels cached") {
		t.Fatalf("--dir ignored:\n%s", got)
	}
}
