package cudart

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestStaleLibEnvFallsBack points the library's variable at a missing file, at a file that
// is not a library and at a library that is not the one wanted, and checks each time that
// the search order still finds the real one and a warning says why.
func TestStaleLibEnvFallsBack(t *testing.T) {
	t.Setenv("RESIN_CUDA", "") // the search order, which the emulated device bypasses
	dir := t.TempDir()
	// libc stands in for the library in the search order; it exports abs.
	if err := os.Symlink(libcPath(t), filepath.Join(dir, "libstandin.so.1")); err != nil {
		t.Fatal(err)
	}
	notLib := filepath.Join(dir, "junk.so")
	os.WriteFile(notLib, []byte("not ELF"), 0o644)
	t.Setenv("RESIN_CUDA_LIB_DIR", dir)
	for _, c := range []struct {
		env, probe, why string
	}{
		{filepath.Join(dir, "gone/libnvrtc.so.12"), "abs", "does not exist"},
		{notLib, "abs", "is not loadable"},
		{libcPath(t), "nvrtcVersion", "lacks nvrtcVersion"},
	} {
		t.Setenv("RESIN_TEST_LIB", c.env)
		var warned []string
		l := &library{name: "nvrtc", sentinel: ErrNoNVRTC, fileEnv: "RESIN_TEST_LIB", probe: c.probe,
			names: []string{"libstandin.so.1"}, warn: func(s string) { warned = append(warned, s) }}
		if err := l.load(); err != nil {
			t.Fatalf("%s: %v", c.env, err)
		}
		if l.Path() != filepath.Join(dir, "libstandin.so.1") {
			t.Errorf("%s: loaded %s, want the search order's file", c.env, l.Path())
		}
		if len(warned) != 1 || !strings.Contains(warned[0], c.why) || !strings.Contains(warned[0], "RESIN_TEST_LIB="+c.env) ||
			!strings.Contains(warned[0], "falling back") || l.Warning() != warned[0] {
			t.Errorf("%s: warnings %q (Warning %q), want one saying %q", c.env, warned, l.Warning(), c.why)
		}
	}
	// A good setting is used as it is, silently.
	t.Setenv("RESIN_TEST_LIB", libcPath(t))
	l := &library{name: "nvrtc", sentinel: ErrNoNVRTC, fileEnv: "RESIN_TEST_LIB", probe: "abs", names: []string{"nothing.so"},
		warn: func(s string) { t.Errorf("warned %q", s) }}
	if err := l.load(); err != nil || l.Path() != libcPath(t) || l.Warning() != "" {
		t.Fatalf("good setting: %v, path %s, warning %q", err, l.Path(), l.Warning())
	}
	// A stale setting and nothing in the search order: the error gives both reasons.
	t.Setenv("RESIN_TEST_LIB", notLib)
	l = &library{name: "nvrtc", sentinel: ErrNoNVRTC, fileEnv: "RESIN_TEST_LIB", names: []string{"nothing.so"}, warn: func(string) {}}
	err := l.load()
	if !errors.Is(err, ErrNoNVRTC) || !strings.Contains(err.Error(), "is not loadable") {
		t.Fatalf("nothing found: %v", err)
	}
}

func TestNVRTCDriverVersionCheck(t *testing.T) {
	for _, c := range []struct {
		major, minor, driver int
		ok                   bool
	}{
		{12, 9, 12040, true},  // a newer minor: cubins load under minor version compatibility
		{12, 4, 12040, true},  // same version
		{11, 8, 12020, true},  // an older NVRTC
		{12, 9, 13000, true},  // an older major than the driver's
		{13, 0, 12090, false}, // CUDA 13 NVRTC on a CUDA 12.9 driver
		{12, 0, 11080, false},
	} {
		err := checkNVRTCDriver(c.major, c.minor, c.driver, "/x/libnvrtc.so")
		if c.ok {
			if err != nil {
				t.Errorf("NVRTC %d.%d, driver %d: %v", c.major, c.minor, c.driver, err)
			}
			continue
		}
		if !errors.Is(err, ErrNVRTCTooNew) {
			t.Fatalf("NVRTC %d.%d, driver %d: err %v, want ErrNVRTCTooNew", c.major, c.minor, c.driver, err)
		}
		// The message names both versions, the library and the fix.
		dmaj := c.driver / 1000
		for _, want := range []string{
			"NVRTC " + strconv.Itoa(c.major) + "." + strconv.Itoa(c.minor), "/x/libnvrtc.so",
			"CUDA " + strconv.Itoa(dmaj) + "." + strconv.Itoa(c.driver%1000/10), "RESIN_NVRTC_LIB", "nvidia-cuda-nvrtc-cu" + strconv.Itoa(dmaj),
		} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q lacks %q", err, want)
			}
		}
	}
}
