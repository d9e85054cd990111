package emu

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"
)

// need skips the test, naming the compiler, where no g++ is found.
func need(t testing.TB) {
	t.Helper()
	if err := Available(); err != nil {
		t.Skipf("no emulated device: %v", err)
	}
}

// load builds and opens src, failing the test on an error.
func load(t testing.TB, src, name string) *Module {
	t.Helper()
	need(t)
	p, err := Build(src, name)
	if err != nil {
		t.Fatal(err)
	}
	m, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// params returns cuLaunchKernel's parameter array over vals: params[i] points at vals[i].
func params(vals []uint64) []unsafe.Pointer {
	p := make([]unsafe.Pointer, len(vals))
	for i := range vals {
		p[i] = unsafe.Pointer(&vals[i])
	}
	return p
}

func ptr[T any](s []T) uint64 { return uint64(uintptr(unsafe.Pointer(&s[0]))) }

// sink keeps the test buffers on the heap: a kernel gets their addresses as plain
// integers, and a buffer on a goroutine's stack would move when the stack grows.
var (
	sinkMu sync.Mutex
	sink   []any
)

// mem returns a zeroed heap buffer of n elements.
func mem[T any](n int) []T {
	s := make([]T, n)
	sinkMu.Lock()
	sink = append(sink, s)
	sinkMu.Unlock()
	return s
}

const testKernels = `
#define RESIN_KERNEL extern "C" __global__
// block_sum: out[block] = sum of x over the block's threads, through shared memory and
// warp shuffles (the prelude's pattern).
__device__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
RESIN_KERNEL void block_sum(float* out, const float* x, int n, long long stride, float scale) {
  __shared__ float part[32];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  float v = i < n ? x[i] * scale : 0.0f;
  v = warp_sum(v);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    v = threadIdx.x < blockDim.x / 32 ? part[threadIdx.x] : 0.0f;
    v = warp_sum(v);
    if (threadIdx.x == 0) out[blockIdx.x * stride] = v;
  }
}
// racy: thread 0 reads what thread 1 writes, with no barrier between.
RESIN_KERNEL void racy(int* out) {
  __shared__ int s[2];
  s[threadIdx.x % 2] = (int)threadIdx.x + 1;
  if (threadIdx.x == 0) out[0] = s[1];
}
// divergent: the two halves of the block wait at different barriers.
RESIN_KERNEL void divergent(int* out) {
  if (threadIdx.x < 32) { __syncthreads(); out[0] = 1; }
  else { __syncthreads(); out[1] = 2; }
}
// early_exit: a thread leaves while the others wait at the barrier.
RESIN_KERNEL void early_exit(int* out) {
  if (threadIdx.x == 5) return;
  __syncthreads();
  out[threadIdx.x] = 1;
}
// half_shuffle: only half a warp reaches a full-mask shuffle.
RESIN_KERNEL void half_shuffle(int* out) {
  int v = threadIdx.x;
  if (threadIdx.x < 16) v = __shfl_xor_sync(0xffffffffu, v, 1);
  out[threadIdx.x] = v;
}
// read_shared reads shared memory it never wrote: the poison.
RESIN_KERNEL void read_shared(unsigned* out) {
  __shared__ unsigned s[4];
  if (threadIdx.x == 0) { out[blockIdx.x] = s[blockIdx.x % 4]; s[blockIdx.x % 4] = 7; }
}
// dyn: dynamic shared memory, reversed through a barrier.
RESIN_KERNEL void dyn(float* out, const float* x) {
  extern __shared__ float buf[];
  buf[threadIdx.x] = x[threadIdx.x];
  __syncthreads();
  out[threadIdx.x] = buf[blockDim.x - 1 - threadIdx.x];
}
// ballot and shuffles up, down and by index, and atomics on shared memory.
RESIN_KERNEL void warp_ops(unsigned* out) {
  __shared__ unsigned count;
  if (threadIdx.x == 0) count = 0;
  __syncthreads();
  unsigned lane = threadIdx.x % 32;
  out[threadIdx.x * 5 + 0] = __ballot_sync(0xffffffffu, lane % 3 == 0);
  out[threadIdx.x * 5 + 1] = __shfl_up_sync(0xffffffffu, lane, 1);
  out[threadIdx.x * 5 + 2] = __shfl_down_sync(0xffffffffu, lane, 2, 16);
  out[threadIdx.x * 5 + 3] = __shfl_sync(0xffffffffu, lane * 10, 7);
  atomicAdd(&count, 1u);
  __syncwarp();
  __syncthreads();
  out[threadIdx.x * 5 + 4] = count;
}
// stack_hog uses n bytes of its stack.
RESIN_KERNEL void stack_hog(int* out, int n) {
  volatile char* b = (volatile char*)__builtin_alloca(n);
  for (int i = 0; i < n; i++) b[i] = 1;
  out[threadIdx.x] = b[n / 2];
}
`

func TestBlockSumAllSchedules(t *testing.T) {
	m := load(t, testKernels, "test_kernels.cu")
	const n, threads = 1000, 128
	blocks := (n + threads - 1) / threads
	x := mem[float32](n)
	for i := range x {
		x[i] = float32(i%17) - 8
	}
	var want []float32
	for b := range blocks {
		var s float32
		for i := b * threads; i < min(n, (b+1)*threads); i++ {
			s += x[i] * 0.5
		}
		want = append(want, s)
	}
	for _, sched := range Schedules {
		out := mem[float32](2 * blocks)
		vals := []uint64{ptr(out), ptr(x), n, 2, uint64(math.Float32bits(0.5))}
		if err := m.Launch("block_sum", [3]uint32{uint32(blocks), 1, 1}, [3]uint32{threads, 1, 1}, 0, params(vals), sched, 7); err != nil {
			t.Fatalf("%v: %v", sched, err)
		}
		for b := range blocks {
			if out[2*b] != want[b] || out[2*b+1] != 0 {
				t.Fatalf("%v: block %d sums to %g, want %g", sched, b, out[2*b], want[b])
			}
		}
	}
}

// TestSchedulesExposeRace: a read of another thread's write with no barrier between gives
// different results under the forward and reverse schedules.
func TestSchedulesExposeRace(t *testing.T) {
	m := load(t, testKernels, "test_kernels.cu")
	got := map[int32]bool{}
	for _, sched := range []Schedule{Forward, Reverse} {
		out := mem[int32](1)
		if err := m.Launch("racy", [3]uint32{1, 1, 1}, [3]uint32{32, 1, 1}, 0, params([]uint64{ptr(out)}), sched, 0); err != nil {
			t.Fatal(err)
		}
		got[out[0]] = true
	}
	if len(got) != 2 {
		t.Errorf("the race read %v under both schedules", got)
	}
}

func TestChecks(t *testing.T) {
	m := load(t, testKernels, "test_kernels.cu")
	out := mem[int32](1024)
	for _, c := range []struct {
		kernel string
		block  uint32
		want   string
	}{
		{"divergent", 64, "one call site"},
		{"early_exit", 64, "exited while 63 wait at __syncthreads"},
		{"half_shuffle", 32, "deadlock: warp 0 waits at a warp operation"},
		{"half_shuffle", 16, "the warp has only 16 threads"},
		{"block_sum", 2048, "more than 1024 threads"},
		{"no_such", 32, "no such kernel"},
	} {
		for _, sched := range Schedules {
			err := m.Launch(c.kernel, [3]uint32{1, 1, 1}, [3]uint32{c.block, 1, 1}, 0, params([]uint64{ptr(out), 1000, 1, 0}), sched, 3)
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), c.kernel) {
				t.Errorf("%s (%d threads, %v): error %v, want one saying %q", c.kernel, c.block, sched, err, c.want)
			}
		}
	}
	// The module still launches after the failures.
	if err := m.Launch("read_shared", [3]uint32{1, 1, 1}, [3]uint32{32, 1, 1}, 0, params([]uint64{ptr(out)}), Forward, 0); err != nil {
		t.Fatal(err)
	}
}

func TestStackCanary(t *testing.T) {
	m := load(t, testKernels, "test_kernels.cu")
	out := mem[int32](32)
	if err := m.Launch("stack_hog", [3]uint32{1, 1, 1}, [3]uint32{32, 1, 1}, 0, params([]uint64{ptr(out), 32 << 10}), Forward, 0); err != nil {
		t.Fatalf("32 KiB of stack: %v", err)
	}
	// 63 KiB reach into the canary at the stack's low end, not past it to the guard page.
	err := m.Launch("stack_hog", [3]uint32{1, 1, 1}, [3]uint32{32, 1, 1}, 0, params([]uint64{ptr(out), 63 << 10}), Forward, 0)
	if err == nil || !strings.Contains(err.Error(), "stack") {
		t.Errorf("63 KiB of stack: error %v, want one about the stack", err)
	}
}

func TestSharedMemoryPoisoned(t *testing.T) {
	m := load(t, testKernels, "test_kernels.cu")
	out := mem[uint32](8)
	if err := m.Launch("read_shared", [3]uint32{8, 1, 1}, [3]uint32{32, 1, 1}, 0, params([]uint64{ptr(out)}), Forward, 0); err != nil {
		t.Fatal(err)
	}
	for b, v := range out {
		if v != 0xffffffff {
			t.Errorf("block %d read %#x from unwritten shared memory, want the poison 0xffffffff", b, v)
		}
	}
}

func TestDynamicSharedAndWarpOps(t *testing.T) {
	m := load(t, testKernels, "test_kernels.cu")
	x := mem[float32](96)
	out := mem[float32](96)
	for i := range x {
		x[i] = float32(i)
	}
	if err := m.Launch("dyn", [3]uint32{1, 1, 1}, [3]uint32{96, 1, 1}, 96*4, params([]uint64{ptr(out), ptr(x)}), Random, 1); err != nil {
		t.Fatal(err)
	}
	for i := range out {
		if out[i] != float32(95-i) {
			t.Fatalf("dyn: out[%d] = %g", i, out[i])
		}
	}
	if err := m.Launch("dyn", [3]uint32{1, 1, 1}, [3]uint32{96, 1, 1}, 1<<20, params([]uint64{ptr(out), ptr(x)}), Forward, 1); err == nil {
		t.Error("1 MiB of dynamic shared memory was accepted")
	}
	// A kernel that declares none may be given some, as on a GPU.
	if err := m.Launch("read_shared", [3]uint32{1, 1, 1}, [3]uint32{32, 1, 1}, 4096, params([]uint64{ptr(out)}), Forward, 1); err != nil {
		t.Errorf("unused dynamic shared memory: %v", err)
	}
	w := mem[uint32](64 * 5)
	if err := m.Launch("warp_ops", [3]uint32{1, 1, 1}, [3]uint32{64, 1, 1}, 0, params([]uint64{ptr(w)}), WarpAhead, 9); err != nil {
		t.Fatal(err)
	}
	var ballot uint32
	for l := uint32(0); l < 32; l += 3 {
		ballot |= 1 << l
	}
	for tid := range uint32(64) {
		lane := tid % 32
		up := lane - 1
		if lane == 0 {
			up = 0
		}
		down := lane + 2
		if lane%16 >= 14 {
			down = lane
		}
		got := w[tid*5 : tid*5+5]
		if got[0] != ballot || got[1] != up || got[2] != down || got[3] != 70 || got[4] != 64 {
			t.Fatalf("thread %d: ballot %#x up %d down %d idx %d count %d; want %#x %d %d 70 64", tid, got[0], got[1], got[2], got[3], got[4], ballot, up, down)
		}
	}
}

func TestStats(t *testing.T) {
	m := load(t, testKernels, "test_kernels.cu")
	before := m.Stats()
	out := mem[float32](4)
	x := mem[float32](256)
	if err := m.Launch("block_sum", [3]uint32{4, 1, 1}, [3]uint32{64, 1, 1}, 0, params([]uint64{ptr(out), ptr(x), 256, 1, 0}), Forward, 0); err != nil {
		t.Fatal(err)
	}
	d := m.Stats().Sub(before)
	// Per block: one barrier; two warps of five shuffles, then warp 0 five more.
	if d.Launches != 1 || d.Blocks != 4 || d.Threads != 256 || d.Barriers != 4 || d.Shuffles != 4*15 {
		t.Errorf("counts %v", d)
	}
	if Stats().Launches < d.Launches {
		t.Errorf("the process-wide counts %v miss the module's", Stats())
	}
}

// TestModulesIsolated: two modules defining the same kernel and the same template static
// (shared memory) keep their own copies, also when launched from several goroutines at once.
func TestModulesIsolated(t *testing.T) {
	src := `
template <class T> __device__ T stage(T v) {
  __shared__ T s[64];
  s[threadIdx.x] = v;
  __syncthreads();
  T r = s[(threadIdx.x + 1) % blockDim.x];
  __syncthreads();
  return r;
}
extern "C" __global__ void rotate(int* out, int k) {
  int v = threadIdx.x * k;
  for (int i = 0; i < 50; i++) v = stage(v);
  out[threadIdx.x] = v;
}
`
	a := load(t, src, "rotate_a.cu")
	b := load(t, src+"// a second module\n", "rotate_b.cu")
	if a == b || a.Path() == b.Path() {
		t.Fatal("two sources gave one module")
	}
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m := a
			if g%2 == 1 {
				m = b
			}
			out := mem[int32](64)
			for range 5 {
				if err := m.Launch("rotate", [3]uint32{3, 1, 1}, [3]uint32{64, 1, 1}, 0, params([]uint64{ptr(out), uint64(g + 1)}), Random, uint64(g)); err != nil {
					errs[g] = err
					return
				}
				for i := range out {
					if want := int32((i + 50) % 64 * (g + 1)); out[i] != want {
						errs[g] = fmt.Errorf("wrong rotation: out[%d] = %d, want %d; %v", i, out[i], want, out)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	for g, err := range errs {
		if err != nil {
			t.Errorf("goroutine %d: %v", g, err)
		}
	}
}

func TestBuildCache(t *testing.T) {
	need(t)
	dir := t.TempDir()
	t.Setenv("RESIN_KERNEL_CACHE", dir)
	src := "extern \"C\" __global__ void one(int* o) { o[0] = 1; }\n"
	p1, err := Build(src, "one.cu")
	if err != nil {
		t.Fatal(err)
	}
	p2, err := Build(src, "one.cu")
	if err != nil || p1 != p2 {
		t.Fatalf("a rebuild gave %s, %v; first %s", p2, err, p1)
	}
	if filepath.Dir(p1) != filepath.Join(dir, "emu") {
		t.Errorf("module %s is not under $RESIN_KERNEL_CACHE/emu", p1)
	}
	if ents, _ := os.ReadDir(filepath.Join(dir, "emu")); len(ents) != 1 {
		t.Errorf("the cache holds %d entries (temporary files left?)", len(ents))
	}
	// A build directory left by a killed build is removed once stale; a fresh one stays.
	stale, fresh := filepath.Join(dir, "emu", "build-1"), filepath.Join(dir, "emu", "build-2")
	os.MkdirAll(stale, 0o755)
	os.MkdirAll(fresh, 0o755)
	old := time.Now().Add(-2 * time.Hour)
	os.Chtimes(stale, old, old)
	if _, err := Build(src+"// another\n", "two.cu"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("a stale build directory was kept: %v", err)
	}
	if _, err := os.Stat(fresh); err != nil {
		t.Errorf("a build directory in use was removed: %v", err)
	}
	if _, err := Build("int x;", "none.cu"); err == nil || !strings.Contains(err.Error(), "no kernel") {
		t.Errorf("a source without kernels: %v", err)
	}
	if _, err := Build("extern \"C\" __global__ void bad(int* o) { o[0] = undefined_name; }", "bad.cu"); err == nil || !strings.Contains(err.Error(), "undefined_name") {
		t.Errorf("a source that does not compile: %v", err)
	}
	t.Setenv("RESIN_CXX", "no-such-compiler-xyz")
	// Available caches its answer for the process; the lookup itself names the compiler.
	if _, err := compilerFor("no-such-compiler-xyz"); err == nil || !errors.Is(err, ErrNoCompiler) || !strings.Contains(err.Error(), "no-such-compiler-xyz") {
		t.Errorf("a missing compiler: %v", err)
	}
}

func TestKernelsFound(t *testing.T) {
	src := `
// RESIN_KERNEL void in_a_comment(
#define RESIN_KERNEL extern "C" __global__
RESIN_KERNEL void a(int x) {}
extern "C" __global__ void b (float* y) {}
static __device__ void not_a_kernel(int) {}
`
	if got := strings.Join(Kernels(src), ","); got != "a,b" {
		t.Errorf("kernels %s, want a,b", got)
	}
}

func TestSanitizerProgram(t *testing.T) {
	need(t)
	if testing.Short() {
		t.Skip("sanitizer build: not in -short")
	}
	prog, err := BuildProgram(testKernels, "test_kernels.cu", true)
	if err != nil {
		if !errors.Is(err, ErrNoSanitizer) {
			t.Fatal(err)
		}
		t.Skipf("no sanitizer build here: %v", err)
	}
	var s Script
	x := make([]byte, 4*100)
	for i := range 100 {
		copy(x[4*i:], f32bytes(1))
	}
	out := s.Buffer(make([]byte, 4))
	in := s.Buffer(x)
	s.Launch("block_sum", [3]uint32{1, 1, 1}, [3]uint32{128, 1, 1}, 0, Random, 1,
		BufferAt(out, 0), BufferAt(in, 0), Value(100), Value(1), Value(uint64(math.Float32bits(1))))
	bufs, err := RunScript(prog, &s)
	if err != nil {
		t.Fatal(err)
	}
	if got := math.Float32frombits(le32(bufs[out])); got != 100 {
		t.Errorf("block_sum under the sanitizers = %g, want 100", got)
	}
	// One element too many: AddressSanitizer reports the read past the buffer.
	var bad Script
	out = bad.Buffer(make([]byte, 4))
	in = bad.Buffer(x)
	bad.Launch("block_sum", [3]uint32{1, 1, 1}, [3]uint32{128, 1, 1}, 0, Forward, 0,
		BufferAt(out, 0), BufferAt(in, 0), Value(101), Value(1), Value(uint64(math.Float32bits(1))))
	if _, err := RunScript(prog, &bad); err == nil || !strings.Contains(err.Error(), "heap-buffer-overflow") {
		t.Errorf("a read past the input: %v", err)
	}
}

func f32bytes(v float32) []byte {
	b := make([]byte, 4)
	u := math.Float32bits(v)
	b[0], b[1], b[2], b[3] = byte(u), byte(u>>8), byte(u>>16), byte(u>>24)
	return b
}

func le32(b []byte) uint32 {
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}

func TestAllSchedules(t *testing.T) {
	m := load(t, testKernels, "test_kernels.cu")
	out := mem[int32](2)
	bufs := [][]byte{unsafe.Slice((*byte)(unsafe.Pointer(&out[0])), 8)}
	err := AllSchedules(bufs, 1, func(s Schedule, seed uint64) error {
		return m.Launch("racy", [3]uint32{1, 1, 1}, [3]uint32{32, 1, 1}, 0, params([]uint64{ptr(out)}), s, seed)
	})
	if err == nil || !strings.Contains(err.Error(), "buffer 0 differs at byte 0") {
		t.Errorf("a race: %v", err)
	}
	in := mem[float32](64)
	sum := mem[float32](1)
	for i := range in {
		in[i] = float32(i)
	}
	bufs = [][]byte{unsafe.Slice((*byte)(unsafe.Pointer(&sum[0])), 4)}
	if err := AllSchedules(bufs, 2, func(s Schedule, seed uint64) error {
		return m.Launch("block_sum", [3]uint32{1, 1, 1}, [3]uint32{64, 1, 1}, 0, params([]uint64{ptr(sum), ptr(in), 64, 1, uint64(math.Float32bits(1))}), s, seed)
	}); err != nil || sum[0] != 64*63/2 {
		t.Errorf("block_sum under every schedule: %g, %v", sum[0], err)
	}
}

func TestPruneKeepsRecent(t *testing.T) {
	dir := t.TempDir()
	base := time.Now().Add(-time.Hour)
	for i := range MaxCached + 5 {
		p := filepath.Join(dir, fmt.Sprintf("m%03d.so", i))
		os.WriteFile(p, nil, 0o644)
		at := base.Add(time.Duration(i) * time.Second)
		os.Chtimes(p, at, at)
	}
	keep := filepath.Join(dir, "m000.so") // the oldest, but just built
	prune(dir, keep)
	ents, _ := os.ReadDir(dir)
	if len(ents) != MaxCached {
		t.Fatalf("%d entries left, want %d", len(ents), MaxCached)
	}
	for _, gone := range []string{"m001.so", "m005.so"} {
		if _, err := os.Stat(filepath.Join(dir, gone)); !os.IsNotExist(err) {
			t.Errorf("%s, among the least recently used, was kept", gone)
		}
	}
	for _, kept := range []string{"m000.so", "m006.so", fmt.Sprintf("m%03d.so", MaxCached+4)} {
		if _, err := os.Stat(filepath.Join(dir, kept)); err != nil {
			t.Errorf("%s was removed: %v", kept, err)
		}
	}
}

func TestReport(t *testing.T) {
	path := filepath.Join(t.TempDir(), "summary")
	t.Setenv("RESIN_EMU_SUMMARY", path)
	if err := Report("one\n"); err != nil {
		t.Fatal(err)
	}
	if err := Report("two"); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); string(b) != "one\ntwo\n" {
		t.Errorf("summary %q", b)
	}
	t.Setenv("RESIN_EMU_SUMMARY", "")
	if err := Report("nowhere"); err != nil {
		t.Errorf("unset: %v", err)
	}
}

// TestUcontextFallback runs the checks' kernels with fibers switched by swapcontext, the
// path of hosts that are neither x86-64 nor arm64.
func TestUcontextFallback(t *testing.T) {
	need(t)
	extraFlags = []string{"-DRESIN_EMU_FORCE_UCONTEXT"}
	m := func() *Module {
		defer func() { extraFlags = nil }()
		return load(t, testKernels, "test_kernels_ucontext.cu")
	}()
	out, x := mem[float32](2), mem[float32](100)
	for i := range x {
		x[i] = 1
	}
	for _, sched := range Schedules {
		if err := m.Launch("block_sum", [3]uint32{1, 1, 1}, [3]uint32{128, 1, 1}, 0, params([]uint64{ptr(out), ptr(x), 100, 1, uint64(math.Float32bits(1))}), sched, 1); err != nil || out[0] != 100 {
			t.Fatalf("%v: %g, %v", sched, out[0], err)
		}
	}
	bad := mem[int32](64)
	if err := m.Launch("divergent", [3]uint32{1, 1, 1}, [3]uint32{64, 1, 1}, 0, params([]uint64{ptr(bad)}), Forward, 0); err == nil || !strings.Contains(err.Error(), "one call site") {
		t.Errorf("divergent barriers: %v", err)
	}
}

func TestParamSizes(t *testing.T) {
	m := load(t, testKernels, "test_kernels.cu")
	got, err := m.ParamSizes("block_sum") // (float*, const float*, int, long long, float)
	if err != nil || fmt.Sprint(got) != "[8 8 4 8 4]" {
		t.Errorf("block_sum's parameter sizes %v, %v", got, err)
	}
	if _, err := m.ParamSizes("nope"); err == nil {
		t.Error("a missing kernel has sizes")
	}
}

// TestPruneCountsOnlyModules: the prune counts module builds, programs and images against
// the limit, never the emulator's library (the oldest here, as a library reused without a
// touch was), a file this process built or found, or one used since it started; another
// toolchain's library unused for a week goes, and so does a killed build's leftover.
func TestPruneCountsOnlyModules(t *testing.T) {
	dir := t.TempDir()
	defer func(n int) { maxCached = n }(maxCached)
	maxCached = 2
	old := time.Now().Add(-2 * time.Hour)
	files := []struct {
		name string
		age  time.Duration
	}{
		{"libresin-emu-current.so", 0}, {"libresin-emu-stale.so", -8 * 24 * time.Hour},
		{"inuse-0.so", 1}, {"image-a.so", 2}, {"m-b.so", 3}, {"image-c.so", 4},
		{"m-d.so", 5}, {"p-e.bin", 6}, {"image-f.so.tmp-XYZ", 0},
	}
	for _, f := range files {
		p := filepath.Join(dir, f.name)
		os.WriteFile(p, nil, 0o644)
		at := old.Add(f.age * time.Second)
		if f.age < 0 {
			at = old.Add(f.age)
		}
		os.Chtimes(p, at, at)
	}
	inUse.Store(filepath.Join(dir, "inuse-0.so"), true)
	defer inUse.Delete(filepath.Join(dir, "inuse-0.so"))
	keep := filepath.Join(dir, "m-new.so")
	os.WriteFile(keep, nil, 0o644)
	os.WriteFile(filepath.Join(dir, "image-now.so"), nil, 0o644) // loaded since this process began
	prune(dir, keep)
	var left []string
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		left = append(left, e.Name())
	}
	want := []string{"image-now.so", "inuse-0.so", "libresin-emu-current.so", "m-new.so"} // 8 counted, limit 2: all 5 others gone, the limit exceeded
	if strings.Join(left, " ") != strings.Join(want, " ") {
		t.Errorf("left %v, want %v", left, want)
	}
}

// TestRunScriptTimeout: a program whose kernel never ends is killed at ScriptTimeout and
// RunScript says so.
func TestRunScriptTimeout(t *testing.T) {
	need(t)
	prog, err := BuildProgram(`
extern "C" __global__ void spin(volatile int* flag) {
  while (*flag == 0) {
  }
}
`, "spin.cu", false)
	if err != nil {
		t.Fatal(err)
	}
	defer func(d time.Duration) { ScriptTimeout = d }(ScriptTimeout)
	ScriptTimeout = time.Second
	var s Script
	flag := s.Buffer(make([]byte, 4))
	s.Launch("spin", [3]uint32{1, 1, 1}, [3]uint32{1, 1, 1}, 0, Forward, 0, BufferAt(flag, 0))
	if _, err := RunScript(prog, &s); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a kernel that never ends: %v, want a timeout", err)
	}
}
