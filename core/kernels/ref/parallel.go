package ref

import (
	"cmp"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	cblas "github.com/resin-llm/resin/core/blas"
)

// The package's worker pool: GOMAXPROCS-1 goroutines, started on first use, that help the
// calling goroutine through a parallel loop. A loop is open from its start until the
// caller has no chunk left to claim; a worker that is idle at any moment while a loop is
// open, or becomes idle then, joins it and claims chunks beside the caller. The caller
// always works too, so a loop ends even when every worker is busy elsewhere (a nested
// loop, or another model's), and it waits only for the workers that joined. Starting a
// loop allocates nothing.
//
// Joining late matters: a worker that has just finished the previous loop is not yet
// waiting when the caller starts the next one microseconds later, and a loop cut into one
// chunk per participant (blasGemm's blocks) would otherwise run whole on the caller.

// task is a parallel loop's body: run processes items [lo, hi) as participant part, a
// number in [0, parts) no other participant of the same loop holds at the same time.
type task interface {
	run(part, lo, hi int)
}

// loop is one parallelFor call: its body, how its items are split and who still works on it.
type loop struct {
	t        task
	n, grain int
	next     atomic.Int64
	// Guarded by pool.mu:
	joined int          // participant numbers handed out (the caller's 0 included)
	active atomic.Int32 // workers inside work (changed under pool.mu; the caller polls it)
	closed bool         // the caller found nothing left to claim: no worker joins any more
	done   sync.Cond    // signalled when the last active worker leaves a closed loop
}

var (
	poolOnce    sync.Once
	poolWorkers int
	pool        struct {
		mu   sync.Mutex
		wake sync.Cond // signalled when a loop opens
		open []*loop   // loops that may have chunks left, newest last
		// opened counts the loops opened (a polling worker watches it); sleeps, the times a
		// worker went to sleep on wake.
		opened, sleeps atomic.Uint64
	}
)

// workers returns the number of helper goroutines, starting them on the first call.
func workers() int {
	poolOnce.Do(func() {
		poolWorkers = runtime.GOMAXPROCS(0) - 1
		pool.wake.L = &pool.mu
		for range poolWorkers {
			go worker()
		}
	})
	return poolWorkers
}

// worker joins open loops, newest first, for as long as the process runs. Idle, it polls
// for the next loop for up to the pool's spin (SetPoolSpin) before it sleeps.
func worker() {
	pool.mu.Lock()
	for {
		if len(pool.open) == 0 {
			gen := pool.opened.Load()
			pool.mu.Unlock()
			opened := spin(func() bool { return pool.opened.Load() != gen })
			pool.mu.Lock()
			if !opened && len(pool.open) == 0 {
				pool.sleeps.Add(1)
				pool.wake.Wait()
			}
			continue
		}
		l := pool.open[len(pool.open)-1]
		if l.next.Load() >= int64(l.n) { // every chunk claimed: nothing to join
			pool.open = pool.open[:len(pool.open)-1]
			continue
		}
		part := l.joined
		l.joined++
		l.active.Add(1)
		pool.mu.Unlock()
		l.work(part)
		pool.mu.Lock()
		if l.active.Add(-1) == 0 && l.closed {
			l.done.Signal()
		}
	}
}

// parts is the most participants a loop can have: the caller and every worker.
func parts() int { return workers() + 1 }

// work claims chunks of grain items until none is left.
func (l *loop) work(part int) {
	for {
		lo := int(l.next.Add(int64(l.grain))) - l.grain
		if lo >= l.n {
			return
		}
		l.t.run(part, lo, min(lo+l.grain, l.n))
	}
}

// parallelFor runs t over items [0, n) in chunks of grain items, on the caller and the
// workers that are or become idle while chunks are left, and returns when every item is
// done. l is the caller's, reused across calls.
func parallelFor(l *loop, t task, n, grain int) {
	if n <= 0 {
		return
	}
	grain = max(grain, 1)
	l.t, l.n, l.grain = t, n, grain
	l.next.Store(0)
	chunks := (n + grain - 1) / grain
	helpers := min(workers(), chunks-1)
	if helpers <= 0 {
		l.work(0)
		l.t = nil
		return
	}
	pool.mu.Lock()
	l.joined, l.closed = 1, false
	l.active.Store(0)
	l.done.L = &pool.mu
	pool.open = append(pool.open, l)
	pool.opened.Add(1)
	pool.mu.Unlock()
	for range helpers {
		pool.wake.Signal()
	}
	l.work(0)
	pool.mu.Lock()
	l.closed = true
	for i, o := range pool.open { // a worker may have dropped it already
		if o == l {
			pool.open = append(pool.open[:i], pool.open[i+1:]...)
			break
		}
	}
	if l.active.Load() > 0 { // the workers that joined finish their last chunks
		pool.mu.Unlock()
		spin(func() bool { return l.active.Load() == 0 })
		pool.mu.Lock()
	}
	for l.active.Load() > 0 {
		l.done.Wait()
	}
	pool.mu.Unlock()
	l.t = nil
}

// defaultPoolSpin is the pool's spin where RESIN_POOL_SPIN is unset (SetPoolSpin).
const defaultPoolSpin = 100 * time.Microsecond

// maxEnvPoolSpin is the longest spin RESIN_POOL_SPIN sets.
const maxEnvPoolSpin = 10 * time.Millisecond

// SetPoolSpin sets how long the worker pool's goroutines poll before they sleep (negative:
// 0, sleep at once) and returns the previous value: an idle worker polls for the next
// loop, a loop's caller for the workers still on its last chunks. Waking a sleeping
// goroutine costs tens of microseconds on a virtual machine (a futex wake and an IPI),
// once or twice per loop, and a batch-1 decode step runs about fifty loops of a few
// hundred microseconds each; polling spends that time on the core instead, yielding to
// the process's other goroutines as it polls, and stops after the spin, so a core left
// idle for longer goes back to the machine. A worker polls only while it is idle: no
// loop waits for it. It is read as the goroutines poll, so it may be set at any time;
// the default, 100µs, is RESIN_POOL_SPIN's (a Go duration) when that is set.
func SetPoolSpin(d time.Duration) time.Duration {
	return time.Duration(poolSpin.Swap(int64(max(d, 0))))
}

// PoolSpinDuration returns the pool's spin (SetPoolSpin).
func PoolSpinDuration() time.Duration { return time.Duration(poolSpin.Load()) }

var (
	poolSpin    atomic.Int64 // nanoseconds
	poolSpinEnv string       // how RESIN_POOL_SPIN set the spin (PoolSpinSource)
)

func init() {
	v, set := os.LookupEnv("RESIN_POOL_SPIN")
	var d time.Duration
	d, poolSpinEnv = parsePoolSpin(v, set)
	SetPoolSpin(d)
}

// parsePoolSpin is the pool's spin for RESIN_POOL_SPIN=v (set: whether it is set) and
// where it came from, or why v was not taken.
func parsePoolSpin(v string, set bool) (time.Duration, string) {
	if !set {
		return defaultPoolSpin, "the default; RESIN_POOL_SPIN sets it"
	}
	p, err := time.ParseDuration(v)
	switch {
	case err != nil:
		return defaultPoolSpin, fmt.Sprintf("RESIN_POOL_SPIN=%q is not a Go duration such as 100us or 0, so the default runs", v)
	case p < 0:
		return 0, fmt.Sprintf("RESIN_POOL_SPIN=%s is negative: no spin", v)
	case p > maxEnvPoolSpin:
		return maxEnvPoolSpin, fmt.Sprintf("RESIN_POOL_SPIN=%s is above the %v cap, which runs instead: an idle worker would burn its core that long after every loop", v, maxEnvPoolSpin)
	}
	return p, "RESIN_POOL_SPIN=" + v
}

// PoolSpinSource says where the pool's spin at start-up came from: the default,
// RESIN_POOL_SPIN, or why RESIN_POOL_SPIN was not taken (`resin doctor` prints it).
func PoolSpinSource() string { return poolSpinEnv }

// spin polls done for up to the pool's spin (SetPoolSpin), yielding to the process's other goroutines between
// polls, and reports whether it held.
func spin(done func() bool) bool {
	if poolSpin.Load() <= 0 {
		return done()
	}
	start := time.Now()
	for i := 0; ; i++ {
		if done() {
			return true
		}
		if i%64 == 63 {
			if time.Since(start) >= time.Duration(poolSpin.Load()) {
				return done()
			}
			runtime.Gosched()
		}
	}
}

// minParallelElems is the fewest elements an elementwise operator splits across the pool:
// below it waking a worker costs more than it saves.
const minParallelElems = 1 << 15

// rowGrain is the fewest rows of dim elements worth a chunk of their own; more rows than
// that are worth splitting.
func rowGrain(dim int) int { return max(1, minParallelElems/max(dim, 1)) }

// freeList keeps the state of finished calls (a loop and its task) for the next ones, one
// per concurrent call; unlike a sync.Pool it keeps them across garbage collections, so a
// call in steady state allocates nothing.
type freeList[T any] struct {
	sync.Mutex
	free []*T
}

func (f *freeList[T]) get() *T {
	f.Lock()
	defer f.Unlock()
	if n := len(f.free); n > 0 {
		x := f.free[n-1]
		f.free = f.free[:n-1]
		return x
	}
	return new(T)
}

func (f *freeList[T]) put(x *T) {
	f.Lock()
	f.free = append(f.free, x)
	f.Unlock()
}

// blasGemm computes out = a·op(b) on lib (b is [k, n], or [n, k] when transB). When the
// library runs on one thread and the pool has more than the caller, the product is split in
// blocks of columns of out (of rows too when it is narrow), each a single-threaded call of
// the library, claimed by the caller and the idle workers: one set of threads does all the
// parallel work, so the library's own threads never spin beside the pool's (on a loaded
// machine a busy-waiting thread, or a static split waiting on its slowest thread, costs
// more than the GEMM). A block's values do not depend on the blocks beside it.
func blasGemm(lib *cblas.Library, transB bool, out, a, b []float32, m, k, n int) error {
	p := parts()
	if p == 1 || m*n*k < minParallelMACs || lib.ThreadsSet() > 1 {
		return lib.Sgemm(transB, m, n, k, a, b, out)
	}
	t := gemmTasks.get()
	defer func() {
		t.lib, t.out, t.a, t.b, t.err = nil, nil, nil, nil, nil
		gemmTasks.put(t)
	}()
	t.lib, t.transB, t.out, t.a, t.b, t.m, t.k, t.n = lib, transB, out, a, b, m, k, n
	// One block per participant: every call of the library packs its share of the
	// activations again, and on 2 cores 4 blocks a participant ran 8–12% slower than one
	// (m=512, k=1024, n=1024–5632, OpenBLAS SkylakeX kernels). Columns first, at least 16
	// (a multiple of 16) and minParallelMACs a block; rows of at least 64 when the product
	// is too narrow for a block of columns each.
	t.colBlock = roundUp(max((n+p-1)/p, (minParallelMACs+m*k-1)/(m*k)), 16)
	t.colBlocks = (n + t.colBlock - 1) / t.colBlock
	t.rowBlock = m
	if t.colBlocks < p && m >= 128 {
		rowBlocks := (p + t.colBlocks - 1) / t.colBlocks
		t.rowBlock = max(64, (m+rowBlocks-1)/rowBlocks)
	}
	rowBlocks := (m + t.rowBlock - 1) / t.rowBlock
	t.outT = m >= 2 && m <= maxOutTRows
	if t.outT {
		t.ct = growFloat32s(t.ct, m*n)
	}
	parallelFor(&t.loop, t, rowBlocks*t.colBlocks, 1)
	return t.err
}

// maxOutTRows is the most rows of a product blasGemm computes transposed (SgemmOutT) and
// transposes back: up to it the library runs faster that way round (m=8, k=1024,
// n=2816: 25–35% on OpenBLAS 0.3.34, SkylakeX kernels).
const maxOutTRows = 16

// minParallelMACs is the fewest multiply-adds blasGemm and skinnyGemm split across the pool
// (and the fewest of a blasGemm block), and the fewest KDAChunked splits by heads.
const minParallelMACs = 1 << 18

func roundUp(x, to int) int { return (x + to - 1) / to * to }

// gemmTask is one blasGemm call split in blocks, a pool task.
type gemmTask struct {
	loop                          loop
	lib                           *cblas.Library
	transB                        bool
	out, a, b                     []float32
	m, k, n                       int
	rowBlock, colBlock, colBlocks int
	outT                          bool      // blocks computed transposed into ct, [n, m]
	ct                            []float32 // kept across calls
	mu                            sync.Mutex
	err                           error
}

var gemmTasks freeList[gemmTask]

func (t *gemmTask) run(_, lo, hi int) {
	for i := lo; i < hi; i++ {
		r0, c0 := i/t.colBlocks*t.rowBlock, i%t.colBlocks*t.colBlock
		r1, c1 := min(r0+t.rowBlock, t.m), min(c0+t.colBlock, t.n)
		b, ldb := t.b[c0:], t.n
		if t.transB {
			b, ldb = t.b[c0*t.k:], t.k
		}
		var err error
		if t.outT { // rowBlock = m
			ct := t.ct[c0*t.m : c1*t.m]
			if err = t.lib.SgemmOutT(t.transB, t.m, c1-c0, t.k, t.a, t.k, b, ldb, ct, t.m); err == nil {
				for j := c0; j < c1; j++ {
					for i, v := range ct[(j-c0)*t.m : (j-c0+1)*t.m] {
						t.out[i*t.n+j] = v
					}
				}
			}
		} else {
			err = t.lib.SgemmStrided(t.transB, r1-r0, c1-c0, t.k, t.a[r0*t.k:], t.k, b, ldb, t.out[r0*t.n+c0:], t.n)
		}
		if err != nil {
			t.mu.Lock()
			t.err = cmp.Or(t.err, err)
			t.mu.Unlock()
		}
	}
}

// Parts is the most participants a ParallelRange can have: the caller and the package's
// workers (GOMAXPROCS-1 goroutines, started on first use).
func Parts() int { return parts() }

// ParallelRange runs fn over items [0, n) in chunks of grain items (at least 1) on the
// caller and the package's idle workers, the pool every operator here splits its work on,
// and returns when every item is done. fn(part, lo, hi) handles items [lo, hi); part, in
// [0, Parts()), is held by one participant at a time, so it can index per-participant
// scratch. For a model's own loops (a layer's tokens or heads); fn may call the package's
// operators, whose own splitting then runs on whoever is free. It allocates nothing
// itself (a closure made for the call may allocate; a func kept in the caller's scratch
// does not).
func ParallelRange(n, grain int, fn func(part, lo, hi int)) {
	t := funcTasks.get()
	t.fn = fn
	parallelFor(&t.loop, t, n, grain)
	t.fn = nil
	funcTasks.put(t)
}

var funcTasks freeList[funcTask]

// funcTask is ParallelRange's function as a pool task.
type funcTask struct {
	loop loop
	fn   func(part, lo, hi int)
}

func (t *funcTask) run(part, lo, hi int) { t.fn(part, lo, hi) }
