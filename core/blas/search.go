package blas

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/cpu"
)

// Backend describes what runs this process's single-precision GEMMs.
type Backend struct {
	Vendor   string   // "OpenBLAS", "BLIS", "MKL", "CBLAS"; "own" or "gonum" without a library
	Path     string   // the library file; "" without one
	Config   string   // the library's version and build string
	Threads  int      // the library's thread count (0 without one or when it cannot say)
	Own      bool     // no library: core/kernels/ref's own GEMM runs the GEMMs (Vendor "own")
	Fallback string   // why no library runs the GEMMs (the own GEMM or gonum does); "" when one does
	Warnings []string // problems met while choosing (a RESIN_BLAS_LIB that did not load, ...)
}

// ownCPU says whether this CPU runs core/kernels/ref's own GEMM, whose micro-kernels need
// AVX2 and FMA on amd64 (ref's TestOwnGEMMCPU checks that it agrees with the kernels).
var ownCPU = runtime.GOARCH == "amd64" && cpu.X86.HasAVX2 && cpu.X86.HasFMA

// Own reports whether the process's GEMMs run on core/kernels/ref's own GEMM: no library
// is loaded (Default is nil), RESIN_BLAS does not ask for gonum, and the CPU has AVX2 and
// FMA. It allocates nothing.
func Own() bool {
	Default()
	return process.backend.Own
}

// Loaded reports whether a BLAS library runs the GEMMs.
func (b Backend) Loaded() bool { return b.Path != "" }

// InstallHint says how to give this machine a BLAS.
const InstallHint = "install one (apt-get install libopenblas0-pthread, or pip install scipy-openblas32 " +
	"and set RESIN_BLAS_LIB to its scipy_openblas32/lib/libscipy_openblas.so; scripts/test.sh does the latter under .cache/)"

// choice is a BLAS chosen once: the process's (Default), or a test's.
type choice struct {
	once    sync.Once
	lib     *Library
	backend Backend
}

var process choice

// Default returns the process's BLAS, chosen on first use (a CPU model's first GEMM) by
// the search order of the package documentation, or nil when GEMM runs on gonum (Info
// says why). The first call prints the search's warnings to stderr, and one line when
// the search found no library (GonumWarning).
func Default() *Library {
	return process.get(func() (*Library, Backend) {
		defer quietOpenBLAS()()
		return Load(os.Getenv)
	}, os.Stderr)
}

// get runs load the first time and prints its warnings to stderr.
func (c *choice) get(load func() (*Library, Backend), stderr io.Writer) *Library {
	c.once.Do(func() {
		c.lib, c.backend = load()
		for _, w := range c.backend.Warnings {
			fmt.Fprintf(stderr, "resin: warning: %s\n", w)
		}
		if w := c.backend.GonumWarning(); w != "" {
			fmt.Fprintf(stderr, "resin: warning: %s\n", w)
		}
	})
	return c.lib
}

// GonumWarning is the warning that GEMM runs on the gonum fallback because the search
// found no library and the CPU runs no own GEMM (no AVX2+FMA), with the one-line fixes;
// "" when a library or the own GEMM runs the GEMMs, when RESIN_BLAS=off or gonum chose
// gonum, and when RESIN_BLAS_LIB failed (its warning says so).
func (b Backend) GonumWarning() string {
	if b.Loaded() || b.Own || !strings.HasPrefix(b.Fallback, noCBLAS) {
		return ""
	}
	return "no BLAS library found, and this CPU has no AVX2+FMA for Resin's own GEMM: CPU GEMMs run on gonum, several times slower (a ~120M Llama prefills ~8x slower); " +
		"fix: apt-get install libopenblas0-pthread, or pip install scipy-openblas32 (found in site-packages), " +
		"or RESIN_BLAS_LIB=/path/to/libopenblas.so; RESIN_BLAS=off keeps gonum without this warning"
}

// noCBLAS starts the Fallback of a search that found no library.
const noCBLAS = "no CBLAS found"

// quietOpenBLAS sets OPENBLAS_NUM_THREADS=1 for the library's load, when the library is
// to run on one thread (RESIN_BLAS_THREADS unset or 1) and the environment names no
// OpenBLAS thread count, and returns what restores the environment (so that processes
// started later do not inherit it). OpenBLAS starts its helper threads when it loads, as
// many as the CPUs, and those threads kept one core ~8% busy yielding although every call
// ran on one thread; started with one thread it starts none (openblas_set_num_threads
// still starts them when RESIN_BLAS_THREADS asks for more).
func quietOpenBLAS() (restore func()) {
	if v := os.Getenv("RESIN_BLAS_THREADS"); v != "" && v != "1" {
		return func() {}
	}
	for _, v := range []string{"OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS"} {
		if _, set := os.LookupEnv(v); set {
			return func() {}
		}
	}
	os.Setenv("OPENBLAS_NUM_THREADS", "1")
	return func() { os.Unsetenv("OPENBLAS_NUM_THREADS") }
}

// Info describes the process's GEMM backend (loading it if nothing has yet), with the
// library's thread count as it is now.
func Info() Backend {
	lib := Default()
	b := process.backend
	if lib != nil && lib.getThreads != nil {
		b.Threads = lib.Threads()
	}
	b.Warnings = append([]string(nil), b.Warnings...)
	return b
}

// Load runs the search order with the environment read through getenv and sets the
// thread count of the library it finds. It returns nil and a Backend whose Fallback says
// why when no library is used. Default calls it once for the process; tests call it with
// their own environment.
func Load(getenv func(string) string) (*Library, Backend) { return load(getenv, ownCPU) }

// load is Load on a CPU that runs the own GEMM or not (own).
func load(getenv func(string) string, own bool) (*Library, Backend) {
	b := Backend{Vendor: "gonum"}
	noLibrary := func(why string) (*Library, Backend) {
		b.Fallback = why
		if own {
			b.Vendor, b.Own = "own", true
		}
		return nil, b
	}
	wantLibrary := false
	switch v := getenv("RESIN_BLAS"); v {
	case "off", "gonum":
		b.Fallback = "RESIN_BLAS=" + v
		return nil, b
	case "own":
		if !own {
			b.Warnings = append(b.Warnings, "RESIN_BLAS=own: this CPU has no AVX2+FMA, which Resin's own GEMM needs; GEMM runs on gonum")
		}
		return noLibrary("RESIN_BLAS=own")
	case "blas":
		wantLibrary = true
	case "", "on", "auto":
	default:
		b.Warnings = append(b.Warnings, fmt.Sprintf("RESIN_BLAS=%q not understood (want own, blas, gonum or off, or unset for a library when one is found, else the own GEMM); searching", v))
	}
	fallback := "gonum"
	if own {
		fallback = "Resin's own GEMM"
	}

	var lib *Library
	libWarning := -1
	if p := getenv("RESIN_BLAS_LIB"); p != "" {
		l, err := Open(p)
		if err != nil {
			libWarning = len(b.Warnings)
			b.Warnings = append(b.Warnings, fmt.Sprintf("RESIN_BLAS_LIB=%s: %v", p, err))
		} else {
			lib = l
		}
	}
	if lib == nil {
		for _, c := range Candidates(getenv) {
			if l, err := Open(c); err == nil {
				lib = l
				break
			}
		}
	}
	if lib == nil {
		why := noCBLAS + " (OpenBLAS, BLIS or MKL); " + InstallHint
		switch {
		case libWarning >= 0:
			why = "RESIN_BLAS_LIB did not load and the search found no other CBLAS"
			b.Warnings[libWarning] += "; GEMM falls back to " + fallback
		case wantLibrary:
			b.Warnings = append(b.Warnings, "RESIN_BLAS=blas, but no BLAS library was found; GEMM runs on "+fallback)
		}
		return noLibrary(why)
	}
	if libWarning >= 0 {
		b.Warnings[libWarning] += fmt.Sprintf("; using %s %s instead", lib.Vendor, lib.Path)
	}

	threads := 1 // the callers' worker pool splits a GEMM across GOMAXPROCS
	if v := getenv("RESIN_BLAS_THREADS"); v != "" {
		if n, err := strconv.Atoi(v); err == nil && n > 0 {
			threads = n
		} else {
			b.Warnings = append(b.Warnings, fmt.Sprintf("RESIN_BLAS_THREADS=%q is not a positive integer; using 1 (GEMMs split on the worker pool)", v))
		}
	}
	b.Vendor, b.Path, b.Config = lib.Vendor, lib.Path, lib.Config
	if w := cpuWarning(lib); w != "" {
		b.Warnings = append(b.Warnings, w)
	}
	b.Threads = lib.SetThreads(threads)
	switch cpus := runtime.NumCPU(); {
	case lib.setThreads == nil:
		if threads != 1 {
			b.Warnings = append(b.Warnings, fmt.Sprintf("RESIN_BLAS_THREADS=%d: %s has no call to set its thread count; it runs its own default", threads, lib.Path))
		}
	case threads > cpus:
		b.Warnings = append(b.Warnings, fmt.Sprintf("RESIN_BLAS_THREADS=%d is more than this machine's %d CPUs: the library's threads will take turns on the cores (the library runs %d)", threads, cpus, b.Threads))
	case b.Threads != threads:
		b.Warnings = append(b.Warnings, fmt.Sprintf("RESIN_BLAS_THREADS=%d: the library runs %d threads", threads, b.Threads))
	}
	return lib, b
}

// Candidates lists the libraries the search tries after RESIN_BLAS_LIB, in order: OpenBLAS,
// then BLIS, then MKL. Bare names go to the dynamic loader's own search; the others are
// files that exist.
func Candidates(getenv func(string) string) []string {
	triplet := multiarch()
	sitePackages := []string{
		"/usr/local/lib/python3*/dist-packages", "/usr/local/lib/python3*/site-packages",
		"/usr/lib/python3/dist-packages", "/usr/lib/python3*/site-packages",
		"/opt/conda/lib/python3*/site-packages",
	}
	for _, v := range []string{"VIRTUAL_ENV", "CONDA_PREFIX"} {
		if d := getenv(v); d != "" {
			sitePackages = append([]string{filepath.Join(d, "lib/python3*/site-packages")}, sitePackages...)
		}
	}
	if h := getenv("HOME"); h != "" {
		sitePackages = append(sitePackages, filepath.Join(h, ".local/lib/python3*/site-packages"))
	}
	var prefixLibs []string // conda and venv prefixes keep native libraries in lib/
	if d := getenv("CONDA_PREFIX"); d != "" {
		prefixLibs = append(prefixLibs, filepath.Join(d, "lib"))
	}

	var out []string
	add := func(names []string, dirs []string) {
		out = append(out, names...) // the dynamic loader's search (LD_LIBRARY_PATH, ld.so.cache)
		for _, d := range dirs {
			for _, n := range names {
				matches, _ := filepath.Glob(filepath.Join(d, n))
				sort.Sort(sort.Reverse(sort.StringSlice(matches)))
				out = append(out, matches...)
			}
		}
	}

	// OpenBLAS: system, Debian's variants, source installs, then the scipy-openblas32 wheel.
	add([]string{"libopenblas.so.0", "libopenblas.so"}, append([]string{
		"/usr/lib/" + triplet + "/openblas-pthread", "/usr/lib/" + triplet + "/openblas-openmp",
		"/usr/lib/" + triplet + "/openblas-serial", "/usr/lib64/openblas-pthreads", "/usr/lib64/openblas-openmp",
		"/usr/lib64", "/usr/local/lib", "/opt/OpenBLAS/lib",
	}, prefixLibs...))
	for _, s := range sitePackages {
		matches, _ := filepath.Glob(filepath.Join(s, "scipy_openblas32/lib/libscipy_openblas*.so"))
		out = append(out, matches...)
	}
	// BLIS.
	add([]string{"libblis.so.4", "libblis.so"}, append([]string{
		"/usr/lib/" + triplet + "/blis-pthread", "/usr/lib/" + triplet + "/blis-openmp",
		"/usr/lib/" + triplet + "/blis-serial", "/usr/lib64", "/usr/local/lib",
	}, prefixLibs...))
	// MKL.
	add([]string{"libmkl_rt.so.2", "libmkl_rt.so"}, append([]string{
		"/opt/intel/oneapi/mkl/latest/lib", "/opt/intel/oneapi/mkl/latest/lib/intel64",
		"/opt/intel/mkl/lib/intel64",
	}, prefixLibs...))
	return dedupe(out)
}

func dedupe(paths []string) []string {
	seen := make(map[string]bool, len(paths))
	out := paths[:0]
	for _, p := range paths {
		if !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	return out
}

// multiarch is Debian's directory name for this architecture's libraries.
func multiarch() string {
	switch runtime.GOARCH {
	case "amd64":
		return "x86_64-linux-gnu"
	case "arm64":
		return "aarch64-linux-gnu"
	case "ppc64le":
		return "powerpc64le-linux-gnu"
	case "riscv64":
		return "riscv64-linux-gnu"
	default:
		return runtime.GOARCH + "-linux-gnu"
	}
}

// String is one line for logs: the vendor and file, or the fallback and why.
func (b Backend) String() string {
	if b.Own {
		return "own GEMM (core/kernels/ref; no library: " + b.Fallback + ")"
	}
	if !b.Loaded() {
		return "gonum (" + b.Fallback + ")"
	}
	s := fmt.Sprintf("%s %s", b.Vendor, b.Path)
	if b.Threads > 0 {
		s += fmt.Sprintf(", %d threads", b.Threads)
	}
	return strings.TrimSpace(s)
}
