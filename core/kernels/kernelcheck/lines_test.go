package kernelcheck

import (
	"errors"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/kernels/cuda"
)

// TestNVRTCReportsSourceLines checks sources with deliberate syntax errors, one in a kernel
// (line 6, after the real prelude and a local header are inlined) and one in the local
// header (line 2): NVRTC must report each at its own file's line.
func TestNVRTCReportsSourceLines(t *testing.T) {
	fsys := fstest.MapFS{
		"k/broken.cu": {Data: []byte("// broken.cu: deliberate syntax errors\n" +
			"#include \"prelude.cuh\"\n" +
			"#include \"local.cuh\"\n" +
			"\n" +
			"RESIN_KERNEL void broken(float* x) {\n" +
			"\tx[0] = = 1.f;\n" +
			"}\n")},
		"k/local.cuh": {Data: []byte("#define LOCAL 1\nstatic int local_bad = = 1;\n")},
	}
	o := Options{Flags: cuda.Options, Includes: map[string]string{"prelude.cuh": cuda.Prelude()}, AllowWarnings: true}
	res, err := NVRTC(fsys, []string{"k/broken.cu"}, o)
	if errors.Is(err, cudart.ErrNoNVRTC) {
		t.Skipf("NVRTC not available (set RESIN_NVRTC_LIB, see .ci/setup.d/10-cuda-wheels.sh): %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	r := res[0]
	if r.Err == nil {
		t.Fatal("a source with syntax errors compiled")
	}
	msg := r.Log + "\n" + r.Err.Error()
	for _, want := range []string{"k/broken.cu(6): error", "local.cuh(2): error"} {
		if !strings.Contains(msg, want) {
			t.Errorf("NVRTC's log does not say %q:\n%s", want, msg)
		}
	}
}
