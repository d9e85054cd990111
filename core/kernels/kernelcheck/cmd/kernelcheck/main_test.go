package main

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/cudart"
)

func TestUsage(t *testing.T) {
	for _, args := range [][]string{nil, {"-compiler", "nvcc", "a.cu"}, {"-nope"}} {
		var out, errb bytes.Buffer
		if code := run(args, &out, &errb); code != 2 || !strings.Contains(errb.String(), "usage:") {
			t.Errorf("run(%q) = %d, stderr %q; want 2 and the usage", args, code, errb.String())
		}
	}
}

// TestRun checks a good kernel and a broken one with NVRTC; it skips where NVRTC is not
// installed (the exit status is then 3, which the script's auto mode relies on).
func TestRun(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.cu")
	bad := filepath.Join(dir, "bad.cu")
	os.WriteFile(good, []byte("#include \"prelude.cuh\"\nRESIN_KERNEL void k_good(float* x) { x[resin_global_tid()] = 1.f; }\n"), 0o644)
	os.WriteFile(bad, []byte("#include \"prelude.cuh\"\nRESIN_KERNEL void k_bad(float* x) { x[0] = y; }\n"), 0o644)
	var out, errb bytes.Buffer
	code := run([]string{"g=" + good, "b=" + bad}, &out, &errb)
	if _, err := cudart.NVRTCVersion(); errors.Is(err, cudart.ErrNoNVRTC) {
		if code != exitNoCompiler {
			t.Errorf("without NVRTC: status %d, want %d", code, exitNoCompiler)
		}
		t.Skipf("NVRTC not found: %v", err)
	}
	if code != 1 || !strings.Contains(errb.String(), `identifier "y" is undefined`) || !strings.Contains(out.String(), "b                    FAILED") {
		t.Errorf("status %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errb.String())
	}
	if !strings.Contains(out.String(), "  g ") || strings.Contains(errb.String(), "good.cu") {
		t.Errorf("the good kernel is missing from the table or reported as failing:\n%s\n%s", out.String(), errb.String())
	}
	out.Reset()
	errb.Reset()
	if code := run([]string{good}, &out, &errb); code != 0 {
		t.Errorf("good kernel alone: status %d\n%s", code, errb.String())
	}
	// By default every architecture of kernelcheck.Arches is assembled.
	for _, a := range []string{"sm_90a", "sm_100a"} {
		if !strings.Contains(out.String(), "ptxas -v -arch="+a+"\n") || strings.Count(out.String(), "k_good") != 2 {
			t.Errorf("the default run does not check %s once each:\n%s", a, out.String())
		}
	}
	out.Reset()
	if code := run([]string{"-arch", "sm_100a", good}, &out, &errb); code != 0 || strings.Contains(out.String(), "sm_90a") {
		t.Errorf("-arch sm_100a: status %d\n%s", code, out.String())
	}
}
