package main

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"
)

// A standalone scaffold carries the Resin core it was made from under third_party/resin
// (its go.mod replaces github.com/resin-llm/resin there), so a clone of the fork builds
// anywhere with nothing but the module proxy. VendorDir/VendorManifest lists the copied
// files with their sha256 and the core's commit: `resin-new update` refreshes the copy
// from a newer checkout, and backs up files edited in place before it does.

const (
	// VendorDir is where a standalone scaffold keeps its copy of the core.
	VendorDir = "third_party/resin"
	// VendorManifest lists the vendored files, relative to VendorDir.
	VendorManifest = ".resin-vendor"
)

// vendoredFile is one file of the vendored core, its path relative to VendorDir.
type vendoredFile struct {
	rel     string
	content []byte
}

// vendorCore reads the core's packages from a checkout: core/ (no tests, no testdata, no
// build outputs),
// go.mod, go.sum and LICENSE, and the manifest that lists them. With python (a runtime whose
// model is a Python runner) it copies the resin-runner package too, python/pyproject.toml
// and python/resin_runner/*.py, so a clone can `pip install ./third_party/resin/python`.
func vendorCore(coreDir string, python bool) ([]vendoredFile, error) {
	var out []vendoredFile
	for _, f := range []string{"go.mod", "go.sum", "LICENSE"} {
		data, err := os.ReadFile(filepath.Join(coreDir, f))
		if err != nil {
			return nil, fmt.Errorf("vendor the core: %w", err)
		}
		out = append(out, vendoredFile{f, data})
	}
	ignored := gitIgnored(coreDir)
	err := filepath.WalkDir(filepath.Join(coreDir, "core"), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".") {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(p, "_test.go") || !d.Type().IsRegular() || strings.HasPrefix(d.Name(), ".") || buildOutput(d.Name()) {
			return nil
		}
		r, _ := filepath.Rel(coreDir, p)
		if ignored[filepath.ToSlash(r)] {
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if executable(data) {
			return nil // a binary go build left beside its main package
		}
		out = append(out, vendoredFile{filepath.ToSlash(r), data})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("vendor the core: %w", err)
	}
	if python {
		py, err := vendorPython(coreDir)
		if err != nil {
			return nil, err
		}
		out = append(out, py...)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].rel < out[j].rel })
	return append(out, vendoredFile{VendorManifest, encodeVendorManifest(coreCommit(coreDir), out)}), nil
}

// buildOutput reports whether a file in core/ is what a build or test run left there (go
// test -c's binary, a profile), not source: a fork would carry a binary naming this
// checkout.
func buildOutput(name string) bool {
	for _, ext := range []string{".test", ".prof", ".pprof"} {
		if strings.HasSuffix(name, ext) {
			return true
		}
	}
	return false
}

// executable reports whether data is a compiled program (ELF or Mach-O), not source.
func executable(data []byte) bool {
	if bytes.HasPrefix(data, []byte("\x7fELF")) {
		return true
	}
	if len(data) >= 4 {
		switch m := binary.LittleEndian.Uint32(data); m {
		case 0xfeedface, 0xfeedfacf, 0xcefaedfe, 0xcffaedfe:
			return true
		}
	}
	return false
}

// gitIgnored is the set of files under core/ that the checkout's git ignores (build
// outputs, caches), by their slash path from coreDir; empty where coreDir is no git
// checkout (a module cache's copy), where buildOutput and executable still apply.
func gitIgnored(coreDir string) map[string]bool {
	out, err := exec.Command("git", "-C", coreDir, "ls-files", "-z", "--others", "--ignored", "--exclude-standard", "--", "core").Output()
	set := map[string]bool{}
	if err != nil {
		return set
	}
	for _, f := range strings.Split(string(out), "\x00") {
		if f != "" {
			set[f] = true
		}
	}
	return set
}

// vendorPython reads the resin-runner Python package of a checkout: its pyproject.toml and
// the modules of resin_runner (no tests, no build outputs).
func vendorPython(coreDir string) ([]vendoredFile, error) {
	files := []string{"python/pyproject.toml"}
	mods, err := filepath.Glob(filepath.Join(coreDir, "python", "resin_runner", "*.py"))
	if err != nil || len(mods) == 0 {
		return nil, fmt.Errorf("vendor the core: no python/resin_runner/*.py in %s (the resin-runner package a Python runner needs)", coreDir)
	}
	for _, m := range mods {
		r, _ := filepath.Rel(coreDir, m)
		files = append(files, filepath.ToSlash(r))
	}
	var out []vendoredFile
	for _, f := range files {
		data, err := os.ReadFile(filepath.Join(coreDir, filepath.FromSlash(f)))
		if err != nil {
			return nil, fmt.Errorf("vendor the core: %w", err)
		}
		out = append(out, vendoredFile{f, data})
	}
	return out, nil
}

// coreCommit names the checkout's commit, "+dirty" when core/ has uncommitted changes, or
// "unknown" without git.
func coreCommit(coreDir string) string {
	out, err := exec.Command("git", "-C", coreDir, "rev-parse", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	c := strings.TrimSpace(string(out))
	if st, err := exec.Command("git", "-C", coreDir, "status", "--porcelain", "--", "core", "go.mod", "go.sum", "LICENSE").Output(); err == nil && len(bytes.TrimSpace(st)) > 0 {
		c += "+dirty"
	}
	return c
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func encodeVendorManifest(commit string, fs []vendoredFile) []byte {
	var b bytes.Buffer
	b.WriteString("# resin-new: the Resin core vendored into this runtime; `resin-new update` refreshes it.\n")
	b.WriteString("# Edit the core upstream: a file changed here is backed up and replaced on update.\n")
	fmt.Fprintf(&b, "commit %s\n", commit)
	for _, f := range fs {
		fmt.Fprintf(&b, "sha256 %s %s\n", sha(f.content), f.rel)
	}
	return b.Bytes()
}

// vendorManifest is a parsed VendorManifest.
type vendorManifest struct {
	commit string
	sums   map[string]string // rel → sha256
}

func readVendorManifest(dir string) (*vendorManifest, error) {
	p := filepath.Join(dir, filepath.FromSlash(VendorDir), VendorManifest)
	data, err := os.ReadFile(p)
	if err != nil {
		return nil, err
	}
	m := &vendorManifest{sums: map[string]string{}}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		l := sc.Text()
		f := strings.Fields(l)
		switch {
		case l == "" || strings.HasPrefix(l, "#"):
		case len(f) == 2 && f[0] == "commit":
			m.commit = f[1]
		case len(f) == 3 && f[0] == "sha256" && len(f[1]) == 64 && validRel(f[2]):
			m.sums[f[2]] = f[1]
		default:
			return nil, fmt.Errorf("%s line %d: %q is not \"commit C\" or \"sha256 HEX PATH\"", p, n, l)
		}
	}
	return m, nil
}

// validRel reports whether p is a clean relative slash path that stays below its root.
func validRel(p string) bool {
	return p != "" && !path.IsAbs(p) && path.Clean(p) == p && p != ".." && !strings.HasPrefix(p, "../")
}

// vendorRefresh compares the vendored core in dir with a fresh copy and returns the files
// to write, those to remove, and the vendored files edited in place (their sha256 differs
// from the manifest's), which the caller backs up.
func vendorRefresh(dir string, fresh []vendoredFile) (writes []vendoredFile, removes, edited []string, err error) {
	old, err := readVendorManifest(dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, nil, nil, err
	}
	if old == nil {
		old = &vendorManifest{sums: map[string]string{}}
	}
	base := filepath.Join(dir, filepath.FromSlash(VendorDir))
	keep := map[string]bool{}
	for _, f := range fresh {
		keep[f.rel] = true
		have, err := os.ReadFile(filepath.Join(base, filepath.FromSlash(f.rel)))
		switch {
		case errors.Is(err, fs.ErrNotExist):
			writes = append(writes, f)
		case err != nil:
			return nil, nil, nil, err
		case !bytes.Equal(have, f.content):
			if sum, ok := old.sums[f.rel]; ok && sum != sha(have) {
				edited = append(edited, f.rel)
			}
			writes = append(writes, f)
		}
	}
	for rel, sum := range old.sums {
		if keep[rel] {
			continue
		}
		have, err := os.ReadFile(filepath.Join(base, filepath.FromSlash(rel)))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		} else if err != nil {
			return nil, nil, nil, err
		}
		if sha(have) != sum {
			edited = append(edited, rel)
		}
		removes = append(removes, rel)
	}
	sort.Strings(removes)
	sort.Strings(edited)
	return writes, removes, edited, nil
}

// coreRequires returns the require lines of the core's go.mod ("path version"), so a
// scaffold's go.mod lists every module the core needs and builds without `go mod tidy`.
func coreRequires(coreDir string) ([]string, error) {
	data, err := os.ReadFile(filepath.Join(coreDir, "go.mod"))
	if err != nil {
		return nil, fmt.Errorf("read the core's go.mod: %w", err)
	}
	var reqs []string
	in := false
	for _, l := range strings.Split(string(data), "\n") {
		l = strings.TrimSpace(l)
		if c := strings.Index(l, "//"); c >= 0 {
			l = strings.TrimSpace(l[:c])
		}
		switch {
		case l == "require (":
			in = true
		case in && l == ")":
			in = false
		case in && l != "":
			reqs = append(reqs, strings.Join(strings.Fields(l), " "))
		case strings.HasPrefix(l, "require "):
			reqs = append(reqs, strings.Join(strings.Fields(strings.TrimPrefix(l, "require ")), " "))
		}
	}
	sort.Strings(reqs)
	return reqs, nil
}
