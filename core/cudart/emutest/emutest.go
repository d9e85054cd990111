// Package emutest runs tests on the emulated CUDA device (core/cudart's RESIN_CUDA=emulate)
// from an ordinary `go test`: a test calls Reexec, which runs that same test again in a
// child process of the test binary with RESIN_CUDA=emulate set, so the libraries load
// emulated from the start of the process, whatever the other tests of the package loaded.
package emutest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/cudart/emu"
)

// Reexec reports whether the caller is the parent, which ran the test in a child on the
// emulated device and must return at once: the child's failure fails the test, its skip
// skips it, and its log is the test's log. In the child (RESIN_CUDA=emulate) it returns
// false and the test runs its body. env ("NAME=value") is added to the child's
// environment. Without a host C++ compiler the test is skipped.
func Reexec(t *testing.T, env ...string) bool {
	t.Helper()
	if os.Getenv("RESIN_CUDA") == "emulate" {
		return false
	}
	if err := emu.Available(); err != nil {
		t.Skipf("the emulated device needs a host C++ compiler: %v", err)
	}
	args := []string{"-test.run=^" + regexp.QuoteMeta(t.Name()) + "$", "-test.count=1", "-test.v"}
	if testing.Short() {
		args = append(args, "-test.short")
	}
	out, err := runChild(t, args, append(env, "RESIN_CUDA=emulate"))
	for _, line := range strings.Split(strings.TrimRight(string(out), "\n"), "\n") {
		if strings.HasPrefix(line, "    ") {
			t.Log(strings.TrimSpace(line))
		}
	}
	ended := func(verdict string) bool {
		return regexp.MustCompile(`(?m)^--- ` + verdict + `: ` + regexp.QuoteMeta(t.Name()) + ` \(`).Match(out)
	}
	switch {
	case err != nil:
		t.Fatalf("on the emulated device (RESIN_CUDA=emulate): %v\n%s", err, out)
	case ended("SKIP"):
		t.Skip("skipped on the emulated device")
	case !ended("PASS"):
		t.Fatalf("on the emulated device the test did not run:\n%s", out)
	}
	return true
}

// RunTests runs the tests of this test binary that pattern (a -test.run expression)
// matches in a child on the emulated device, and fails unless at least one ran and none
// failed. Their log lines become the caller's.
func RunTests(t *testing.T, pattern string) {
	t.Helper()
	if err := emu.Available(); err != nil {
		t.Skipf("the emulated device needs a host C++ compiler: %v", err)
	}
	out, err := runChild(t, []string{"-test.run=" + pattern, "-test.count=1", "-test.v"}, []string{"RESIN_CUDA=emulate"})
	passed := 0
	for _, line := range strings.Split(strings.TrimRight(string(out), "\n"), "\n") {
		switch {
		case strings.HasPrefix(line, "--- PASS"), strings.HasPrefix(line, "--- SKIP"):
			passed += map[bool]int{true: 1}[strings.HasPrefix(line, "--- PASS")]
			t.Log(line)
		case strings.HasPrefix(line, "    "):
			t.Log(strings.TrimSpace(line))
		}
	}
	if err != nil {
		t.Fatalf("on the emulated device (RESIN_CUDA=emulate): %v\n%s", err, out)
	}
	if passed == 0 {
		t.Fatalf("no test matching %s passed on the emulated device:\n%s", pattern, out)
	}
}

// runChild runs this test binary with args and env added to the environment and returns
// its output. Under a test deadline (go test -timeout) the child gets -test.timeout of what
// is left less a margin, so it panics with its goroutines' stacks before the parent's own
// timeout; should it not end by then, it is killed and the parent still reports it.
func runChild(t *testing.T, args, env []string) ([]byte, error) {
	ctx := context.Background()
	if deadline, ok := t.Deadline(); ok {
		left := time.Until(deadline)
		margin := min(left/10, 30*time.Second)
		args = append(args, fmt.Sprintf("-test.timeout=%v", max(left-margin, time.Second)))
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline.Add(-margin/2))
		defer cancel()
	}
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.WaitDelay = 5 * time.Second // a grandchild holding the output does not keep us waiting
	out, err := cmd.CombinedOutput()
	if err != nil && ctx.Err() != nil {
		err = fmt.Errorf("killed at the test's deadline (%w): %v", ctx.Err(), err)
	}
	return out, err
}
