package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/blas"
	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/kernels/ref"
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
	for _, want := range []string{"BLAS (CPU GEMM)", "CUDA driver", "NVRTC", "node 0: cpus 0-3,8-11", "node 1: cpus 4-7,12-15",
		"NVIDIA PCI device 0000:86:00.0 (0x2335) on node 1", "Kernel cache", "0 kernels"} {
		if !strings.Contains(got, want) {
			t.Errorf("doctor output lacks %q:\n%s", want, got)
		}
	}
	if _, err := cudart.DeviceCount(); err != nil && !strings.Contains(got, "no GPU found") {
		t.Errorf("no driver here, but doctor does not say so:\n%s", got)
	}
	if want := "kernels   " + ref.CPUKernels(); !strings.Contains(got, want) {
		t.Errorf("doctor output lacks %q:\n%s", want, got)
	}
	if want := fmt.Sprintf("%s (%s)", poolSpinLine(ref.PoolSpinDuration()), ref.PoolSpinSource()); !strings.Contains(got, want) {
		t.Errorf("doctor output lacks the worker pool's spin %q:\n%s", want, got)
	}
	if b := blas.Info(); b.Loaded() && !strings.Contains(got, b.Vendor+"  "+b.Path) {
		t.Errorf("the process runs GEMM on %s, but doctor does not say so:\n%s", b, got)
	} else if b.Own && !strings.Contains(got, "GEMM runs on Resin's own (core/kernels/ref: "+ref.GEMMKernel()) {
		t.Errorf("no BLAS loaded (%s), the own GEMM runs, but doctor does not say so:\n%s", b.Fallback, got)
	} else if !b.Loaded() && !b.Own && !strings.Contains(got, "GEMM runs on gonum") {
		t.Errorf("no BLAS loaded (%s), but doctor does not say gonum:\n%s", b.Fallback, got)
	}
}

func getenv(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestDoctorBLASFallback(t *testing.T) {
	_, b := blas.Load(getenv(map[string]string{"RESIN_BLAS": "off"}))
	var out bytes.Buffer
	doctorBLAS(&out, b)
	if got := out.String(); !strings.Contains(got, "none: GEMM runs on gonum (pure Go, slower): RESIN_BLAS=off") {
		t.Errorf("RESIN_BLAS=off, but doctor says:\n%s", got)
	}

	if _, b = blas.Load(getenv(map[string]string{"RESIN_BLAS": "own"})); b.Own {
		out.Reset()
		doctorBLAS(&out, b)
		if got := out.String(); !strings.Contains(got, "own       GEMM runs on Resin's own (core/kernels/ref: "+ref.GEMMKernel()+" micro-kernel on the worker pool); no library: RESIN_BLAS=own") {
			t.Errorf("RESIN_BLAS=own, but doctor says:\n%s", got)
		}
	}

	bad := filepath.Join(t.TempDir(), "libnot.so")
	if err := os.WriteFile(bad, []byte("text"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, b = blas.Load(getenv(map[string]string{"RESIN_BLAS_LIB": bad}))
	out.Reset()
	doctorBLAS(&out, b)
	if got := out.String(); !strings.Contains(got, "warning: RESIN_BLAS_LIB="+bad+": not a loadable library") {
		t.Errorf("RESIN_BLAS_LIB names a text file, but doctor does not warn:\n%s", got)
	}
}

func TestDoctorBLASLibrary(t *testing.T) {
	lib, b := blas.Load(getenv(map[string]string{"RESIN_BLAS_LIB": os.Getenv("RESIN_BLAS_LIB"), "RESIN_BLAS_THREADS": "1"}))
	if lib == nil {
		t.Skipf("no BLAS library: %s", b.Fallback)
	}
	t.Setenv("RESIN_BLAS_THREADS", "1")
	var out bytes.Buffer
	doctorBLAS(&out, b)
	got := out.String()
	for _, want := range []string{lib.Vendor + "  " + lib.Path, "version   " + lib.Config} {
		if !strings.Contains(got, want) {
			t.Errorf("doctor output lacks %q:\n%s", want, got)
		}
	}
	if b.Threads > 0 && !strings.Contains(got, "threads   1 (RESIN_BLAS_THREADS=1)") {
		t.Errorf("RESIN_BLAS_THREADS=1, but doctor says:\n%s", got)
	}
}
