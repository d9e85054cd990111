package ref

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	cblas "github.com/resin-llm/resin/core/blas"
)

// countTask counts how often each item runs and checks every participant number is in
// range and held by one participant at a time.
type countTask struct {
	hits  []atomic.Int32
	busy  []atomic.Int32
	bad   atomic.Int32
	inner func()
}

func (c *countTask) run(part, lo, hi int) {
	if part < 0 || part >= parts() || c.busy[part].Add(1) != 1 {
		c.bad.Add(1)
	}
	for i := lo; i < hi; i++ {
		c.hits[i].Add(1)
	}
	if c.inner != nil {
		c.inner()
	}
	if part >= 0 && part < parts() {
		c.busy[part].Add(-1)
	}
}

func newCountTask(n int) *countTask {
	return &countTask{hits: make([]atomic.Int32, n), busy: make([]atomic.Int32, parts())}
}

func (c *countTask) check(t *testing.T) {
	t.Helper()
	if c.bad.Load() != 0 {
		t.Errorf("%d chunks ran with a participant number out of range or held twice", c.bad.Load())
	}
	for i := range c.hits {
		if n := c.hits[i].Load(); n != 1 {
			t.Fatalf("item %d ran %d times, want once", i, n)
		}
	}
}

func TestParallelForRunsEveryItemOnce(t *testing.T) {
	for _, tc := range []struct{ n, grain int }{{0, 1}, {1, 1}, {7, 3}, {100, 1}, {1000, 7}, {5, 0}} {
		c := newCountTask(tc.n)
		var l loop
		parallelFor(&l, c, tc.n, tc.grain)
		c.check(t)
	}
}

// TestParallelForNestedAndConcurrent: loops started from inside a loop and from several
// goroutines at once all finish (the caller never waits for a worker that did not join).
func TestParallelForNestedAndConcurrent(t *testing.T) {
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			inner := make([]*countTask, 0)
			var mu sync.Mutex
			outer := newCountTask(50 + g)
			outer.inner = func() {
				c := newCountTask(20)
				var l loop
				parallelFor(&l, c, 20, 1)
				mu.Lock()
				inner = append(inner, c)
				mu.Unlock()
			}
			var l loop
			parallelFor(&l, outer, 50+g, 2)
			outer.check(t)
			for _, c := range inner {
				c.check(t)
			}
		})
	}
	wg.Wait()
}

// TestSiLUMulParallelRows: a SiLUMul large enough to split across the pool gives exactly
// the serial formula's values, and neither a split one nor a decode step's allocates.
func TestSiLUMulParallelRows(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	for _, shape := range []struct{ rows, dim int }{{3, 5}, {97, 1000}, {512, 352}, {minParallelElems, 1}} {
		gateUp := randSlice(r, shape.rows*2*shape.dim)
		out := make([]float32, shape.rows*shape.dim)
		if err := SiLUMul(out, gateUp, shape.rows, shape.dim); err != nil {
			t.Fatal(err)
		}
		for row := range shape.rows {
			for i := range shape.dim {
				gu := gateUp[row*2*shape.dim:]
				if want := SiLU(gu[i]) * gu[shape.dim+i]; out[row*shape.dim+i] != want {
					t.Fatalf("%v: out[%d, %d] = %g, want %g", shape, row, i, out[row*shape.dim+i], want)
				}
			}
		}
	}
	for _, rows := range []int{8, 512} { // serial, split
		gateUp, out := randSlice(r, rows*2*2816), make([]float32, rows*2816)
		_ = SiLUMul(out, gateUp, rows, 2816)
		if n := testing.AllocsPerRun(10, func() { _ = SiLUMul(out, gateUp, rows, 2816) }); n != 0 {
			t.Errorf("SiLUMul of %d rows allocates %.1f times", rows, n)
		}
	}
}

// TestBLASGemmSplits checks products the pool splits on the BLAS (blocks of columns; of
// rows too for a narrow product; a decode row's sgemv in blocks) against the exact
// product, and that a split product allocates nothing.
func TestBLASGemmSplits(t *testing.T) {
	lib := cblas.Default()
	if lib == nil {
		t.Skipf("no BLAS library: %s", cblas.Info().Fallback)
	}
	if lib.ThreadsSet() > 1 {
		t.Skipf("RESIN_BLAS_THREADS=%d: the library's threads run each GEMM whole", lib.ThreadsSet())
	}
	if parts() == 1 {
		t.Log("GOMAXPROCS=1: nothing to split across; the products run whole")
	}
	rng := rand.New(rand.NewPCG(5, 6))
	for _, s := range [][3]int{{1, 512, 4000}, {600, 64, 48}, {8, 1024, 1000}, {300, 300, 1030}} {
		m, k, n := s[0], s[1], s[2]
		for _, transB := range []bool{false, true} {
			a, b, exact, scale := gemmOperands(rng, transB, m, k, n)
			got := nanFilled(m * n)
			if err := blasGemm(lib, transB, got, a, b, m, k, n); err != nil {
				t.Fatal(err)
			}
			checkProduct(t, fmt.Sprintf("blasGemm transB=%v m=%d k=%d n=%d", transB, m, k, n), got, exact, scale, k)
		}
	}
	for _, m := range []int{8, 512} { // transposed output; blocks of columns
		k, n := 1024, 1024
		x, w, out := make([]float32, m*k), make([]float32, n*k), make([]float32, m*n)
		if a := testing.AllocsPerRun(20, func() {
			if err := blasGemm(lib, true, out, x, w, m, k, n); err != nil {
				t.Fatal(err)
			}
		}); a != 0 {
			t.Errorf("m=%d: %v allocations per split blasGemm", m, a)
		}
	}
}

// TestSkinnyGemm checks MatMulT's products of 2 to 8 rows (the AVX2 kernel, split across
// the pool when large; a BLAS or gonum where the CPU has no AVX2) against the exact
// product: odd and single columns, inner dimensions a multiple of 8 and not, rows of w
// in one run and in several; and that a decode batch's product allocates nothing.
func TestSkinnyGemm(t *testing.T) {
	t.Run("avx512-if-present", testSkinnyGemm)
	if hasSkinnyAVX512 {
		hasSkinnyAVX512 = false
		defer func() { hasSkinnyAVX512 = true }()
		t.Run("avx2", testSkinnyGemm)
	}
}

func testSkinnyGemm(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for _, m := range []int{2, 3, 4, 5, 7, 8} {
		for _, s := range [][2]int{{64, 64}, {64, 65}, {72, 1}, {1024, 301}, {2816, 1030}, {100, 80}} {
			k, n := s[0], s[1]
			a, b, exact, scale := gemmOperands(rng, true, m, k, n)
			got := nanFilled(m * n)
			if err := MatMulT(got, a, b, m, k, n); err != nil {
				t.Fatal(err)
			}
			checkProduct(t, fmt.Sprintf("MatMulT m=%d k=%d n=%d (vector: %v)", m, k, n, skinnyVector(k) && k*n >= minBLASWeight), got, exact, scale, k)
		}
	}
	m, k, n := 4, 1024, 2816
	x, w, out := make([]float32, m*k), make([]float32, n*k), make([]float32, m*n)
	_ = MatMulT(out, x, w, m, k, n)
	if a := testing.AllocsPerRun(20, func() { _ = MatMulT(out, x, w, m, k, n) }); a != 0 {
		t.Errorf("%v allocations per MatMulT of %d rows", a, m)
	}
}

// TestParallelRange runs every item once, with participant numbers in range and each held
// by one participant at a time.
func TestParallelRange(t *testing.T) {
	c := newCountTask(1000)
	ParallelRange(1000, 7, c.run)
	c.check(t)
	ParallelRange(0, 1, func(int, int, int) { t.Fatal("ran on an empty range") })
}

// TestParallelRangeAllocatesNothing: with a func made once (a model keeps it in its
// scratch), a ParallelRange call allocates nothing, so a model's steady-state forward
// can stay allocation-free around it.
func TestParallelRangeAllocatesNothing(t *testing.T) {
	var sum [64]int64
	fn := func(part, lo, hi int) {
		for i := lo; i < hi; i++ {
			sum[i%64]++
		}
	}
	ParallelRange(64, 1, fn) // start the pool
	if n := testing.AllocsPerRun(100, func() { ParallelRange(64, 1, fn) }); n != 0 {
		t.Fatalf("ParallelRange allocates %v times a call", n)
	}
}

// BenchmarkParallelForDispatch measures what the pool costs a batch-1 decode, which runs
// some 40 parallel loops a token (each GEMV and each layer's attention): "empty" is a loop
// of two chunks that do nothing (the caller usually claims both before a worker wakes),
// beside the same loop on the caller alone; "join" is a loop of 64 chunks of about a
// microsecond each, as a GEMV is cut, and reports how long after the loop opens a worker
// runs its first chunk (join-µs: the wake-up latency, during which the caller works
// alone) and in what share of the loops a worker joins at all. CPU time per loop is the
// process's.
func BenchmarkParallelForDispatch(b *testing.B) {
	var done atomic.Int64
	empty := func(_, lo, hi int) { done.Add(int64(hi - lo)) }
	for _, c := range []struct {
		name  string
		grain int
	}{{"empty-caller-only", 2}, {"empty", 1}} {
		b.Run(c.name, func(b *testing.B) {
			ParallelRange(2, c.grain, empty)
			cpu0 := processCPU()
			b.ResetTimer()
			for range b.N {
				ParallelRange(2, c.grain, empty)
			}
			b.StopTimer()
			if cpu := processCPU() - cpu0; cpu > 0 {
				b.ReportMetric(float64(cpu.Nanoseconds())/1e3/float64(b.N), "cpu-µs/op")
			}
		})
	}
	b.Run("join", func(b *testing.B) {
		if Parts() < 2 {
			b.Skip("GOMAXPROCS 1: no worker")
		}
		var start, first atomic.Int64 // UnixNano of the loop's start, then of a worker's first chunk
		var sink atomic.Uint64
		work := func(part, _, _ int) {
			if part != 0 {
				first.CompareAndSwap(0, time.Now().UnixNano())
			}
			x := uint64(part)
			for i := range 300 { // about a microsecond
				x = x*6364136223846793005 + uint64(i)
			}
			sink.Add(x)
		}
		var waited time.Duration
		joined := 0
		cpu0 := processCPU()
		b.ResetTimer()
		for range b.N {
			first.Store(0)
			start.Store(time.Now().UnixNano())
			ParallelRange(64, 1, work)
			if f := first.Load(); f != 0 {
				waited += time.Duration(f - start.Load())
				joined++
			}
		}
		b.StopTimer()
		if cpu := processCPU() - cpu0; cpu > 0 {
			b.ReportMetric(float64(cpu.Nanoseconds())/1e3/float64(b.N), "cpu-µs/op")
		}
		if joined > 0 {
			b.ReportMetric(float64(waited.Nanoseconds())/1e3/float64(joined), "join-µs")
		}
		b.ReportMetric(100*float64(joined)/float64(b.N), "joined-%")
	})
}

// partsTask records which participants ran a chunk, each chunk taking about 20µs so
// that an idle worker has time to join.
type partsTask struct{ ran []atomic.Int32 }

func (p *partsTask) run(part, lo, hi int) {
	p.ran[part].Add(1)
	for t0 := time.Now(); time.Since(t0) < 20*time.Microsecond; {
	}
}

// TestPoolSpin: with a long spin an idle worker polls for the next loop instead of
// sleeping, so loops run back to back never put a worker to sleep and the workers join
// them; with no spin a worker sleeps after its loop. (SetPoolSpin's claim; the speed it
// buys is BenchmarkParallelForDispatch's and the decode benchmarks'.)
func TestPoolSpin(t *testing.T) {
	if parts() < 2 {
		t.Skip("GOMAXPROCS 1: the pool has no workers")
	}
	defer SetPoolSpin(SetPoolSpin(time.Hour))
	var l loop
	run := func() *partsTask {
		p := &partsTask{ran: make([]atomic.Int32, parts())}
		parallelFor(&l, p, 64, 1)
		return p
	}
	run() // wakes the workers; from here they spin
	sleeps := pool.sleeps.Load()
	joined := 0
	for range 20 {
		p := run()
		for part := 1; part < len(p.ran); part++ {
			if p.ran[part].Load() > 0 {
				joined++
				break
			}
		}
	}
	if d := pool.sleeps.Load() - sleeps; d != 0 {
		t.Errorf("workers went to sleep %d times between loops under an hour's spin", d)
	}
	if joined == 0 {
		t.Errorf("no worker joined any of 20 loops")
	}
	SetPoolSpin(0)
	sleeps = pool.sleeps.Load()
	run()
	for deadline := time.Now().Add(10 * time.Second); pool.sleeps.Load() == sleeps; {
		if time.Now().After(deadline) {
			t.Fatal("with no spin no worker went to sleep within 10 s of its loop")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestParsePoolSpin: RESIN_POOL_SPIN's values, and the refusals doctor prints.
func TestParsePoolSpin(t *testing.T) {
	for _, tc := range []struct {
		v    string
		set  bool
		want time.Duration
		says string
	}{
		{"", false, defaultPoolSpin, "the default"},
		{"250us", true, 250 * time.Microsecond, "RESIN_POOL_SPIN=250us"},
		{"0", true, 0, "RESIN_POOL_SPIN=0"},
		{"-1ms", true, 0, "negative"},
		{"1h", true, maxEnvPoolSpin, "above the 10ms cap"},
		{"fast", true, defaultPoolSpin, `"fast" is not a Go duration`},
	} {
		d, says := parsePoolSpin(tc.v, tc.set)
		if d != tc.want || !strings.Contains(says, tc.says) {
			t.Errorf("RESIN_POOL_SPIN=%q (set %v): %v, %q; want %v and %q", tc.v, tc.set, d, says, tc.want, tc.says)
		}
	}
}
