package cli

import (
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"os"
	"path/filepath"
	"runtime/pprof"
	"testing"

	"github.com/spf13/cobra"
)

// TestCPUProfileEndsOnEveryPath runs commands that fail in their RunE, in the root's own
// PersistentPreRunE, and that override the root's PersistentPostRunE, each with
// --cpuprofile: each must leave a complete profile (non-empty, a whole gzip stream) and
// CPU profiling stopped, so that the next profile can start.
func TestCPUProfileEndsOnEveryPath(t *testing.T) {
	errWork, errPre := errors.New("work failed"), errors.New("pre failed")
	newRoot := func(failPre bool) *cobra.Command {
		root := &cobra.Command{Use: "x", SilenceUsage: true, SilenceErrors: true,
			PersistentPreRunE: func(*cobra.Command, []string) error {
				if failPre {
					return errPre
				}
				return nil
			}}
		AddProfiling(root)
		root.AddCommand(
			&cobra.Command{Use: "fail", RunE: func(*cobra.Command, []string) error { return errWork }},
			&cobra.Command{Use: "ok", RunE: func(*cobra.Command, []string) error { return nil }},
			// Cobra runs only the nearest PersistentPostRunE: this one hides the root's.
			&cobra.Command{Use: "own-post", RunE: func(*cobra.Command, []string) error { return nil },
				PersistentPostRunE: func(*cobra.Command, []string) error { return nil }},
		)
		return root
	}
	for _, c := range []struct {
		name, cmd string
		failPre   bool
		want      error
	}{
		{"RunE fails", "fail", false, errWork},
		{"root pre-run fails", "ok", true, errPre},
		{"own post-run", "own-post", false, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Cleanup(pprof.StopCPUProfile) // a profile left running fails only this case
			path := filepath.Join(t.TempDir(), "cpu.prof")
			heap := filepath.Join(t.TempDir(), "heap.prof")
			if _, _, err := run(t, newRoot(c.failPre), c.cmd, "--cpuprofile", path, "--memprofile", heap); !errors.Is(err, c.want) {
				t.Fatalf("%s: %v, want %v", c.cmd, err, c.want)
			}
			checkProfile(t, path)
			checkProfile(t, heap)
			// StartCPUProfile fails while a profile is running.
			if err := pprof.StartCPUProfile(io.Discard); err != nil {
				t.Fatalf("CPU profiling still running after the command: %v", err)
			}
			pprof.StopCPUProfile()
		})
	}
}

// checkProfile fails unless path holds a non-empty, complete gzip stream (a pprof profile
// is gzipped protobuf, written in full only when the profile stops).
func checkProfile(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil || len(b) == 0 {
		t.Fatalf("%s: %d bytes, %v (empty or missing profile)", filepath.Base(path), len(b), err)
	}
	z, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("%s: not gzip: %v", filepath.Base(path), err)
	}
	raw, err := io.ReadAll(z)
	if err != nil || len(raw) == 0 {
		t.Fatalf("%s: incomplete gzip stream (%d bytes decoded): %v", filepath.Base(path), len(raw), err)
	}
}
