package main

import (
	"bytes"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/resin-llm/resin/templates"
)

// runCLI runs resin-new with args against the template tree tfs.
func runCLI(t *testing.T, tfs fs.FS, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	root := newRootCmd(&out, tfs)
	root.SetArgs(args)
	root.SetErr(&out)
	err := root.Execute()
	return out.String(), err
}

// templateCopy returns the embedded templates as a MapFS that a test may edit.
func templateCopy(t *testing.T) fstest.MapFS {
	t.Helper()
	m := fstest.MapFS{}
	err := fs.WalkDir(templates.FS, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(templates.FS, p)
		m[p] = &fstest.MapFile{Data: b}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// readTree returns every file under dir (relative slash paths → contents).
func readTree(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		r, _ := filepath.Rel(dir, p)
		out[filepath.ToSlash(r)] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func keys(m map[string]string) []string {
	return slices.Sorted(maps.Keys(m))
}

// fakeCore returns a temporary checkout skeleton for --in-tree: the checkout's go.mod and
// models/registry.go.
func fakeCore(t *testing.T) string {
	t.Helper()
	core, fake := coreDir(t), t.TempDir()
	for _, f := range []string{"go.mod", filepath.Join("models", "registry.go")} {
		data, err := os.ReadFile(filepath.Join(core, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(filepath.Join(fake, f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(fake, f), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return fake
}

// coreDir is the checkout the tests run in.
func coreDir(t *testing.T) string {
	t.Helper()
	d, err := findCore("")
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// shareScaffoldBuilds makes the scaffolds a test builds share one compile of the core:
// each vendors the core into its own directory, and without -trimpath the build cache
// keys a package by its directory, so every scaffold would compile the whole core again
// (most of this package's time on a cold cache). extra are GOFLAGS the test needs too.
func shareScaffoldBuilds(t *testing.T, extra ...string) {
	t.Helper()
	t.Setenv("GOPROXY", "off")
	t.Setenv("GOFLAGS", scaffoldGoflags(extra...))
}

// scaffoldGoflags returns GOFLAGS with -trimpath and extra added.
func scaffoldGoflags(extra ...string) string {
	return strings.Join(append(append(strings.Fields(os.Getenv("GOFLAGS")), extra...), "-trimpath"), " ")
}

// runIn runs a command in dir and returns its combined output.
func runIn(dir string, name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off")
	out, err := cmd.CombinedOutput()
	return string(out), err
}
