package main

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/resin-llm/resin/templates"
)

// TestForkBuildsFromFreshClone is the fork-from-scratch path: a standalone scaffold is
// committed to git, cloned into another directory and built there with an empty module
// cache and nothing but a module proxy (the module cache this checkout filled, served as a
// file:// GOPROXY, so the test needs no network): no file may name the checkout it was
// made from, and the clone builds and generates.
func TestForkBuildsFromFreshClone(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a cloned runtime with an empty module cache")
	}
	for _, tool := range []string{"go", "git"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("no %s on PATH", tool)
		}
	}
	modcache, err := exec.Command("go", "env", "GOMODCACHE").Output()
	if err != nil {
		t.Fatal(err)
	}
	proxy := filepath.Join(strings.TrimSpace(string(modcache)), "cache", "download")
	core := coreDir(t)

	t.Setenv("GOPROXY", "off")
	src := filepath.Join(t.TempDir(), "demo")
	if out, err := runCLI(t, templates.FS, "model", "demo", "--out", src); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for p, s := range readTree(t, src) {
		if strings.Contains(s, core) {
			t.Errorf("%s names the checkout %s: a clone elsewhere would not build", p, core)
		}
	}
	if _, err := os.Stat(filepath.Join(src, VendorDir, "LICENSE")); err != nil {
		t.Errorf("the vendored core carries no LICENSE: %v", err)
	}
	git := func(dir string, args ...string) {
		t.Helper()
		if out, err := runIn(dir, "git", append([]string{"-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"}, args...)...); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	git(src, "init", "-q")
	git(src, "add", "-A")
	git(src, "commit", "-qm", "scaffold")
	clone := filepath.Join(t.TempDir(), "fork")
	git(filepath.Dir(clone), "clone", "-q", src, clone)

	emptyCache := t.TempDir()
	env := append(os.Environ(), "GOWORK=off", "GOFLAGS="+scaffoldGoflags("-mod=readonly"), "GOSUMDB=off", "GOTOOLCHAIN=local",
		"GOMODCACHE="+emptyCache, "GOPROXY=file://"+filepath.ToSlash(proxy))
	t.Cleanup(func() { // the module cache is read-only; let TempDir remove it
		filepath.WalkDir(emptyCache, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				os.Chmod(p, 0o755)
			}
			return nil
		})
	})
	for _, step := range [][]string{
		{"go", "build", "./..."},
		{"go", "run", "./cmd/demo", "generate", "--prompt-ids", "1,2,3,4", "--max-tokens", "4"},
	} {
		cmd := exec.Command(step[0], step[1:]...)
		cmd.Dir, cmd.Env = clone, env
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s in the clone: %v\n%s", strings.Join(step, " "), err, out)
		}
		if step[1] == "run" && !strings.Contains(string(out), "tokens: [") {
			t.Fatalf("the clone did not generate:\n%s", out)
		}
	}
}

// TestUpdateRefreshesVendoredCore: update brings third_party/resin to the checkout's core,
// removes what the core dropped, and backs up a vendored file edited in place.
func TestUpdateRefreshesVendoredCore(t *testing.T) {
	dir := scaffoldDemo(t)
	vdir := filepath.Join(dir, filepath.FromSlash(VendorDir))
	engine := filepath.Join(vdir, "core", "engine", "engine.go")
	orig, _ := os.ReadFile(engine)
	os.WriteFile(engine, append(orig, []byte("\n// edited in place\n")...), 0o644)
	stale := filepath.Join(vdir, "core", "gone", "gone.go")
	os.MkdirAll(filepath.Dir(stale), 0o755)
	os.WriteFile(stale, []byte("package gone\n"), 0o644)
	man, _ := os.ReadFile(filepath.Join(vdir, VendorManifest))
	os.WriteFile(filepath.Join(vdir, VendorManifest), append(man, []byte("sha256 "+sha([]byte("package gone\n"))+" core/gone/gone.go\n")...), 0o644)

	out, err := runCLI(t, templates.FS, "update", dir)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if got, _ := os.ReadFile(engine); string(got) != string(orig) {
		t.Error("vendored engine.go not refreshed")
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Error("a file the core no longer has stayed vendored")
	}
	if !strings.Contains(out, "core/engine/engine.go") || !strings.Contains(out, backupDir) {
		t.Errorf("update did not name the backup of the edited vendored file:\n%s", out)
	}
}
