package cuda

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestClangCompilesEveryKernel is the second opinion: clang-16 compiles each source to PTX
// for sm_90 with no CUDA headers or libdevice, through the same prelude. It skips where
// clang-16 is not installed (scripts/check-kernels.sh clang runs the same check).
func TestClangCompilesEveryKernel(t *testing.T) {
	clang, err := exec.LookPath("clang-16")
	if err != nil {
		t.Skip("clang-16 not installed (apt-get install clang-16); NVRTC remains the checked compiler")
	}
	dir := t.TempDir()
	for _, name := range Names() {
		// Write the source beside the prelude, as the repository holds them.
		for _, f := range []string{name, "prelude.cuh"} {
			b, err := files.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			os.WriteFile(filepath.Join(dir, f), b, 0o644)
		}
		ptx := filepath.Join(dir, strings.TrimSuffix(name, ".cu")+".ptx")
		out, err := exec.Command(clang, "-x", "cuda", "--cuda-gpu-arch=sm_90", "--cuda-device-only",
			"-nocudainc", "-nocudalib", "-Xclang", "-target-feature", "-Xclang", "+ptx78",
			"-O3", "-S", "-Werror", "-o", ptx, filepath.Join(dir, name)).CombinedOutput()
		if err != nil {
			t.Fatalf("clang-16 %s: %v\n%s", name, err, out)
		}
		b, _ := os.ReadFile(ptx)
		for _, k := range wantKernels[name] {
			if !strings.Contains(string(b), ".entry "+k+"(") {
				t.Errorf("%s: clang's PTX has no entry %s", name, k)
			}
		}
		// No call may remain to a function clang could not supply without libdevice.
		if strings.Contains(string(b), "call.uni") || strings.Contains(string(b), ".extern .func") {
			t.Errorf("%s: clang's PTX calls an external function", name)
		}
	}
}
