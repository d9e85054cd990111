package emu

import (
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"
)

// Header is the text of cuda_emu.h, the shim every module is compiled with.
//
//go:embed cuda_emu.h
var Header string

// ErrNoCompiler is returned (wrapped, naming what was looked for) when no host C++
// compiler is found.
var ErrNoCompiler = errors.New("emu: no host C++ compiler")

// Flags are the g++ flags of every module: the CUDA source compiles as host C++17 with
// prelude.cuh taking its NVRTC branch, the shim force-included. -ffp-contract=off keeps
// a*b+c two roundings on every host (aarch64 would fuse them), so the bits do not depend
// on the machine; -fno-gnu-unique keeps template statics (shared memory) per module.
var Flags = []string{"-std=c++17", "-O1", "-fPIC", "-shared", "-D__CUDACC_RTC__",
	"-ffp-contract=off", "-fno-gnu-unique", "-w"}

// ErrNoSanitizer is returned (wrapped) by BuildProgram with sanitize when the compiler
// cannot link the ASan or UBSan runtime (libasan, libubsan not installed).
var ErrNoSanitizer = errors.New("emu: the sanitizer runtimes are not installed")

// extraFlags are added to Flags by tests (the swapcontext fallback).
var extraFlags []string

// SanitizerFlags are added for a sanitizer build (BuildProgram with Sanitize).
var SanitizerFlags = []string{"-fsanitize=address,undefined", "-fno-sanitize-recover=undefined",
	"-fno-omit-frame-pointer", "-g"}

// compiler is the g++ every build uses ($RESIN_CXX, else g++ on PATH) and its version
// line, looked up once per process.
var compiler = sync.OnceValues(func() ([2]string, error) {
	name := os.Getenv("RESIN_CXX")
	if name == "" {
		name = "g++"
	}
	return compilerFor(name)
})

func compilerFor(name string) ([2]string, error) {
	path, err := exec.LookPath(name)
	if err != nil {
		return [2]string{}, fmt.Errorf("%w: %s not found on PATH (install g++ >= 11, or set RESIN_CXX)", ErrNoCompiler, name)
	}
	out, err := exec.Command(path, "--version").Output()
	if err != nil {
		return [2]string{}, fmt.Errorf("%w: %s --version: %v", ErrNoCompiler, path, err)
	}
	line, _, _ := strings.Cut(string(out), "\n")
	return [2]string{path, line}, nil
}

// Available reports whether modules can be built: nil when a host C++ compiler (g++, or
// $RESIN_CXX) is found, else an error naming what is missing.
func Available() error {
	_, err := compiler()
	return err
}

// CacheDir is where built modules are kept: $RESIN_KERNEL_CACHE/emu, or resin/emu under
// the user's cache directory, or resin-emu under the temporary directory where there is
// no user cache directory ($HOME unset, as under some CI runners).
func CacheDir() (string, error) {
	if d := os.Getenv("RESIN_KERNEL_CACHE"); d != "" {
		return filepath.Join(d, "emu"), nil
	}
	base, err := os.UserCacheDir()
	if err != nil {
		return filepath.Join(os.TempDir(), "resin-emu"), nil
	}
	return filepath.Join(base, "resin", "emu"), nil
}

// reKernel finds the kernels' entry points: RESIN_KERNEL void NAME( and
// extern "C" __global__ void NAME(.
var reKernel = regexp.MustCompile(`(?m)(?:\bRESIN_KERNEL|\bextern\s+"C"\s+__global__)\s+void\s+([A-Za-z_]\w*)\s*\(`)

// reDynShared finds an extern __shared__ array: its type and name.
var reDynShared = regexp.MustCompile(`\bextern\s+__shared__\s+((?:alignas\(\s*\d+\s*\)\s+)?[A-Za-z_][\w\s:*]*?)\s*\b([A-Za-z_]\w*)\s*\[\s*\]\s*;`)

// Kernels lists the entry points of source, in order of appearance.
func Kernels(source string) []string {
	var names []string
	seen := map[string]bool{}
	for _, m := range reKernel.FindAllStringSubmatch(stripComments(source), -1) {
		if !seen[m[1]] {
			seen[m[1]] = true
			names = append(names, m[1])
		}
	}
	return names
}

var reComment = regexp.MustCompile(`(?s)//[^\n]*|/\*.*?\*/`)

// stripComments blanks comments (keeping newlines), so that prose naming a kernel is not
// taken for one.
func stripComments(s string) string {
	return reComment.ReplaceAllStringFunc(s, func(c string) string {
		return strings.Map(func(r rune) rune {
			if r == '\n' {
				return r
			}
			return ' '
		}, c)
	})
}

// moduleText is what g++ compiles for source: the source, each extern __shared__ array
// declared through the shim (CUDA gives them all the block's dynamic shared memory; here
// each is a RESIN_EMU_DYN_BYTES array of its own), then a registration per kernel and the
// module's C ABI.
func moduleText(source string) (string, error) {
	kernels := Kernels(source)
	if len(kernels) == 0 {
		return "", errors.New("emu: the source defines no kernel (RESIN_KERNEL void NAME( or extern \"C\" __global__ void NAME()")
	}
	var dyn [][2]string
	text := reDynShared.ReplaceAllStringFunc(source, func(m string) string {
		s := reDynShared.FindStringSubmatch(m)
		dyn = append(dyn, [2]string{strings.TrimSpace(s[1]), s[2]})
		return "extern RESIN_EMU_DYN_SHARED " + s[1] + " " + s[2] + "[];"
	})
	var b strings.Builder
	b.WriteString(text)
	b.WriteString("\n#line 1 \"resin_emu_registration\"\n#pragma GCC visibility push(hidden)\n")
	for _, d := range dyn {
		fmt.Fprintf(&b, "RESIN_EMU_DYN_SHARED %s %s[RESIN_EMU_DYN_BYTES / sizeof(%s)];\n", d[0], d[1], d[0])
	}
	b.WriteString("namespace {\n")
	for i, k := range kernels {
		fmt.Fprintf(&b, "void resin_emu_invoke_%d(void** p) { ::resin_emu::tramp(&%s, p); }\n", i, k)
		fmt.Fprintf(&b, "int resin_emu_sizes_%d(unsigned* o, int n) { return ::resin_emu::param_sizes(&%s, o, n); }\n", i, k)
	}
	b.WriteString("struct resin_emu_registration {\n  resin_emu_registration() {\n")
	for i, k := range kernels {
		fmt.Fprintf(&b, "    ::resin_emu::register_kernel(%q, resin_emu_invoke_%d, resin_emu_sizes_%d);\n", k, i, i)
	}
	for _, d := range dyn {
		fmt.Fprintf(&b, "    ::resin_emu::register_dyn_shared(%s, sizeof %s);\n", d[1], d[1])
	}
	b.WriteString("  }\n} resin_emu_registration_v;\n}  // namespace\n#pragma GCC visibility pop\nRESIN_EMU_EXPORTS\n")
	return b.String(), nil
}

// Build compiles source (a CUDA source as NVRTC would get it, headers inlined) into a
// module for the emulated device and returns its path. Modules are content-addressed in
// CacheDir (the key covers the source, the shim, the flags and the compiler's version),
// so a source is compiled once per machine; a module is written under a temporary name
// and renamed into place, so a build killed midway leaves no half file. name is the
// source's file name, used in messages.
func Build(source, name string) (string, error) {
	return build(source, name, false, false)
}

// BuildProgram compiles source with driver, a C++ main (DriverSource), into an executable;
// with sanitize it is built with ASan and UBSan (SanitizerFlags). A sanitizer runtime in
// a library loaded into a Go process needs LD_PRELOAD, so the sanitizer checks run the
// kernels in a process of their own (RunScript).
func BuildProgram(source, name string, sanitize bool) (string, error) {
	return build(source, name, true, sanitize)
}

func build(source, name string, program, sanitize bool) (string, error) {
	cc, err := compiler()
	if err != nil {
		return "", err
	}
	text, err := moduleText(source)
	if err != nil {
		return "", fmt.Errorf("%s: %w", name, err)
	}
	flags := append(append([]string(nil), Flags...), extraFlags...)
	ext := ".so"
	if program {
		flags = flags[:0]
		for _, f := range append(Flags, extraFlags...) {
			if f != "-shared" {
				flags = append(flags, f)
			}
		}
		if sanitize {
			flags = append(flags, SanitizerFlags...)
		}
		text += "\n" + DriverSource
		ext = ".bin"
	}
	h := sha256.New()
	for _, part := range []string{text, Header, strings.Join(flags, " "), cc[1]} {
		fmt.Fprintf(h, "%d\n%s", len(part), part)
	}
	key := hex.EncodeToString(h.Sum(nil))[:32]
	dir, err := CacheDir()
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("emu: cache %s: %w", dir, err)
	}
	base := strings.TrimSuffix(filepath.Base(name), filepath.Ext(name))
	out := filepath.Join(dir, base+"-"+key+ext)
	if _, err := os.Stat(out); err == nil {
		inUse.Store(out, true)
		now := time.Now()
		os.Chtimes(out, now, now) // recently used: pruned last
		return out, nil
	}
	tmp, err := os.MkdirTemp(dir, "build-")
	if err != nil {
		return "", fmt.Errorf("emu: %w", err)
	}
	defer os.RemoveAll(tmp)
	hdr := filepath.Join(tmp, "cuda_emu.h")
	src := filepath.Join(tmp, base+".cpp")
	if err := os.WriteFile(hdr, []byte(Header), 0o644); err != nil {
		return "", fmt.Errorf("emu: %w", err)
	}
	if err := os.WriteFile(src, []byte(text), 0o644); err != nil {
		return "", fmt.Errorf("emu: %w", err)
	}
	obj := filepath.Join(tmp, "out"+ext)
	args := append(flags, "-include", hdr, "-x", "c++", src, "-o", obj)
	if program {
		args = append(args, "-ldl", "-lpthread")
	}
	cmd := exec.Command(cc[0], args...)
	if msg, err := cmd.CombinedOutput(); err != nil {
		low := strings.ToLower(string(msg))
		if sanitize && (strings.Contains(low, "asan") || strings.Contains(low, "ubsan")) &&
			(strings.Contains(low, "cannot find") || strings.Contains(low, "no such file")) {
			return "", fmt.Errorf("%w: %s: %s", ErrNoSanitizer, cc[0], trim(string(msg), 400))
		}
		return "", fmt.Errorf("emu: compiling %s with %s: %v\n%s", name, cc[0], err, trim(string(msg), 4000))
	}
	if err := os.Rename(obj, out); err != nil {
		return "", fmt.Errorf("emu: %w", err)
	}
	inUse.Store(out, true)
	prune(dir, out)
	return out, nil
}

// MaxCached is how many built modules, programs and module images (the image-*.so files
// the emulated cuModuleLoadData writes) CacheDir keeps by default; past it the least
// recently used go.
const MaxCached = 400

// maxCached is the limit prune applies (MaxCached; tests lower it).
var maxCached = MaxCached

// staleLibrary is how long an emulator library (libresin-emu-*.so, which core/cudart
// builds and touches each time a process loads it) may go unused before a prune removes
// it: one of another toolchain or source version. The emulator libraries are never counted
// against maxCached.
const staleLibrary = 7 * 24 * time.Hour

// inUse holds the files this process built or found (Build): its prunes never remove them,
// whatever their age, since a caller may be about to load one.
var inUse sync.Map

// started is when this process began: its prunes never remove a file used since (an image
// this process's emulated driver loaded, which touches it, or another process's file of
// now), so the limit is exceeded for a while rather than a file in use deleted.
var started = time.Now()

// prune removes the least recently used modules, programs and images of dir past maxCached
// (never keep, nor a file this process uses or one used since it started), emulator libraries unused for staleLibrary,
// and build directories and temporary files more than an hour old (left by a build that
// was killed). A file is "used" when its modification time was last set: Build, the
// emulator's library load and the emulated cuModuleLoadData refresh it on every use, so
// another process's file in use is among the newest and pruned last; a load that finds
// its file deleted anyway writes or builds it again.
func prune(dir, keep string) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	type entry struct {
		path string
		used time.Time
	}
	var removable []entry
	count := 0
	for _, e := range ents {
		info, err := e.Info()
		if err != nil {
			continue
		}
		name, p := e.Name(), filepath.Join(dir, e.Name())
		_, used := inUse.Load(p)
		used = used || p == keep
		switch {
		case e.IsDir():
			if (strings.HasPrefix(name, "build-") || strings.HasPrefix(name, "lib-")) && time.Since(info.ModTime()) > time.Hour {
				os.RemoveAll(p)
			}
		case strings.Contains(name, ".tmp-"):
			if time.Since(info.ModTime()) > time.Hour {
				os.Remove(p)
			}
		case strings.HasPrefix(name, "libresin-emu-"):
			if !used && time.Since(info.ModTime()) > staleLibrary {
				os.Remove(p)
			}
		case strings.HasSuffix(name, ".so") || strings.HasSuffix(name, ".bin"):
			count++
			if !used && info.ModTime().Before(started) {
				removable = append(removable, entry{p, info.ModTime()})
			}
		}
	}
	if count <= maxCached {
		return
	}
	sort.Slice(removable, func(i, j int) bool { return removable[i].used.Before(removable[j].used) })
	for _, e := range removable[:min(count-maxCached, len(removable))] {
		os.Remove(e.path) // a process that has it open keeps its mapping
	}
}

func trim(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "\n..."
}
