package cuda

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/cudart"
)

// brokenKernel is a kernel with a syntax error on line brokenLine, after the prelude's
// include on line 2.
const (
	brokenKernel = "// broken.cu: a deliberate syntax error\n" +
		"#include \"prelude.cuh\"\n" +
		"\n" +
		"RESIN_KERNEL void broken(float* x) {\n" +
		"\tx[0] = = 1.f;\n" +
		"}\n"
	brokenLine = 5
)

func TestInlinePreludeKeepsLineNumbers(t *testing.T) {
	src := InlinePrelude(brokenKernel, "broken.cu")
	if strings.Contains(src, `#include "prelude.cuh"`) || !strings.Contains(src, "RESIN_PRELUDE") {
		t.Fatalf("prelude not inlined:\n%s", src)
	}
	// The preprocessor numbers the line after a #line N directive N: the kernel's own
	// lines keep their numbers however long the prelude is.
	line, file := 0, ""
	for _, l := range strings.Split(src, "\n") {
		var n int
		var f string
		if _, err := fmt.Sscanf(l, "#line %d %q", &n, &f); err == nil {
			line, file = n, f
			continue
		}
		line++
		if strings.Contains(l, "= = 1.f") {
			if file != "broken.cu" || line-1 != brokenLine {
				t.Errorf("the broken line is numbered %s:%d, want broken.cu:%d", file, line-1, brokenLine)
			}
		}
		if strings.Contains(l, "#define RESIN_PRELUDE") && file != "prelude.cuh" {
			t.Errorf("the prelude's lines are numbered as %q, want prelude.cuh", file)
		}
	}
	if src, _ := Source("rmsnorm.cu"); !strings.Contains(src, "\n#line ") {
		t.Error("Source inlines the prelude without #line directives")
	}
	if got := InlinePrelude("no include\n", "x.cu"); got != "no include\n" {
		t.Errorf("a source without the include changed to %q", got)
	}
}

// TestNVRTCReportsKernelLines compiles a kernel with a syntax error on line brokenLine and
// checks that NVRTC's diagnostic names that line of that file, not one shifted by the
// inlined prelude.
func TestNVRTCReportsKernelLines(t *testing.T) {
	_, err := cudart.Compile(InlinePrelude(brokenKernel, "broken.cu"), "broken.cu", "sm_90a", Options...)
	if errors.Is(err, cudart.ErrNoNVRTC) {
		t.Skipf("NVRTC not available (set RESIN_NVRTC_LIB, see .ci/setup.d/10-cuda-wheels.sh): %v", err)
	}
	if !errors.Is(err, cudart.ErrCompile) {
		t.Fatalf("compiling a broken kernel: %v, want an error matching ErrCompile", err)
	}
	want := fmt.Sprintf("broken.cu(%d): error", brokenLine)
	if !strings.Contains(err.Error(), want) {
		t.Errorf("NVRTC's log does not say %q:\n%v", want, err)
	}
	// The prelude's own diagnostics (unused helpers) name prelude.cuh, not broken.cu.
	for _, m := range regexp.MustCompile(`broken\.cu\((\d+)\)`).FindAllStringSubmatch(err.Error(), -1) {
		if m[1] != strconv.Itoa(brokenLine) {
			t.Errorf("NVRTC reports broken.cu line %s, which holds no error:\n%v", m[1], err)
		}
	}
}
