package cudart

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"unsafe"

	"github.com/ebitengine/purego"
)

func TestAlignment(t *testing.T) {
	for p, want := range map[DevicePtr]int{0: 256, 0x7f0000000000: 256, 0x1000: 256, 0x1080: 128, 0x1010: 16, 0x1002: 2, 0x1001: 1, 0x1008: 8} {
		if got := Alignment(p); got != want {
			t.Errorf("Alignment(%#x) = %d, want %d", uintptr(p), got, want)
		}
	}
}

func TestGemmKeyAndLayouts(t *testing.T) {
	// x[m=3, k=8] · w[n=5, k=8]ᵀ, the MatMulT case: w fills cuBLASLt's "A" slot.
	g := GemmSpec{M: 3, N: 5, K: 8, TransB: true, AType: BF16, BType: BF16, OutType: F32, Alpha: 1}
	k := g.key(0x1002, 0x1100, 0x1040, 0x1040)
	want := gemmKey{m: 3, n: 5, k: 8, transB: true, a: BF16, b: BF16, out: F32, alignA: 256, alignB: 2, alignC: 64, alignD: 64}
	if k != want {
		t.Fatalf("key = %+v\nwant  %+v", k, want)
	}
	opA, opB, la, lb, lc := k.layouts()
	if opA != opT || opB != opN || la != (layout{8, 5, 8}) || lb != (layout{8, 3, 8}) || lc != (layout{5, 3, 5}) {
		t.Fatalf("x·wᵀ layouts: ops %d %d, %v %v %v", opA, opB, la, lb, lc)
	}
	// A stored [k, m] and B stored [k, n]: both column-major views are used as they are
	// for B, transposed for A.
	k = GemmSpec{M: 3, N: 5, K: 8, TransA: true, AType: F32, BType: F32, OutType: F32}.key(0, 0, 0, 0)
	opA, opB, la, lb, lc = k.layouts()
	if opA != opN || opB != opT || la != (layout{5, 8, 5}) || lb != (layout{3, 8, 3}) || lc != (layout{5, 3, 5}) {
		t.Fatalf("aᵀ·b layouts: ops %d %d, %v %v %v", opA, opB, la, lb, lc)
	}
	// Every field of the key tells plans apart.
	base := GemmSpec{M: 4, N: 4, K: 4, AType: BF16, BType: BF16, OutType: BF16}
	seen := map[gemmKey]string{}
	for name, k := range map[string]gemmKey{
		"base":      base.key(0x1000, 0x2000, 0x3000, 0x3000),
		"m":         GemmSpec{M: 5, N: 4, K: 4, AType: BF16, BType: BF16, OutType: BF16}.key(0x1000, 0x2000, 0x3000, 0x3000),
		"transA":    GemmSpec{M: 4, N: 4, K: 4, TransA: true, AType: BF16, BType: BF16, OutType: BF16}.key(0x1000, 0x2000, 0x3000, 0x3000),
		"out f32":   GemmSpec{M: 4, N: 4, K: 4, AType: BF16, BType: BF16, OutType: F32}.key(0x1000, 0x2000, 0x3000, 0x3000),
		"a aligned": base.key(0x1008, 0x2000, 0x3000, 0x3000),
		"d aligned": base.key(0x1000, 0x2000, 0x3000, 0x3004),
	} {
		if other, dup := seen[k]; dup {
			t.Errorf("%s and %s share a plan key", name, other)
		}
		seen[k] = name
	}
}

func TestGemmSpecCheck(t *testing.T) {
	ok := GemmSpec{M: 1, N: 1, K: 1, AType: BF16, BType: BF16, OutType: F32}
	if err := ok.check(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		g    GemmSpec
		want string
	}{
		{GemmSpec{M: 0, N: 1, K: 1, AType: BF16, BType: BF16, OutType: BF16}, "positive"},
		{GemmSpec{M: 1, N: 1, K: 1, AType: BF16, BType: F16, OutType: BF16}, "one element type"},
		{GemmSpec{M: 1, N: 1, K: 1, AType: BF16, BType: BF16, OutType: F16}, "must be bf16 or f32"},
		{GemmSpec{M: 1, N: 1, K: 1, AType: DType(9), BType: DType(9), OutType: F32}, "unknown element type"},
	} {
		if err := c.g.check(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: err %v, want %q", c.g, err, c.want)
		}
	}
}

// fakeBlas is a Blas over a fake cuBLASLt: descriptor calls count handles, the heuristic
// returns one algorithm, and cublasLtMatmul itself is libc's sched_yield (returns 0).
type fakeBlas struct {
	created, destroyed int
	prefs              []string // "attr=value" set on preferences
	failPref           int32    // a preference attribute to refuse, 0 for none
	next               uintptr
}

func newFakeBlas(t testing.TB, f *fakeBlas, maxPlans int) (*Blas, *Ctx) {
	t.Helper()
	h, err := purego.Dlopen(libcPath(t), purego.RTLD_NOW)
	if err != nil {
		t.Skip(err)
	}
	sym, err := purego.Dlsym(h, "sched_yield")
	if err != nil {
		t.Skip(err)
	}
	handle := func(p *uintptr) int32 { f.next++; *p = f.next; f.created++; return 0 }
	release := func(uintptr) int32 { f.destroyed++; return 0 }
	api := &cublasLtAPI{
		matmul:                    sym,
		cublasLtMatmulDescCreate:  func(d *uintptr, compute, scale int32) int32 { return handle(d) },
		cublasLtMatmulDescDestroy: release,
		cublasLtMatmulDescSetAttribute: func(d uintptr, attr int32, buf unsafe.Pointer, size uint64) int32 {
			return 0
		},
		cublasLtMatrixLayoutCreate: func(l *uintptr, dtype int32, rows, cols uint64, ld int64) int32 {
			return handle(l)
		},
		cublasLtMatrixLayoutDestroy:     release,
		cublasLtMatmulPreferenceCreate:  func(p *uintptr) int32 { *p = 1; return 0 },
		cublasLtMatmulPreferenceDestroy: func(uintptr) int32 { return 0 },
		cublasLtMatmulPreferenceSetAttribute: func(p uintptr, attr int32, buf unsafe.Pointer, size uint64) int32 {
			if attr == f.failPref {
				return 7 // CUBLAS_STATUS_INVALID_VALUE
			}
			v := uint64(*(*uint32)(buf))
			if size == 8 {
				v = *(*uint64)(buf)
			}
			f.prefs = append(f.prefs, fmt.Sprintf("%d=%d", attr, v))
			return 0
		},
		cublasLtMatmulAlgoGetHeuristic: func(h, op, a, b, c, d, pref uintptr, requested int32, results unsafe.Pointer, count *int32) int32 {
			*(*uint64)(unsafe.Add(results, 64)) = 4096 // workspaceSize
			*count = 1
			return 0
		},
	}
	dev := &Device{}
	b := &Blas{dev: dev, api: api, h: 0x99, ws: Buffer{Ptr: 0x7000000, Size: 1 << 20}, plans: newLRU[gemmKey, *gemmPlan](maxPlans)}
	return b, &Ctx{dev: dev}
}

func TestGemmPlanCache(t *testing.T) {
	f := &fakeBlas{}
	b, c := newFakeBlas(t, f, 2)
	s := &Stream{h: 5}
	g := GemmSpec{M: 16, N: 64, K: 32, TransB: true, AType: BF16, BType: BF16, OutType: BF16, Alpha: 1}
	x, w, out := DevicePtr(0x10000), DevicePtr(0x20000), DevicePtr(0x30010)
	if err := b.Gemm(c, s, g, x, w, 0, out); err != nil {
		t.Fatal(err)
	}
	// Workspace, then the alignments of the A..D slots: w (256), x (256), out as C and D (16).
	want := "1=1048576 5=256 6=256 7=16 8=16"
	if got := strings.Join(f.prefs, " "); got != want {
		t.Fatalf("preferences %q, want %q", got, want)
	}
	if f.created != 5 { // the matmul descriptor and four layouts
		t.Fatalf("%d descriptors created for one plan, want 5", f.created)
	}
	// The arguments handed to cublasLtMatmul: our w in its A slot, x in its B slot.
	p, _ := b.plans.get(g.key(x, w, out, out))
	if b.call[3] != uintptr(w) || b.call[5] != uintptr(x) || b.call[8] != uintptr(out) || b.call[10] != uintptr(out) ||
		b.call[14] != 4096 || b.call[15] != 5 || b.call[1] != p.op {
		t.Fatalf("cublasLtMatmul arguments %#x", b.call)
	}
	if b.call[2] != uintptr(unsafe.Pointer(&b.alpha)) || b.call[7] != uintptr(unsafe.Pointer(&b.beta)) || b.alpha != 1 || b.beta != 0 {
		t.Fatal("alpha and beta do not point at 1 and 0")
	}
	// Same shape and alignment: a hit, allocation-free.
	n := testing.AllocsPerRun(200, func() {
		if err := b.Gemm(c, s, g, x, w, 0, out); err != nil {
			t.Fatal(err)
		}
	})
	if n != 0 {
		t.Fatalf("a cached GEMM allocates %v times", n)
	}
	if hits, misses, _ := b.PlanStats(); misses != 1 || hits < 200 {
		t.Fatalf("hits %d misses %d", hits, misses)
	}
	// A less aligned output needs its own plan; a third plan evicts the least recent one
	// and releases its five descriptors.
	if err := b.Gemm(c, s, g, x, w, 0, out+2); err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(strings.Join(f.prefs, " "), "7=2 8=2") {
		t.Fatalf("odd output: preferences %q", f.prefs)
	}
	g2 := g
	g2.OutType, g2.Beta = F32, 1
	if err := b.Gemm(c, s, g2, x, w, 0x40000, 0x40000); err != nil {
		t.Fatal(err)
	}
	if _, misses, ev := b.PlanStats(); misses != 3 || ev != 1 || f.destroyed != 5 || b.plans.len() != 2 {
		t.Fatalf("misses %d evictions %d destroyed %d plans %d", misses, ev, f.destroyed, b.plans.len())
	}
	if _, ok := b.plans.get(g.key(x, w, out, out)); ok {
		t.Fatal("the least recently used plan was kept")
	}
}

// TestGemmAttributeError refuses an alignment preference and checks the error names it and
// every descriptor made so far is released, with nothing cached.
func TestGemmAttributeError(t *testing.T) {
	f := &fakeBlas{failPref: prefMinAlignA + 2}
	b, c := newFakeBlas(t, f, 4)
	g := GemmSpec{M: 2, N: 2, K: 2, AType: BF16, BType: BF16, OutType: BF16, Alpha: 1}
	err := b.Gemm(c, &Stream{h: 1}, g, 0x1000, 0x2000, 0, 0x3000)
	var e *Error
	if !errors.As(err, &e) || e.Name != "CUBLAS_STATUS_INVALID_VALUE" || !strings.Contains(err.Error(), "alignment preference of C") {
		t.Fatalf("err = %v", err)
	}
	if f.created != f.destroyed || b.plans.len() != 0 {
		t.Fatalf("created %d destroyed %d, %d plans cached", f.created, f.destroyed, b.plans.len())
	}
	if err := b.Gemm(&Ctx{dev: &Device{}}, nil, g, 0x1000, 0x2000, 0, 0x3000); err == nil {
		t.Fatal("a GEMM through another device's context was accepted")
	}
}

func BenchmarkGemmHostSide(b *testing.B) {
	f := &fakeBlas{}
	bl, c := newFakeBlas(b, f, 16)
	s := &Stream{h: 5}
	g := GemmSpec{M: 16, N: 4096, K: 4096, TransB: true, AType: BF16, BType: BF16, OutType: BF16, Alpha: 1}
	b.ReportAllocs()
	for b.Loop() {
		bl.Gemm(c, s, g, 0x10000, 0x20000, 0, 0x30000)
	}
}
