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
)

// Backend describes what runs this process's single-precision GEMMs.
type Backend struct {
	Vendor   string   // "OpenBLAS", "BLIS", "MKL", "CBLAS", or "gonum" on the fallback
	Path     string   // the library file; "" on the fallback
	Config   string   // the library's version and build string
	Threads  int      // the library's thread count (0 on the fallback or when it cannot say)
	Fallback string   // why gonum runs the GEMMs; "" when a library does
	Warnings []string // problems met while choosing (a RESIN_BLAS_LIB that did not load, ...)
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
// found no library, with the one-line fixes; "" when a library runs the GEMMs, when
// RESIN_BLAS=off chose gonum, and when RESIN_BLAS_LIB failed (its warning says so).
func (b Backend) GonumWarning() string {
	if b.Loaded() || !strings.HasPrefix(b.Fallback, noCBLAS) {
		return ""
	}
	return "no BLAS library found: CPU GEMMs run on gonum, several times slower (a ~120M Llama prefills ~8x slower); " +
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
func Load(getenv func(string) string) (*Library, Backend) {
	b := Backend{Vendor: "gonum"}
	switch v := getenv("RESIN_BLAS"); v {
	case "off":
		b.Fallback = "RESIN_BLAS=off"
		return nil, b
	case "", "on", "auto":
	default:
		b.Warnings = append(b.Warnings, fmt.Sprintf("RESIN_BLAS=%q not understood (want off, or unset to search for a BLAS); searching", v))
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
		b.Fallback = noCBLAS + " (OpenBLAS, BLIS or MKL); " + InstallHint
		if libWarning >= 0 {
			b.Fallback = "RESIN_BLAS_LIB did not load and the search found no other CBLAS"
			b.Warnings[libWarning] += "; GEMM falls back to gonum"
		}
		return nil, b
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
	if !b.Loaded() {
		return "gonum (" + b.Fallback + ")"
	}
	s := fmt.Sprintf("%s %s", b.Vendor, b.Path)
	if b.Threads > 0 {
		s += fmt.Sprintf(", %d threads", b.Threads)
	}
	return strings.TrimSpace(s)
}
