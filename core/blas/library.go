package blas

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
)

// ErrNotCBLAS is returned by Open for a library that loads but exports no cblas_sgemm (or
// lacks the sgemm_/sgemv_ entry points every CBLAS library carries beside it).
var ErrNotCBLAS = errors.New("exports no cblas_sgemm with sgemm_ and sgemv_ (nor their scipy_ names): not a CBLAS")

// ErrILP64 is returned by Open for an OpenBLAS built with 64-bit integers: this package
// passes the 32-bit integers of the standard (LP64) interface.
var ErrILP64 = errors.New("built with 64-bit integers (ILP64); a 32-bit-integer (LP64) build is needed")

// symbolPrefixes are tried in order on every library: plain CBLAS names, then the scipy_
// prefix of PyPI's scipy-openblas32 wheel (scipy_cblas_sgemm, scipy_openblas_get_config).
var symbolPrefixes = []string{"", "scipy_"}

// Library is a CBLAS opened at run time.
type Library struct {
	Path   string // the file it was loaded from (the name given when the file is unknown)
	Vendor string // "OpenBLAS", "BLIS", "MKL", or "CBLAS" for a library that names nothing
	Config string // the library's own version and build string; "" when it has none

	setThreads func(n int)
	getThreads func() int
	threads    int // what SetThreads last got back

	// sgemm and sgemv are the library's Fortran-interface entry points (sgemm_, sgemv_):
	// every argument is a pointer, so they are called through purego.SyscallN without
	// reflection or allocation (cblas_sgemm passes alpha and beta in float registers,
	// which only purego's reflective RegisterFunc can do, at ~12 allocations a call).
	sgemm, sgemv uintptr
}

// blasCall holds one call's scalar arguments and argument list in memory that stays put
// (a pooled heap object), and the operands, which keeps them alive for the call.
type blasCall struct {
	transA, transB     byte
	m, n, k            int32
	lda, ldb, ldc, inc int32
	alpha, beta        float32
	a, b, c            *float32
	args               [15]uintptr
}

var calls = sync.Pool{New: func() any { return new(blasCall) }}

// Open loads the library at path (a file, or a name the dynamic loader searches for),
// checks that it is a CBLAS (cblas_sgemm, plain or scipy_-prefixed), and binds its sgemm_
// and sgemv_ and its vendor's version and thread calls when it has them.
func Open(path string) (*Library, error) {
	if fi, err := os.Stat(path); err == nil && fi.IsDir() {
		return nil, fmt.Errorf("%s is a directory, not a library file", path)
	}
	h, err := dlopen(path)
	if err != nil {
		return nil, fmt.Errorf("not a loadable library: %w", err)
	}
	sym := func(name string) uintptr {
		p, err := dlsym(h, name)
		if err != nil {
			return 0
		}
		return p
	}
	prefix, cblas := "", uintptr(0)
	for _, p := range symbolPrefixes {
		if cblas = sym(p + "cblas_sgemm"); cblas != 0 {
			prefix = p
			break
		}
	}
	gemm, gemv := sym(prefix+"sgemm_"), sym(prefix+"sgemv_")
	if cblas == 0 || gemm == 0 || gemv == 0 {
		dlclose(h)
		return nil, ErrNotCBLAS
	}
	l := &Library{Path: path, Vendor: "CBLAS", sgemm: gemm, sgemv: gemv}
	if file := mappedFile(gemm); file != "" {
		l.Path = file
	}
	l.bindVendor(prefix, sym)
	if strings.Contains(l.Config, "USE64BITINT") {
		dlclose(h)
		return nil, fmt.Errorf("%w (%s)", ErrILP64, l.Config)
	}
	return l, nil
}

// bindVendor recognises OpenBLAS, BLIS and MKL by their service calls and binds their
// version string and thread-count calls.
func (l *Library) bindVendor(prefix string, sym func(string) uintptr) {
	switch {
	case sym(prefix+"openblas_get_config") != 0:
		l.Vendor = "OpenBLAS"
		var config func() string
		purego.RegisterFunc(&config, sym(prefix+"openblas_get_config"))
		l.Config = strings.TrimSpace(config())
		bindThreads[int32](l, sym(prefix+"openblas_set_num_threads"), sym(prefix+"openblas_get_num_threads"))
	case sym("bli_info_get_version_str") != 0:
		l.Vendor = "BLIS"
		var version func() string
		purego.RegisterFunc(&version, sym("bli_info_get_version_str"))
		l.Config = "BLIS " + strings.TrimSpace(version())
		bindThreads[int64](l, sym("bli_thread_set_num_threads"), sym("bli_thread_get_num_threads")) // dim_t
	case sym("MKL_Get_Version_String") != 0:
		l.Vendor = "MKL"
		if p := sym("MKL_Set_Interface_Layer"); p != 0 {
			// mkl_rt may be told ILP64 by MKL_INTERFACE_LAYER; the calls here pass int32.
			var setLayer func(layer int32) int32
			purego.RegisterFunc(&setLayer, p)
			setLayer(0) // MKL_INTERFACE_LP64
		}
		var version func(buf *byte, n int32)
		purego.RegisterFunc(&version, sym("MKL_Get_Version_String"))
		buf := make([]byte, 256)
		version(&buf[0], int32(len(buf)))
		if i := strings.IndexByte(string(buf), 0); i >= 0 {
			buf = buf[:i]
		}
		l.Config = strings.TrimSpace(string(buf))
		bindThreads[int32](l, sym("MKL_Set_Num_Threads"), sym("MKL_Get_Max_Threads"))
	}
}

// bindThreads binds a vendor's `void set(T n)` and `T get(void)` thread-count calls, when
// the library has both.
func bindThreads[T int32 | int64](l *Library, set, get uintptr) {
	if set == 0 || get == 0 {
		return
	}
	var setFn func(T)
	var getFn func() T
	purego.RegisterFunc(&setFn, set)
	purego.RegisterFunc(&getFn, get)
	l.setThreads = func(n int) { setFn(T(n)) }
	l.getThreads = func() int { return int(getFn()) }
}

// SetThreads sets the number of threads the library runs a GEMM on (n ≥ 1) and returns
// the count it reports afterwards, which a library built for fewer threads may cap. It
// returns 0 for a library with no thread call.
func (l *Library) SetThreads(n int) int {
	if l.setThreads == nil {
		return 0
	}
	l.setThreads(max(n, 1))
	l.threads = l.getThreads()
	return l.threads
}

// ThreadsSet returns the thread count SetThreads last set (0 before any call, or for a
// library with no thread call) without calling into the library.
func (l *Library) ThreadsSet() int { return l.threads }

// Threads returns the library's thread count, or 0 when it has no call that says.
func (l *Library) Threads() int {
	if l.getThreads == nil {
		return 0
	}
	return l.getThreads()
}

// Sgemm computes c = a·op(b) in row-major order, op(b) = b or bᵀ:
//
//	a: [m, k]   b: [k, n], or [n, k] when transB   c: [m, n]
//
// A single row (m = 1) goes to sgemv_. Sgemm allocates nothing; concurrent calls are
// fine (every CBLAS this package loads is thread-safe).
func (l *Library) Sgemm(transB bool, m, n, k int, a, b, c []float32) error {
	ldb := n
	if transB {
		ldb = k
	}
	return l.SgemmStrided(transB, m, n, k, a, k, b, ldb, c, n)
}

// SgemmStrided is Sgemm on operands whose rows lie lda, ldb and ldc values apart (each at
// least the row's length), so a block of rows or columns of a larger matrix can be
// computed in place: with transB, b's rows [j0, j1) and c's columns [j0, j1) are
// b[j0*ldb:] and c[j0:] with the same strides.
func (l *Library) SgemmStrided(transB bool, m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int) error {
	if run, err := checkGemm(transB, m, n, k, a, lda, b, ldb, c, ldc, m, n, "c"); !run {
		return err
	}
	// Column-major BLAS sees each row-major operand transposed, so it computes
	// cᵀ[n, m] = op(b)ᵀ·aᵀ: b comes first, transposed when it is [n, k].
	cl := calls.Get().(*blasCall)
	cl.a, cl.b, cl.c = &a[0], &b[0], &c[0]
	cl.alpha, cl.beta, cl.inc = 1, 0, 1
	cl.m, cl.n, cl.k = int32(m), int32(n), int32(k)
	cl.lda, cl.ldb, cl.ldc = int32(lda), int32(ldb), int32(ldc)
	cl.transA, cl.transB = 'N', 'N'
	p := func(v unsafe.Pointer) uintptr { return uintptr(v) }
	if m == 1 {
		// c[n] = op(b)·a. beta = 0 does not clear y in every BLAS (0·NaN), so y starts at 0.
		clear(c[:n])
		rows, cols, trans := cl.n, cl.k, byte('N') // b as [k, n] is an n×k column-major matrix
		if transB {
			rows, cols, trans = cl.k, cl.n, 'T' // b as [n, k] is k×n column-major
		}
		cl.m, cl.n, cl.transA = rows, cols, trans
		cl.args = [15]uintptr{p(unsafe.Pointer(&cl.transA)), p(unsafe.Pointer(&cl.m)), p(unsafe.Pointer(&cl.n)),
			p(unsafe.Pointer(&cl.alpha)), p(unsafe.Pointer(cl.b)), p(unsafe.Pointer(&cl.ldb)),
			p(unsafe.Pointer(cl.a)), p(unsafe.Pointer(&cl.inc)), p(unsafe.Pointer(&cl.beta)),
			p(unsafe.Pointer(cl.c)), p(unsafe.Pointer(&cl.inc)), 1}
		purego.SyscallN(l.sgemv, cl.args[:12]...)
	} else {
		if transB {
			cl.transA = 'T'
		}
		cl.args = [15]uintptr{p(unsafe.Pointer(&cl.transA)), p(unsafe.Pointer(&cl.transB)),
			p(unsafe.Pointer(&cl.n)), p(unsafe.Pointer(&cl.m)), p(unsafe.Pointer(&cl.k)), p(unsafe.Pointer(&cl.alpha)),
			p(unsafe.Pointer(cl.b)), p(unsafe.Pointer(&cl.ldb)), p(unsafe.Pointer(cl.a)), p(unsafe.Pointer(&cl.lda)),
			p(unsafe.Pointer(&cl.beta)), p(unsafe.Pointer(cl.c)), p(unsafe.Pointer(&cl.ldc)), 1, 1}
		purego.SyscallN(l.sgemm, cl.args[:]...)
	}
	runtime.KeepAlive(a)
	runtime.KeepAlive(b)
	runtime.KeepAlive(c)
	cl.a, cl.b, cl.c = nil, nil, nil
	calls.Put(cl)
	return nil
}

// checkGemm checks the operands of the product a·op(b) of m×n×k whose result c (named
// cName in errors) is stored as cRows rows of cCols values, ldc apart. It reports whether
// a product is left to compute: none for an error, an empty product, or k = 0, for which
// it clears c.
func checkGemm(transB bool, m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc, cRows, cCols int, cName string) (bool, error) {
	if m < 0 || n < 0 || k < 0 {
		return false, fmt.Errorf("sgemm: negative dimension m=%d n=%d k=%d", m, n, k)
	}
	bRows, bCols := k, n
	if transB {
		bRows, bCols = n, k
	}
	if lda < k || ldb < bCols || ldc < cCols {
		return false, fmt.Errorf("sgemm m=%d n=%d k=%d: strides lda=%d ldb=%d ld%s=%d shorter than the rows", m, n, k, lda, ldb, cName, ldc)
	}
	for _, d := range [...]int{m, n, k, lda, ldb, ldc, m * lda, bRows * ldb, cRows * ldc} {
		if d > 1<<31-1 {
			return false, fmt.Errorf("sgemm: m=%d n=%d k=%d exceeds the 32-bit CBLAS interface", m, n, k)
		}
	}
	if m == 0 || n == 0 {
		return false, nil
	}
	span := func(rows, cols, ld int) int { return (rows-1)*ld + cols } // rows, cols > 0
	wantA, wantB, wantC := 0, 0, span(cRows, cCols, ldc)
	if k > 0 {
		wantA, wantB = span(m, k, lda), span(bRows, bCols, ldb)
	}
	if len(a) < wantA || len(b) < wantB || len(c) < wantC {
		return false, fmt.Errorf("sgemm m=%d n=%d k=%d: short operand: len(a)=%d (want %d), len(b)=%d (want %d), len(%s)=%d (want %d)",
			m, n, k, len(a), wantA, len(b), wantB, cName, len(c), wantC)
	}
	if k == 0 {
		for i := range cRows {
			clear(c[i*ldc : i*ldc+cCols])
		}
		return false, nil
	}
	return true, nil
}

// SgemmOutT computes c = a·op(b) like SgemmStrided but stores c transposed: c[i, j] goes
// to ct[j*ldct + i] (ldct ≥ m). A product of few rows (a decode batch) runs faster this
// way round: the library streams b as the wide operand.
func (l *Library) SgemmOutT(transB bool, m, n, k int, a []float32, lda int, b []float32, ldb int, ct []float32, ldct int) error {
	if run, err := checkGemm(transB, m, n, k, a, lda, b, ldb, ct, ldct, n, m, "ct"); !run {
		return err
	}
	// Column-major, ct is the m×n matrix a·op(b): a is aᵀ of a k×m matrix, op(b) is b as
	// the k×n matrix it is column-major (transB), or the transpose of the n×k one.
	cl := calls.Get().(*blasCall)
	cl.a, cl.b, cl.c = &a[0], &b[0], &ct[0]
	cl.alpha, cl.beta = 1, 0
	cl.m, cl.n, cl.k = int32(m), int32(n), int32(k)
	cl.lda, cl.ldb, cl.ldc = int32(lda), int32(ldb), int32(ldct)
	cl.transA, cl.transB = 'T', 'T'
	if transB {
		cl.transB = 'N'
	}
	p := func(v unsafe.Pointer) uintptr { return uintptr(v) }
	cl.args = [15]uintptr{p(unsafe.Pointer(&cl.transA)), p(unsafe.Pointer(&cl.transB)),
		p(unsafe.Pointer(&cl.m)), p(unsafe.Pointer(&cl.n)), p(unsafe.Pointer(&cl.k)), p(unsafe.Pointer(&cl.alpha)),
		p(unsafe.Pointer(cl.a)), p(unsafe.Pointer(&cl.lda)), p(unsafe.Pointer(cl.b)), p(unsafe.Pointer(&cl.ldb)),
		p(unsafe.Pointer(&cl.beta)), p(unsafe.Pointer(cl.c)), p(unsafe.Pointer(&cl.ldc)), 1, 1}
	purego.SyscallN(l.sgemm, cl.args[:]...)
	runtime.KeepAlive(a)
	runtime.KeepAlive(b)
	runtime.KeepAlive(ct)
	cl.a, cl.b, cl.c = nil, nil, nil
	calls.Put(cl)
	return nil
}

// mappedFile returns the file mapped at addr in this process (from /proc/self/maps), so a
// library opened by bare name reports where the loader found it; "" when unknown.
func mappedFile(addr uintptr) string {
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		return ""
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		// start-end perms offset dev inode path
		fields := strings.Fields(s.Text())
		if len(fields) < 6 {
			continue
		}
		lo, hi, ok := strings.Cut(fields[0], "-")
		if !ok {
			continue
		}
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 == nil && err2 == nil && uint64(addr) >= start && uint64(addr) < end {
			return strings.Join(fields[5:], " ")
		}
	}
	return ""
}
