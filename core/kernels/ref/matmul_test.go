package ref

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"testing"

	cblas "github.com/resin-llm/resin/core/blas"
)

// gemmShapes covers degenerate, odd, GEMV-shaped and large products, below and above
// minBLASWeight.
var gemmShapes = [][3]int{ // m, k, n
	{1, 1, 1}, {1, 0, 5}, {3, 0, 4}, {0, 7, 3}, {2, 3, 0},
	{1, 7, 13}, {5, 9, 1}, {3, 5, 7}, {17, 33, 65}, {31, 1, 29},
	{1, 1024, 300}, {1, 257, 1031}, {2, 300, 301}, {8, 1024, 96},
	{64, 64, 64}, {130, 257, 300}, {256, 512, 384},
}

// gemmOperands returns random a [m, k] and b (k·n values) and, in float64, the exact
// product a·op(b) and Σ|a|·|op(b)| per element, the scale of float32 rounding error.
func gemmOperands(rng *rand.Rand, transB bool, m, k, n int) (a, b []float32, exact, scale []float64) {
	a, b = make([]float32, m*k), make([]float32, k*n)
	for i := range a {
		a[i] = rng.Float32()*2 - 1
	}
	for i := range b {
		b[i] = rng.Float32()*2 - 1
	}
	exact, scale = make([]float64, m*n), make([]float64, m*n)
	for i := range m {
		for j := range n {
			for p := range k {
				bv := b[p*n+j]
				if transB {
					bv = b[j*k+p]
				}
				x := float64(a[i*k+p]) * float64(bv)
				exact[i*n+j] += x
				scale[i*n+j] += math.Abs(x)
			}
		}
	}
	return a, b, exact, scale
}

// checkProduct fails when got is further from exact than float32 GEMM rounding allows
// (k·ε·Σ|a||b| per element, a bound gonum and every BLAS meet).
func checkProduct(t *testing.T, what string, got []float32, exact, scale []float64, k int) {
	t.Helper()
	const eps = 1.0 / (1 << 24)
	for i := range exact {
		tol := float64(k+2)*eps*scale[i] + 1e-30
		if d := math.Abs(float64(got[i]) - exact[i]); !(d <= tol) {
			t.Fatalf("%s: out[%d] = %v, exact %v (off by %.3g, tolerance %.3g)", what, i, got[i], exact[i], d, tol)
		}
	}
}

func nanFilled(n int) []float32 {
	out := make([]float32, n)
	for i := range out {
		out[i] = float32(math.NaN()) // the GEMM must overwrite out, not accumulate into it
	}
	return out
}

// TestMatMulBackendsAgree checks MatMul and MatMulT (on whatever backend this process
// chose), gonum, and the BLAS library called directly against the exact product.
func TestMatMulBackendsAgree(t *testing.T) {
	lib := cblas.Default()
	rng := rand.New(rand.NewPCG(3, 4))
	for _, s := range gemmShapes {
		m, k, n := s[0], s[1], s[2]
		for _, transB := range []bool{false, true} {
			op, call := "MatMul", MatMul
			if transB {
				op, call = "MatMulT", MatMulT
			}
			a, b, exact, scale := gemmOperands(rng, transB, m, k, n)
			what := func(backend string) string {
				return fmt.Sprintf("%s/%s m=%d k=%d n=%d", op, backend, m, k, n)
			}

			got := nanFilled(m * n)
			if err := call(got, a, b, m, k, n); err != nil {
				t.Fatalf("%s: %v", what(GEMMBackend()), err)
			}
			checkProduct(t, what(GEMMBackend()), got, exact, scale, k)

			if m > 0 && k > 0 && n > 0 { // gonumGemm is gemm after its early returns
				got = nanFilled(m * n)
				gonumGemm(transB, got, a, b, m, k, n)
				checkProduct(t, what("gonum"), got, exact, scale, k)
			}

			if lib != nil {
				got = nanFilled(m * n)
				if err := lib.Sgemm(transB, m, n, k, a, b, got); err != nil {
					t.Fatalf("%s: %v", what(lib.Vendor), err)
				}
				checkProduct(t, what(lib.Vendor), got, exact, scale, k)
			}
		}
	}
	if lib == nil {
		t.Logf("BLAS half not run: %s", cblas.Info().Fallback)
	}
}

// TestGEMMBackendFollowsEnvironment checks that the backend is the one the environment
// asks for: gonum under RESIN_BLAS=off or gonum, the library RESIN_BLAS_LIB names when it
// loads, and without a library the own GEMM exactly where the CPU has a micro-kernel
// (core/blas decides from the CPU's features too: the two must agree).
func TestGEMMBackendFollowsEnvironment(t *testing.T) {
	info := cblas.Info()
	mr, _ := gemmMicro()
	switch v := os.Getenv("RESIN_BLAS"); {
	case v == "off" || v == "gonum":
		if GEMMBackend() != "gonum" || cblas.Default() != nil || cblas.Own() {
			t.Fatalf("RESIN_BLAS=%s, but GEMM runs on %s", v, info)
		}
	case v == "own":
		if cblas.Default() != nil || cblas.Own() != (mr > 0) || GEMMBackend() != map[bool]string{true: "own", false: "gonum"}[mr > 0] {
			t.Fatalf("RESIN_BLAS=own, micro-kernel %q, but GEMM runs on %s (%s)", GEMMKernel(), GEMMBackend(), info)
		}
	case os.Getenv("RESIN_BLAS_LIB") != "":
		lib, err := cblas.Open(os.Getenv("RESIN_BLAS_LIB"))
		if err != nil {
			t.Skipf("RESIN_BLAS_LIB does not load (%v); the warning path is tested in core/blas", err)
		}
		if GEMMBackend() != lib.Vendor || info.Path != lib.Path || cblas.Own() {
			t.Fatalf("RESIN_BLAS_LIB=%s loads as %s %s, but GEMM runs on %s", os.Getenv("RESIN_BLAS_LIB"), lib.Vendor, lib.Path, info)
		}
	default:
		if lib := cblas.Default(); lib != nil {
			if GEMMBackend() != lib.Vendor || cblas.Own() {
				t.Fatalf("GEMMBackend() = %s, but the library is %s", GEMMBackend(), lib.Vendor)
			}
			t.Skipf("the search found %s: the own GEMM's selection is not exercised", lib.Path)
		}
		want := map[bool]string{true: "own", false: "gonum"}[mr > 0]
		if cblas.Own() != (mr > 0) || GEMMBackend() != want {
			t.Fatalf("no library, micro-kernel %q: GEMMBackend() = %s and core/blas says own=%v, want %s", GEMMKernel(), GEMMBackend(), cblas.Own(), want)
		}
	}
}

// TestMatMulChecksBeforeBLAS checks that bad shapes are refused before any library sees
// them, on a product large enough to go to the BLAS.
func TestMatMulChecksBeforeBLAS(t *testing.T) {
	m, k, n := 64, 64, 64
	for name, err := range map[string]error{
		"MatMulT short w":    MatMulT(make([]float32, m*n), make([]float32, m*k), make([]float32, n*k-1), m, k, n),
		"MatMul short out":   MatMul(make([]float32, m*n-1), make([]float32, m*k), make([]float32, k*n), m, k, n),
		"MatMul short a":     MatMul(make([]float32, m*n), make([]float32, m*k-1), make([]float32, k*n), m, k, n),
		"MatMulT negative k": MatMulT(nil, nil, nil, m, -k, n),
	} {
		if err == nil || !strings.HasPrefix(err.Error(), "ref.MatMul") {
			t.Errorf("%s: error %v, want one from ref.MatMul/MatMulT", name, err)
		}
	}
}

// TestMatMulConcurrent runs products from several goroutines at once, as a worker pool
// does: the library must serve concurrent callers without mixing their operands.
func TestMatMulConcurrent(t *testing.T) {
	type job struct {
		m, k, n      int
		a, b         []float32
		exact, scale []float64
	}
	rng := rand.New(rand.NewPCG(5, 6))
	var jobs []job
	for _, s := range [][3]int{{1, 256, 384}, {8, 128, 200}, {33, 64, 96}, {64, 256, 64}} {
		a, b, exact, scale := gemmOperands(rng, true, s[0], s[1], s[2])
		jobs = append(jobs, job{s[0], s[1], s[2], a, b, exact, scale})
	}
	errs := make(chan error, len(jobs))
	outs := make([][]float32, len(jobs))
	for i, j := range jobs {
		go func() {
			out := make([]float32, j.m*j.n)
			for range 20 {
				if err := MatMulT(out, j.a, j.b, j.m, j.k, j.n); err != nil {
					errs <- err
					return
				}
			}
			outs[i] = out
			errs <- nil
		}()
	}
	for range jobs {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	for i, j := range jobs {
		checkProduct(t, fmt.Sprintf("concurrent MatMulT/%s m=%d k=%d n=%d", GEMMBackend(), j.m, j.k, j.n), outs[i], j.exact, j.scale, j.k)
	}
}

// TestMatMulOnBLASAllocatesNothing checks that products routed to the library, decode-
// and batch-shaped, allocate nothing, as the models' allocation-free steps need (m=8
// MatMulT runs on the skinny kernel where the CPU has AVX2+FMA, m=16 on the library).
func TestMatMulOnBLASAllocatesNothing(t *testing.T) {
	if cblas.Default() == nil {
		t.Skipf("no BLAS library: %s", cblas.Info().Fallback)
	}
	k, n := 128, 96 // k·n ≥ minBLASWeight
	x, w, out := make([]float32, 16*k), make([]float32, n*k), make([]float32, 16*n)
	for _, m := range []int{1, 8, 16} {
		if a := testing.AllocsPerRun(50, func() {
			if err := MatMulT(out[:m*n], x[:m*k], w, m, k, n); err != nil {
				t.Fatal(err)
			}
			if err := MatMul(out[:m*n], x[:m*k], w, m, k, n); err != nil {
				t.Fatal(err)
			}
		}); a != 0 {
			t.Errorf("m=%d: %v allocations per MatMulT+MatMul on %s", m, a, GEMMBackend())
		}
	}
}
