package ref

import (
	"runtime"
	"sync"
	"sync/atomic"
)

// The package's worker pool: GOMAXPROCS-1 goroutines, started on first use, that help the
// calling goroutine through a parallel loop. The caller always works too, so a loop ends
// even when every worker is busy elsewhere (a nested loop, or another model's): workers
// join a loop only when idle at the moment it starts, and a loop never waits for one that
// did not join. Starting a loop allocates nothing.

// task is a parallel loop's body: run processes items [lo, hi) as participant part, a
// number in [0, parts) no other participant of the same loop holds at the same time.
type task interface {
	run(part, lo, hi int)
}

// loop is one parallelFor call: its body, how its items are split and who still works on it.
type loop struct {
	t            task
	n, grain     int
	next, joined atomic.Int64
	wg           sync.WaitGroup
}

var (
	poolOnce    sync.Once
	poolWorkers int
	poolQueue   chan *loop
)

// workers returns the number of helper goroutines, starting them on the first call.
func workers() int {
	poolOnce.Do(func() {
		poolWorkers = runtime.GOMAXPROCS(0) - 1
		poolQueue = make(chan *loop) // unbuffered: a send succeeds only to an idle worker
		for range poolWorkers {
			go func() {
				for l := range poolQueue {
					l.work(int(l.joined.Add(1)))
					l.wg.Done()
				}
			}()
		}
	})
	return poolWorkers
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

// parallelFor runs t over items [0, n) in chunks of grain items, on the caller and the idle
// workers, and returns when every item is done. l is the caller's, reused across calls.
func parallelFor(l *loop, t task, n, grain int) {
	if n <= 0 {
		return
	}
	grain = max(grain, 1)
	l.t, l.n, l.grain = t, n, grain
	l.next.Store(0)
	l.joined.Store(0)
	chunks := (n + grain - 1) / grain
	for range min(workers(), chunks-1) {
		l.wg.Add(1)
		select {
		case poolQueue <- l:
		default:
			l.wg.Done() // no idle worker: the caller does its share
		}
	}
	l.work(0)
	l.wg.Wait()
	l.t = nil
}

// minParallelElems is the fewest elements an elementwise operator splits across the pool:
// below it waking a worker costs more than it saves (and the serial path allocates
// nothing, so a decode step's few rows stay serial).
const minParallelElems = 1 << 15

// rowGrain is the fewest rows of dim elements worth a chunk of their own.
func rowGrain(dim int) int { return max(1, minParallelElems/max(dim, 1)) }

// splitRows says whether rows of dim elements are worth splitting across the pool. A
// caller tests it before making the closure it gives parallelRows, which allocates.
func splitRows(rows, dim int) bool { return rows > rowGrain(dim) }

// parallelRows runs fn over rows [0, rows) of dim elements each, in chunks of at least
// minParallelElems elements on the worker pool (serially when splitRows says no).
func parallelRows(rows, dim int, fn func(lo, hi int)) {
	if !splitRows(rows, dim) {
		fn(0, rows)
		return
	}
	l := getLoop()
	parallelFor(l, rangeTask(fn), rows, rowGrain(dim))
	putLoop(l)
}

// rangeTask adapts a function of a range of items to a task.
type rangeTask func(lo, hi int)

func (f rangeTask) run(_, lo, hi int) { f(lo, hi) }

// loops keeps the loop state of finished parallelRows calls for the next ones.
var loops struct {
	sync.Mutex
	free []*loop
}

func getLoop() *loop {
	loops.Lock()
	defer loops.Unlock()
	if n := len(loops.free); n > 0 {
		l := loops.free[n-1]
		loops.free = loops.free[:n-1]
		return l
	}
	return new(loop)
}

func putLoop(l *loop) {
	loops.Lock()
	loops.free = append(loops.free, l)
	loops.Unlock()
}
