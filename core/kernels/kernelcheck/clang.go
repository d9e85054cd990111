package kernelcheck

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"strings"
)

// ClangFlags are the flags clang compiles a source with: device code only, no CUDA
// headers or libdevice (the prelude supplies what the kernels use), PTX 7.8 for sm_90.
var ClangFlags = []string{"-x", "cuda", "--cuda-gpu-arch=" + ClangArch, "--cuda-device-only",
	"-nocudainc", "-nocudalib", "-Xclang", "-target-feature", "-Xclang", "+ptx78", "-O3", "-S"}

var reClangVersion = regexp.MustCompile(`version (1[6-9]|[2-9][0-9])\.`)

// FindClang returns path when set, else clang-16 on PATH, else clang on PATH when it is
// version 16 or newer; ErrNoClang when there is none.
func FindClang(path string) (string, error) {
	if path != "" {
		if _, err := exec.LookPath(path); err != nil {
			return "", fmt.Errorf("%w: %v", ErrNoClang, err)
		}
		return path, nil
	}
	if p, err := exec.LookPath("clang-16"); err == nil {
		return p, nil
	}
	if p, err := exec.LookPath("clang"); err == nil {
		if out, err := exec.Command(p, "--version").Output(); err == nil && reClangVersion.Match(out) {
			return p, nil
		}
	}
	return "", ErrNoClang
}

// Clang compiles each source to PTX with clang (ClangFlags, warnings as errors unless
// allowed), its headers written beside it, and assembles the PTX with ptxas -v for
// ClangArch when ptxas is found. A source that fails to compile, lacks an entry point,
// calls an external function (which needs libdevice) or spills registers gets a
// Result.Err. The error matches ErrNoClang when clang is not installed.
func Clang(fsys fs.FS, names []string, o Options) ([]Result, error) {
	cc, err := FindClang(o.Clang)
	if err != nil {
		return nil, err
	}
	ptxas, _ := FindPtxas(o.Ptxas)
	work, err := os.MkdirTemp("", "kernelcheck-clang-")
	if err != nil {
		return nil, fmt.Errorf("clang: %w", err)
	}
	defer os.RemoveAll(work)
	results := make([]Result, len(names))
	for i, name := range names {
		r := &results[i]
		*r = Result{Source: name, Compiler: filepath.Base(cc), Arch: ClangArch}
		dir := filepath.Join(work, fmt.Sprint(i))
		ptx, log, err := clangCompile(cc, fsys, name, o, dir)
		r.PTX, r.Log = ptx, log
		if err != nil {
			r.Err = err
			continue
		}
		errs := []error{checkEntries(name, ptx, o.Entries[name])}
		if bytes.Contains(ptx, []byte("call.uni")) || bytes.Contains(ptx, []byte(".extern .func")) {
			errs = append(errs, fmt.Errorf("%s: clang's PTX calls an external function (libdevice is not linked)", name))
		}
		if ptxas != "" {
			r.Kernels, err = Assemble(ptxas, ptx, ClangArch)
			errs = append(errs, checkReport(name, r.Kernels, err, o.Entries[name]))
		}
		r.Err = errors.Join(errs...)
	}
	return results, nil
}

// clangCompile writes name and its headers under dir, as the source expects to find them,
// and compiles it to PTX.
func clangCompile(cc string, fsys fs.FS, name string, o Options, dir string) (ptx []byte, log string, err error) {
	src, err := fs.ReadFile(fsys, name)
	if err != nil {
		return nil, "", fmt.Errorf("kernelcheck: read %s: %w", name, err)
	}
	hdrs, err := headers(fsys, name, o.Includes)
	if err != nil {
		return nil, "", err
	}
	in := filepath.Join(dir, path.Base(name))
	files := map[string]string{in: string(src)}
	for inc, text := range hdrs {
		files[filepath.Join(dir, filepath.FromSlash(inc))] = text
	}
	for p, text := range files {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return nil, "", fmt.Errorf("clang %s: %w", name, err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			return nil, "", fmt.Errorf("clang %s: %w", name, err)
		}
	}
	out := strings.TrimSuffix(in, ".cu") + ".ptx"
	args := append(append([]string{}, ClangFlags...), "-I", dir, "-o", out, in)
	if !o.AllowWarnings {
		args = append(args, "-Werror")
	}
	msg, err := exec.Command(cc, args...).CombinedOutput()
	log = strings.TrimSpace(string(msg))
	if err != nil {
		return nil, log, fmt.Errorf("%s: %s: %w\n%s", name, filepath.Base(cc), err, log)
	}
	ptx, err = os.ReadFile(out)
	if err != nil {
		return nil, log, fmt.Errorf("%s: %s wrote no PTX: %w", name, filepath.Base(cc), err)
	}
	return ptx, log, nil
}
