package blas

import (
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// env turns a map into a getenv for Load and Candidates.
func env(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

// needLibrary returns the BLAS this machine's environment finds, or skips.
func needLibrary(t *testing.T) *Library {
	t.Helper()
	lib, b := Load(os.Getenv)
	if lib == nil {
		t.Skipf("no BLAS library: %s", b.Fallback)
	}
	return lib
}

func TestLoadOffForcesFallback(t *testing.T) {
	lib, b := Load(env(map[string]string{"RESIN_BLAS": "off", "RESIN_BLAS_LIB": os.Getenv("RESIN_BLAS_LIB")}))
	if lib != nil || b.Loaded() || b.Vendor != "gonum" || b.Fallback != "RESIN_BLAS=off" {
		t.Fatalf("RESIN_BLAS=off gave library %v, backend %+v", lib, b)
	}
	if !strings.Contains(b.String(), "gonum (RESIN_BLAS=off)") {
		t.Errorf("String() = %q", b.String())
	}
}

func TestLoadWarnsOnUnknownRESIN_BLAS(t *testing.T) {
	_, b := Load(env(map[string]string{"RESIN_BLAS": "maybe", "RESIN_BLAS_LIB": os.Getenv("RESIN_BLAS_LIB")}))
	if len(b.Warnings) == 0 || !strings.Contains(b.Warnings[0], `RESIN_BLAS="maybe" not understood`) {
		t.Fatalf("warnings %q do not name the bad RESIN_BLAS", b.Warnings)
	}
}

func TestOpenRejectsNonLibraryFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "libfake.so")
	if err := os.WriteFile(path, []byte("not an ELF file\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(path); err == nil || !strings.Contains(err.Error(), "not a loadable library") {
		t.Fatalf("Open(text file) = %v, want a 'not a loadable library' error", err)
	}
	if _, err := Open(t.TempDir()); err == nil || !strings.Contains(err.Error(), "is a directory") {
		t.Fatalf("Open(directory) = %v, want an 'is a directory' error", err)
	}

	// RESIN_BLAS_LIB naming it: a warning naming the file and what is used instead.
	lib, b := Load(env(map[string]string{"RESIN_BLAS_LIB": path}))
	if len(b.Warnings) == 0 || !strings.Contains(b.Warnings[0], "RESIN_BLAS_LIB="+path+": not a loadable library") {
		t.Fatalf("warnings %q do not name RESIN_BLAS_LIB=%s", b.Warnings, path)
	}
	if lib == nil {
		if !strings.HasSuffix(b.Warnings[0], "GEMM falls back to "+map[bool]string{false: "gonum", true: "Resin's own GEMM"}[b.Own]) ||
			b.Vendor != map[bool]string{false: "gonum", true: "own"}[b.Own] || b.Own != ownCPU || b.Fallback == "" {
			t.Errorf("no library found, but the warning or backend does not say gonum: %q, %+v", b.Warnings, b)
		}
	} else if !strings.Contains(b.Warnings[0], "using "+lib.Vendor+" "+lib.Path+" instead") {
		t.Errorf("search found %s, but the warning does not say so: %q", lib.Path, b.Warnings[0])
	}
}

func TestOpenRejectsLibraryWithoutCBLAS(t *testing.T) {
	// libm loads everywhere glibc does and has no cblas_sgemm.
	if _, err := dlopen("libm.so.6"); err != nil {
		t.Skipf("libm.so.6 does not load here: %v", err)
	}
	_, err := Open("libm.so.6")
	if !errors.Is(err, ErrNotCBLAS) {
		t.Fatalf("Open(libm.so.6) = %v, want ErrNotCBLAS", err)
	}
	_, b := Load(env(map[string]string{"RESIN_BLAS_LIB": "libm.so.6"}))
	if len(b.Warnings) == 0 || !strings.Contains(b.Warnings[0], "RESIN_BLAS_LIB=libm.so.6: exports no cblas_sgemm") {
		t.Fatalf("warnings %q do not say libm.so.6 is not a CBLAS", b.Warnings)
	}
}

func TestCandidatesSearchOrder(t *testing.T) {
	venv := t.TempDir()
	wheel := filepath.Join(venv, "lib/python3.11/site-packages/scipy_openblas32/lib/libscipy_openblas.so")
	if err := os.MkdirAll(filepath.Dir(wheel), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(wheel, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	c := Candidates(env(map[string]string{"VIRTUAL_ENV": venv}))
	pos := func(name string) int {
		i := slices.IndexFunc(c, func(p string) bool { return p == name })
		if i < 0 {
			t.Fatalf("candidates lack %s: %q", name, c)
		}
		return i
	}
	order := []string{"libopenblas.so.0", "libopenblas.so", wheel, "libblis.so.4", "libblis.so", "libmkl_rt.so.2", "libmkl_rt.so"}
	for i := 1; i < len(order); i++ {
		if pos(order[i-1]) >= pos(order[i]) {
			t.Errorf("%s comes after %s in %q", order[i-1], order[i], c)
		}
	}
	// An empty file where the wheel's library should be is skipped, not fatal.
	lib, _ := Load(env(map[string]string{"VIRTUAL_ENV": venv}))
	if lib != nil && lib.Path == wheel {
		t.Fatalf("Load took the empty file %s as a BLAS", wheel)
	}
}

func TestLoadSetsThreads(t *testing.T) {
	lib := needLibrary(t)
	if lib.setThreads == nil {
		t.Skipf("%s (%s) has no thread-count call", lib.Vendor, lib.Path)
	}
	defer lib.SetThreads(lib.ThreadsSet()) // the thread count is the library's, shared with Default
	l, b := Load(env(map[string]string{"RESIN_BLAS_LIB": lib.Path, "RESIN_BLAS_THREADS": "2"}))
	if b.Threads != 2 || l.Threads() != 2 || l.ThreadsSet() != 2 {
		t.Fatalf("RESIN_BLAS_THREADS=2 gave backend threads %d, library threads %d (set %d)", b.Threads, l.Threads(), l.ThreadsSet())
	}
	// Unset, the library runs on one thread: core/kernels/ref's pool does the splitting.
	l, b = Load(env(map[string]string{"RESIN_BLAS_LIB": lib.Path}))
	if b.Threads != 1 || l.Threads() != 1 || l.ThreadsSet() != 1 {
		t.Fatalf("with no RESIN_BLAS_THREADS: backend threads %d, library threads %d (set %d), want 1", b.Threads, l.Threads(), l.ThreadsSet())
	}
	l, b = Load(env(map[string]string{"RESIN_BLAS_LIB": lib.Path, "RESIN_BLAS_THREADS": "two"}))
	if len(b.Warnings) == 0 || !strings.Contains(b.Warnings[0], `RESIN_BLAS_THREADS="two" is not a positive integer`) {
		t.Fatalf("warnings %q do not name the bad RESIN_BLAS_THREADS", b.Warnings)
	}
	if b.Threads != 1 || l.ThreadsSet() != 1 {
		t.Errorf("threads %d after a bad RESIN_BLAS_THREADS, want the default 1", b.Threads)
	}
	// More threads than CPUs is allowed, and named: they would share the cores.
	many := strconv.Itoa(runtime.NumCPU() + 1)
	_, b = Load(env(map[string]string{"RESIN_BLAS_LIB": lib.Path, "RESIN_BLAS_THREADS": many}))
	if len(b.Warnings) == 0 || !strings.Contains(b.Warnings[len(b.Warnings)-1], "RESIN_BLAS_THREADS="+many+" is more than this machine's") {
		t.Errorf("RESIN_BLAS_THREADS=%s on %d CPUs: warnings %q", many, runtime.NumCPU(), b.Warnings)
	}
}

// product returns random operands a [m, k] and bt [n, k] (seeds seed and seed+1), bt
// transposed as b [k, n], and their product a·btᵀ [m, n] computed by Sgemm.
func product(t *testing.T, lib *Library, m, k, n int, seed uint64) (a, bt, b, want []float32) {
	t.Helper()
	a, bt = randFloats(m*k, seed), randFloats(n*k, seed+1)
	b = make([]float32, k*n)
	for i := range n {
		for j := range k {
			b[j*n+i] = bt[i*k+j]
		}
	}
	want = make([]float32, m*n)
	if err := lib.Sgemm(true, m, n, k, a, bt, want); err != nil {
		t.Fatal(err)
	}
	return a, bt, b, want
}

// TestSgemmStrided computes blocks of rows and columns of products in place, through row
// strides, and checks each against the whole product: every block, both layouts of b.
func TestSgemmStrided(t *testing.T) {
	lib := needLibrary(t)
	m, k, n := 37, 70, 53
	a, bt, b, want := product(t, lib, m, k, n, 1)
	for _, transB := range []bool{true, false} {
		for _, blk := range [][4]int{{0, m, 0, n}, {0, 1, 5, 40}, {3, 20, 0, 17}, {20, m, 17, n}, {36, m, 52, n}} {
			r0, r1, c0, c1 := blk[0], blk[1], blk[2], blk[3]
			got := make([]float32, m*n)
			for i := range got {
				got[i] = -7 // outside the block stays untouched
			}
			bb, ldb := b[c0:], n
			if transB {
				bb, ldb = bt[c0*k:], k
			}
			if err := lib.SgemmStrided(transB, r1-r0, c1-c0, k, a[r0*k:], k, bb, ldb, got[r0*n+c0:], n); err != nil {
				t.Fatal(err)
			}
			for i := range m {
				for j := range n {
					g, w := got[i*n+j], want[i*n+j]
					if i < r0 || i >= r1 || j < c0 || j >= c1 {
						w = -7
					}
					if d := math.Abs(float64(g - w)); d > 1e-4*(1+math.Abs(float64(w))) {
						t.Fatalf("transB=%v block %v: c[%d,%d] = %g, want %g", transB, blk, i, j, g, w)
					}
				}
			}
		}
	}
	if err := lib.SgemmStrided(true, 2, 3, 4, a, 3, bt, 4, want, 3); err == nil || !strings.Contains(err.Error(), "lda=3") {
		t.Errorf("a stride shorter than k: err %v, want one naming lda=3", err)
	}
	if err := lib.SgemmStrided(true, 2, 3, 4, a, 4, bt, 4, want[:5], 3); err == nil || !strings.Contains(err.Error(), "short operand") {
		t.Errorf("c shorter than its strided rows: err %v, want short operand", err)
	}
}

func TestLibraryDescribesItself(t *testing.T) {
	lib := needLibrary(t)
	if !filepath.IsAbs(lib.Path) {
		t.Errorf("Path %q is not the file the loader found", lib.Path)
	}
	if lib.Vendor != "CBLAS" && lib.Config == "" {
		t.Errorf("%s at %s reports no version or configuration", lib.Vendor, lib.Path)
	}
	if lib.Vendor == "OpenBLAS" && !strings.Contains(lib.Config, "OpenBLAS") {
		t.Errorf("OpenBLAS config %q does not name OpenBLAS", lib.Config)
	}
}

// naive computes a·op(b) in float64.
func naive(transB bool, m, n, k int, a, b []float32) []float64 {
	out := make([]float64, m*n)
	for i := range m {
		for j := range n {
			var s float64
			for p := range k {
				bv := b[p*n+j]
				if transB {
					bv = b[j*k+p]
				}
				s += float64(a[i*k+p]) * float64(bv)
			}
			out[i*n+j] = s
		}
	}
	return out
}

func TestSgemmMatchesNaive(t *testing.T) {
	lib := needLibrary(t)
	rng := rand.New(rand.NewPCG(1, 2))
	for _, s := range [][3]int{{1, 1, 1}, {1, 7, 13}, {3, 5, 0}, {0, 4, 4}, {5, 1, 9}, {17, 33, 65}, {64, 96, 128}, {1, 300, 257}} {
		m, n, k := s[0], s[1], s[2]
		for _, transB := range []bool{false, true} {
			a := make([]float32, m*k)
			b := make([]float32, k*n)
			for i := range a {
				a[i] = rng.Float32()*2 - 1
			}
			for i := range b {
				b[i] = rng.Float32()*2 - 1
			}
			c := make([]float32, m*n)
			for i := range c {
				c[i] = float32(math.NaN()) // beta = 0 must overwrite, not scale
			}
			if err := lib.Sgemm(transB, m, n, k, a, b, c); err != nil {
				t.Fatal(err)
			}
			want := naive(transB, m, n, k, a, b)
			for i := range c {
				if d := math.Abs(float64(c[i]) - want[i]); !(d <= 1e-5*float64(k+1)) {
					t.Fatalf("m=%d n=%d k=%d transB=%v: c[%d] = %v, want %v", m, n, k, transB, i, c[i], want[i])
				}
			}
		}
	}
}

func TestSgemmRejectsBadShapes(t *testing.T) {
	lib := needLibrary(t)
	if err := lib.Sgemm(false, 2, 2, 2, make([]float32, 3), make([]float32, 4), make([]float32, 4)); err == nil || !strings.Contains(err.Error(), "len(a)=3 (want 4)") {
		t.Errorf("short a: %v", err)
	}
	if err := lib.Sgemm(true, -1, 2, 2, nil, nil, nil); err == nil || !strings.Contains(err.Error(), "negative dimension") {
		t.Errorf("negative m: %v", err)
	}
}

func TestCoreWarning(t *testing.T) {
	debian := "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH NO_AFFINITY Prescott MAX_THREADS=64"
	w := coreWarning("OpenBLAS", debian, true, true)
	for _, want := range []string{"OpenBLAS 0.3.21 runs its Prescott kernels", "AVX-512", "OPENBLAS_CORETYPE=SkylakeX"} {
		if !strings.Contains(w, want) {
			t.Errorf("warning %q lacks %q", w, want)
		}
	}
	if w := coreWarning("OpenBLAS", debian, true, false); !strings.Contains(w, "OPENBLAS_CORETYPE=Haswell") {
		t.Errorf("AVX2 without AVX-512: warning %q does not suggest Haswell", w)
	}
	for _, c := range []struct {
		vendor, config string
		avx2           bool
	}{
		{"OpenBLAS", debian, false}, // an SSE-only CPU: Prescott is right
		{"OpenBLAS", "OpenBLAS 0.3.34 DYNAMIC_ARCH NO_AFFINITY SkylakeX MAX_THREADS=64", true},
		{"BLIS", "BLIS 0.9.0", true},
	} {
		if w := coreWarning(c.vendor, c.config, c.avx2, false); w != "" {
			t.Errorf("%s %q (avx2 %v): unexpected warning %q", c.vendor, c.config, c.avx2, w)
		}
	}
}

func TestSgemmAllocatesNothing(t *testing.T) {
	lib := needLibrary(t)
	a, b, c := make([]float32, 8*64), make([]float32, 64*48), make([]float32, 8*48)
	for _, m := range []int{1, 8} { // sgemv_ and sgemm_
		for _, transB := range []bool{false, true} {
			if n := testing.AllocsPerRun(100, func() {
				if err := lib.Sgemm(transB, m, 48, 64, a, b, c); err != nil {
					t.Fatal(err)
				}
			}); n != 0 {
				t.Errorf("m=%d transB=%v: %v allocations per call", m, transB, n)
			}
		}
	}
}

func TestOpenRejectsILP64OpenBLAS(t *testing.T) {
	// numpy's wheels ship an ILP64 OpenBLAS whose symbols end in 64_: it is no LP64 CBLAS.
	var matches []string
	for _, site := range []string{"/usr/lib/python3*/*-packages", "/usr/local/lib/python3*/*-packages", "../../.cache/*/lib/python3*/site-packages"} {
		m, _ := filepath.Glob(site + "/numpy.libs/libscipy_openblas64_*.so")
		matches = append(matches, m...)
	}
	if len(matches) == 0 {
		t.Skip("no numpy ILP64 OpenBLAS on this machine")
	}
	if _, err := Open(matches[0]); !errors.Is(err, ErrNotCBLAS) && !errors.Is(err, ErrILP64) {
		t.Fatalf("Open(%s) = %v, want ErrNotCBLAS or ErrILP64", matches[0], err)
	}
}

// TestSearchFindsWheelInVirtualEnv lays a virtual environment holding the scipy-openblas32
// library (a link to the one RESIN_BLAS_LIB names) and checks that the search, without
// RESIN_BLAS_LIB, loads it, or an OpenBLAS that comes before it in the order.
func TestSearchFindsWheelInVirtualEnv(t *testing.T) {
	lib := needLibrary(t)
	if !strings.Contains(lib.Path, "scipy_openblas32") {
		t.Skipf("the library here (%s) is not the scipy-openblas32 wheel's", lib.Path)
	}
	venv := t.TempDir()
	wheel := filepath.Join(venv, "lib/python3.11/site-packages/scipy_openblas32/lib/libscipy_openblas.so")
	if err := os.MkdirAll(filepath.Dir(wheel), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(lib.Path, wheel); err != nil {
		t.Fatal(err)
	}
	e := env(map[string]string{"VIRTUAL_ENV": venv})
	cands := Candidates(e)
	var earlier []string
	for _, c := range cands[:slices.Index(cands, wheel)] {
		if l, err := Open(c); err == nil {
			earlier = append(earlier, l.Path)
		}
	}
	found, b := Load(e)
	if found == nil {
		t.Fatalf("search with VIRTUAL_ENV=%s found nothing: %s", venv, b.Fallback)
	}
	if len(earlier) == 0 && found.Path != lib.Path {
		t.Fatalf("search loaded %s, want the wheel's %s", found.Path, lib.Path)
	}
	if len(earlier) > 0 && found.Path != earlier[0] {
		t.Fatalf("search loaded %s, want %s, the first candidate that loads", found.Path, earlier[0])
	}
}

// randFloats returns n values in [-1, 1) from a generator seeded with seed.
func randFloats(n int, seed uint64) []float32 {
	rng := rand.New(rand.NewPCG(seed, 7))
	x := make([]float32, n)
	for i := range x {
		x[i] = rng.Float32()*2 - 1
	}
	return x
}

// TestSgemmOutT checks the transposed-output product against Sgemm, both layouts of b, a
// column block of b and an output stride wider than m.
func TestSgemmOutT(t *testing.T) {
	lib := needLibrary(t)
	m, k, n := 8, 70, 53
	a, bt, b, want := product(t, lib, m, k, n, 3)
	const ldct, c0, c1 = 11, 5, 40
	for _, transB := range []bool{true, false} {
		bb, ldb := b[c0:], n
		if transB {
			bb, ldb = bt[c0*k:], k
		}
		ct := make([]float32, (c1-c0)*ldct)
		if err := lib.SgemmOutT(transB, m, c1-c0, k, a, k, bb, ldb, ct, ldct); err != nil {
			t.Fatal(err)
		}
		for i := range m {
			for j := c0; j < c1; j++ {
				g, w := ct[(j-c0)*ldct+i], want[i*n+j]
				if d := math.Abs(float64(g - w)); d > 1e-4*(1+math.Abs(float64(w))) {
					t.Fatalf("transB=%v: c[%d,%d] = %g, want %g", transB, i, j, g, w)
				}
			}
		}
	}
	if err := lib.SgemmOutT(true, m, 3, k, a, k, bt, k, make([]float32, 3*m), m-1); err == nil || !strings.Contains(err.Error(), "ldct=7") {
		t.Errorf("ldct < m: err %v, want one naming ldct=7", err)
	}
}

// TestQuietOpenBLASRestoresEnvironment checks that the one-thread load leaves no
// OPENBLAS_NUM_THREADS behind for processes started later, and sets none over a user's.
func TestQuietOpenBLASRestoresEnvironment(t *testing.T) {
	t.Setenv("RESIN_BLAS_THREADS", "")
	os.Unsetenv("RESIN_BLAS_THREADS")
	t.Setenv("OPENBLAS_NUM_THREADS", "")
	os.Unsetenv("OPENBLAS_NUM_THREADS")
	restore := quietOpenBLAS()
	if v := os.Getenv("OPENBLAS_NUM_THREADS"); v != "1" {
		t.Fatalf("during the load OPENBLAS_NUM_THREADS=%q, want 1", v)
	}
	restore()
	if v, set := os.LookupEnv("OPENBLAS_NUM_THREADS"); set {
		t.Fatalf("after the load OPENBLAS_NUM_THREADS=%q is still set", v)
	}
	t.Setenv("OPENBLAS_NUM_THREADS", "3")
	quietOpenBLAS()()
	if v := os.Getenv("OPENBLAS_NUM_THREADS"); v != "3" {
		t.Fatalf("a user's OPENBLAS_NUM_THREADS=3 became %q", v)
	}
	os.Unsetenv("OPENBLAS_NUM_THREADS")
	t.Setenv("RESIN_BLAS_THREADS", "2")
	quietOpenBLAS()()
	if v, set := os.LookupEnv("OPENBLAS_NUM_THREADS"); set {
		t.Fatalf("RESIN_BLAS_THREADS=2 still set OPENBLAS_NUM_THREADS=%q", v)
	}
}

// TestGonumWarningOnce: a process whose search found no library says so once, on stderr,
// naming the fixes (a fresh machine ran its CPU GEMMs on gonum, ~8x slower, without a
// word); RESIN_BLAS=off, an explicit choice, and a loaded library print nothing.
func TestGonumWarningOnce(t *testing.T) {
	_, off := Load(env(map[string]string{"RESIN_BLAS": "off"}))
	for _, c := range []struct {
		name  string
		b     Backend
		lines int
	}{
		{"none found", Backend{Vendor: "gonum", Fallback: noCBLAS + " (OpenBLAS, BLIS or MKL); " + InstallHint}, 1},
		{"none found, own GEMM", Backend{Vendor: "own", Own: true, Fallback: noCBLAS + " (OpenBLAS, BLIS or MKL); " + InstallHint}, 0},
		{"RESIN_BLAS=off", off, 0},
		{"loaded", Backend{Vendor: "OpenBLAS", Path: "/usr/lib/libopenblas.so.0"}, 0},
	} {
		var c1 choice
		var stderr strings.Builder
		load := func() (*Library, Backend) { return nil, c.b }
		for range 3 {
			c1.get(load, &stderr)
		}
		if n := strings.Count(stderr.String(), "\n"); n != c.lines {
			t.Errorf("%s: %d lines on stderr, want %d:\n%s", c.name, n, c.lines, stderr.String())
		}
		if c.lines == 1 {
			for _, want := range []string{"gonum", "apt-get install libopenblas0-pthread", "pip install scipy-openblas32", "RESIN_BLAS_LIB=", "RESIN_BLAS=off"} {
				if !strings.Contains(stderr.String(), want) {
					t.Errorf("%s: the warning lacks %q: %s", c.name, want, stderr.String())
				}
			}
		}
	}
}

// TestLoadChoosesOwnOrGonum: without a library the own GEMM runs on a CPU that has it,
// whatever the reason (RESIN_BLAS=own, or a search that found nothing), and gonum where
// RESIN_BLAS asks for it or the CPU lacks AVX2+FMA; RESIN_BLAS=blas warns when it finds no
// library. Before the own GEMM, every case without a library was gonum.
func TestLoadChoosesOwnOrGonum(t *testing.T) {
	none := filepath.Join(t.TempDir(), "libnone.so") // RESIN_BLAS_LIB names a missing file
	for _, c := range []struct {
		env      map[string]string
		ownCPU   bool
		vendor   string
		fallback string
		warning  string
	}{
		{map[string]string{"RESIN_BLAS": "own"}, true, "own", "RESIN_BLAS=own", ""},
		{map[string]string{"RESIN_BLAS": "own"}, false, "gonum", "RESIN_BLAS=own", "RESIN_BLAS=own: this CPU has no AVX2+FMA"},
		{map[string]string{"RESIN_BLAS": "gonum"}, true, "gonum", "RESIN_BLAS=gonum", ""},
		{map[string]string{"RESIN_BLAS": "off"}, true, "gonum", "RESIN_BLAS=off", ""},
		{map[string]string{"RESIN_BLAS_LIB": none}, true, "own", "RESIN_BLAS_LIB did not load", "; GEMM falls back to Resin's own GEMM"},
		{map[string]string{"RESIN_BLAS_LIB": none}, false, "gonum", "RESIN_BLAS_LIB did not load", "; GEMM falls back to gonum"},
	} {
		lib, b := load(env(c.env), c.ownCPU)
		if lib != nil {
			if c.env["RESIN_BLAS_LIB"] != "" {
				continue // the search found a library on this machine: nothing to fall back from
			}
			t.Fatalf("%v: loaded %s", c.env, lib.Path)
		}
		if b.Vendor != c.vendor || b.Own != (c.vendor == "own") || !strings.HasPrefix(b.Fallback, c.fallback) {
			t.Errorf("%v, own CPU %v: backend %+v, want vendor %s, fallback %q", c.env, c.ownCPU, b, c.vendor, c.fallback)
		}
		if got := strings.Join(b.Warnings, "\n"); !strings.Contains(got, c.warning) || (c.warning == "") != (got == "") {
			t.Errorf("%v, own CPU %v: warnings %q, want %q", c.env, c.ownCPU, got, c.warning)
		}
		if b.Own && !strings.HasPrefix(b.String(), "own GEMM") {
			t.Errorf("%v: String() = %q", c.env, b.String())
		}
	}
}
