package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/resin-llm/resin/templates"
)

// faultyFS fails (or, with kill, panics, as a killed process stops) at its n-th operation.
type faultyFS struct {
	osFS
	n, at int
	kill  bool
}

var errInjected = errors.New("injected write failure")

func (f *faultyFS) step(op string) error {
	f.n++
	if f.n == f.at {
		if f.kill {
			panic("killed during " + op)
		}
		return errInjected
	}
	return nil
}

func (f *faultyFS) MkdirAll(p string, perm os.FileMode) error {
	if err := f.step("mkdir"); err != nil {
		return err
	}
	return f.osFS.MkdirAll(p, perm)
}

func (f *faultyFS) WriteFile(p string, b []byte, perm os.FileMode) error {
	if err := f.step("write"); err != nil {
		return err
	}
	return f.osFS.WriteFile(p, b, perm)
}

func (f *faultyFS) Rename(a, b string) error {
	if err := f.step("rename"); err != nil {
		return err
	}
	return f.osFS.Rename(a, b)
}

// withFS runs fn with files replaced by fs, recovering a simulated kill.
func withFS(fs fileSystem, fn func() error) (err error, killed bool) {
	saved := files
	files = fs
	defer func() {
		files = saved
		if r := recover(); r != nil {
			killed = true
		}
	}()
	return fn(), false
}

// countOps counts the file operations one run makes.
func countOps(t *testing.T, fn func() error) int {
	t.Helper()
	f := &faultyFS{at: -1}
	if err, _ := withFS(f, fn); err != nil {
		t.Fatal(err)
	}
	return f.n
}

// TestInterruptedWritesLeaveThePreviousTree fails, and kills, every file operation of a
// scaffold in turn, over an empty target and with --force over an edited scaffold: after a
// failure the tree is as before; after a kill, the next run's recovery restores it.
func TestInterruptedWritesLeaveThePreviousTree(t *testing.T) {
	for _, force := range []bool{false, true} {
		t.Run(fmt.Sprintf("force=%v", force), func(t *testing.T) {
			parent := t.TempDir()
			dir := filepath.Join(parent, "demo")
			args := []string{"model", "demo", "--out", dir, "--no-tidy", "--link-core"}
			if force {
				if out, err := runCLI(t, templates.FS, args...); err != nil {
					t.Fatalf("%v\n%s", err, out)
				}
				os.WriteFile(filepath.Join(dir, "forward.go"), []byte("package demo\n// mine\n"), 0o644)
				os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("mine"), 0o644)
				args = append(args, "--set", "hidden_size=256", "--force")
			}
			before := readTreeIfAny(t, dir)
			run := func() error { _, err := runCLI(t, templates.FS, args...); return err }
			n := countOps(t, run)
			// Put the tree back after the counting run (it succeeded).
			os.RemoveAll(dir)
			restoreTree(t, dir, before)
			if n < 10 {
				t.Fatalf("only %d file operations counted", n)
			}
			for at := 1; at <= n; at += max(1, n/25) {
				for _, kill := range []bool{false, true} {
					err, killed := withFS(&faultyFS{at: at, kill: kill}, run)
					if !kill && !errors.Is(err, errInjected) && !strings.Contains(fmt.Sprint(err), errInjected.Error()) {
						t.Fatalf("op %d: err = %v, want the injected failure", at, err)
					}
					if kill && !killed {
						t.Fatalf("op %d: not killed", at)
					}
					if kill { // the next run recovers first
						if err := recoverTxns(parent, "demo", func(string) {}); err != nil {
							t.Fatalf("op %d: recover: %v", at, err)
						}
					}
					if got := readTreeIfAny(t, dir); !sameTree(got, before) {
						t.Fatalf("op %d (kill %v): tree changed: %s", at, kill, treeDiff(before, got))
					}
					if ents, _ := os.ReadDir(parent); len(ents) != min(1, len(before)) {
						t.Fatalf("op %d (kill %v): left behind %v", at, kill, names(ents))
					}
				}
			}
		})
	}
}

func readTreeIfAny(t *testing.T, dir string) map[string]string {
	if _, err := os.Stat(dir); os.IsNotExist(err) {
		return map[string]string{}
	}
	return readTree(t, dir)
}

func restoreTree(t *testing.T, dir string, tree map[string]string) {
	for p, s := range tree {
		full := filepath.Join(dir, filepath.FromSlash(p))
		os.MkdirAll(filepath.Dir(full), 0o755)
		if err := os.WriteFile(full, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func sameTree(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func treeDiff(want, got map[string]string) string {
	var d []string
	for k, v := range want {
		if g, ok := got[k]; !ok {
			d = append(d, "missing "+k)
		} else if g != v {
			d = append(d, "changed "+k)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			d = append(d, "extra "+k)
		}
	}
	if len(d) > 8 {
		d = append(d[:8], fmt.Sprintf("... %d more", len(d)-8))
	}
	return strings.Join(d, ", ")
}

func names(ents []os.DirEntry) []string {
	var n []string
	for _, e := range ents {
		n = append(n, e.Name())
	}
	return n
}

func TestUnifiedDiffApplies(t *testing.T) {
	a := "one\ntwo\nthree\nfour\nfive\nsix\nseven\neight\nnine\nten\n"
	b := "zero\none\ntwo\nthree\nfour\nFIVE\nsix\nseven\neight\nnine\nten\neleven"
	d := string(unifiedDiff("x.txt", []byte(a), []byte(b)))
	for _, want := range []string{"--- a/x.txt\n+++ b/x.txt\n", "@@ -1,10 +1,12 @@\n+zero\n", "-five\n+FIVE\n", "+eleven\n\\ No newline at end of file\n"} {
		if !strings.Contains(d, want) {
			t.Errorf("diff lacks %q:\n%s", want, d)
		}
	}
	if unifiedDiff("x", []byte(a), []byte(a)) != nil {
		t.Error("diff of equal texts is not empty")
	}
	if _, err := os.Stat("/usr/bin/patch"); err == nil {
		dir := t.TempDir()
		os.WriteFile(filepath.Join(dir, "x.txt"), []byte(a), 0o644)
		os.WriteFile(filepath.Join(dir, "p.patch"), []byte(d), 0o644)
		if out, err := runIn(dir, "patch", "-p1", "-i", "p.patch"); err != nil {
			t.Fatalf("patch: %v\n%s", err, out)
		}
		if got, _ := os.ReadFile(filepath.Join(dir, "x.txt")); string(got) != b {
			t.Fatalf("patched file:\n%q\nwant\n%q", got, b)
		}
	}
}

// TestRecoveryIsPerTarget: a stage a killed run left for one scaffold is not touched when
// another scaffold beside it recovers; its own recovery rolls it back.
func TestRecoveryIsPerTarget(t *testing.T) {
	top := t.TempDir()
	os.MkdirAll(filepath.Join(top, "a"), 0o755)
	os.WriteFile(filepath.Join(top, "a", "f"), []byte("old"), 0o644)
	// Op 8 is the rename that puts the new f in place, after the old one moved aside.
	_, killed := withFS(&faultyFS{at: 8, kill: true}, func() error {
		return commitChanges(top, "a", []change{{rel: "a/f", content: []byte("new"), mode: 0o644}, {rel: "a/g", content: []byte("g"), mode: 0o644}})
	})
	if !killed {
		t.Fatal("not killed")
	}
	stages, _ := filepath.Glob(filepath.Join(top, txnPrefix+"*"))
	if len(stages) != 1 {
		t.Fatalf("stages left: %v", stages)
	}
	if err := recoverTxns(top, "b", func(string) {}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stages[0]); err != nil {
		t.Fatalf("recovering b removed a's stage: %v", err)
	}
	var said []string
	if err := recoverTxns(top, "a", func(s string) { said = append(said, s) }); err != nil {
		t.Fatal(err)
	}
	if got := readTree(t, filepath.Join(top, "a")); len(got) != 1 || got["f"] != "old" {
		t.Fatalf("a after recovery: %v", got)
	}
	if _, err := os.Stat(stages[0]); !os.IsNotExist(err) || len(said) != 1 {
		t.Fatalf("stage not removed (%v) or recovery not reported (%v)", err, said)
	}
}
