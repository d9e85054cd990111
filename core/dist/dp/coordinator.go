package dp

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
)

// Coordinator routes requests over the engines of the dp ranks (engine r runs on rank r)
// and runs their loops. A request goes to the rank with the fewest waiting requests,
// then the fewest running (SGLang's shortest-queue routing), ties taken in turn (the
// n-th request prefers rank n mod N), and stays there: its cache is that rank's pool. It has the methods core/serve needs of an
// engine, so a server runs over it as over one engine.
//
// With a Group the ranks step together (DP-attention); without one (nil) they are
// replicas, each engine stepping on its own.
type Coordinator struct {
	g       *Group
	engines []*engine.Engine
	info    engine.RunnerInfo

	mu     sync.Mutex
	turn   int    // the rank the next tie goes to
	nextID uint64 // the last id given to a request without one (under mu)
	wg     sync.WaitGroup
	cancel context.CancelFunc
	errs   []error

	closeOnce sync.Once
	closeErr  error

	// dead is closed, and deadErr set, when the first rank's engine fails for good (or
	// the group breaks); stop ends the goroutines that watch for it.
	dead     chan struct{}
	deadErr  error // under mu
	deadOnce sync.Once
	stop     chan struct{}
	watch    sync.WaitGroup
}

// NewCoordinator pairs the engines with g's ranks (whose runners run through
// g.Forward(r)), or with g nil makes them replicas. The engines must run one model:
// the same vocabulary and end tokens.
func NewCoordinator(g *Group, engines []*engine.Engine) (*Coordinator, error) {
	if len(engines) == 0 {
		return nil, errors.New("dp: no engines")
	}
	if g != nil && len(engines) != g.Size() {
		return nil, fmt.Errorf("dp: %d engines for %d ranks", len(engines), g.Size())
	}
	info := engines[0].Info()
	for r, e := range engines[1:] {
		ri := e.Info()
		if ri.VocabSize != info.VocabSize || fmt.Sprint(ri.EOS) != fmt.Sprint(info.EOS) || ri.TokenMasks != info.TokenMasks {
			return nil, fmt.Errorf("dp: rank %d runs %s (vocabulary %d), rank 0 %s (vocabulary %d)", r+1, ri.Name, ri.VocabSize, info.Name, info.VocabSize)
		}
		info.MaxContext = min(info.MaxContext, ri.MaxContext)
	}
	c := &Coordinator{g: g, engines: engines, info: info, dead: make(chan struct{}), stop: make(chan struct{})}
	c.watchDead()
	return c, nil
}

// watchDead starts one goroutine per rank that records its engine's death (and one for
// the group's break) until Close.
func (c *Coordinator) watchDead() {
	for r, e := range c.engines {
		c.watch.Add(1)
		go func() {
			defer c.watch.Done()
			select {
			case <-e.Dead():
				c.noteDead(fmt.Errorf("dp rank %d: %w", r, e.Err()))
			case <-c.stop:
			}
		}()
	}
	if c.g == nil {
		return
	}
	c.watch.Add(1)
	go func() {
		defer c.watch.Done()
		select {
		case <-c.g.Done():
			if err := c.g.Err(); err != nil { // nil: a clean Close
				c.noteDead(fmt.Errorf("dp group: %w", err))
			}
		case <-c.stop:
		}
	}()
}

// noteDead records err as Err (the first only) and closes Dead.
func (c *Coordinator) noteDead(err error) {
	c.deadOnce.Do(func() {
		c.mu.Lock()
		c.deadErr = err
		c.mu.Unlock()
		close(c.dead)
	})
}

// Err returns the first permanent failure of a rank, naming it: a rank's engine whose
// runner failed for good (engine.Engine.Err, e.g. a dead worker process), or with a Group
// the error that broke it (no rank can step again). Nil while there is none. From then
// on Submit refuses requests with engine.ErrRunnerDead; a server should report itself
// unhealthy and stop (core/serve does, through Dead), as over one engine.
func (c *Coordinator) Err() error {
	for r, e := range c.engines { // a rank may be dead before its watcher has run
		if err := e.Err(); err != nil {
			c.noteDead(fmt.Errorf("dp rank %d: %w", r, err))
			break
		}
	}
	if c.g != nil {
		if err := c.g.Err(); err != nil {
			c.noteDead(fmt.Errorf("dp group: %w", err))
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.deadErr
}

// Dead is closed when Err becomes non-nil.
func (c *Coordinator) Dead() <-chan struct{} { return c.dead }

// Size returns the number of ranks.
func (c *Coordinator) Size() int { return len(c.engines) }

// Engine returns rank r's engine.
func (c *Coordinator) Engine(r int) *engine.Engine { return c.engines[r] }

// Info returns rank 0's runner description, MaxContext the smallest of the ranks'.
func (c *Coordinator) Info() engine.RunnerInfo { return c.info }

// Registry returns rank 0's engine's metrics registry. (Each engine keeps its own; the
// other ranks' metrics are not exported yet.)
func (c *Coordinator) Registry() *prometheus.Registry { return c.engines[0].Registry() }

// Pool returns rank 0's cache pool (every rank has a pool of the same layout).
func (c *Coordinator) Pool() *kvslab.Pool { return c.engines[0].Pool() }

// route returns the rank the next request goes to (c.mu held).
func (c *Coordinator) route() int {
	n := len(c.engines)
	best := c.turn % n
	bs := c.engines[best].Stats()
	for i := 1; i < n; i++ {
		r := (best + i) % n
		s := c.engines[r].Stats()
		if s.Waiting < bs.Waiting || s.Waiting == bs.Waiting && s.Running < bs.Running {
			best, bs = r, s
		}
	}
	c.turn++
	return best
}

// SubmitRank routes req to a rank, submits it there and says which. Once a rank is dead
// (Err) it refuses every request with engine.ErrRunnerDead.
func (c *Coordinator) SubmitRank(ctx context.Context, req engine.Request) (*engine.Stream, int, error) {
	if err := c.Err(); err != nil {
		return nil, -1, fmt.Errorf("%w: %w", engine.ErrRunnerDead, err)
	}
	c.mu.Lock()
	if req.ID == "" {
		// Ids unique over the ranks: each engine numbering its own would give two
		// clients' requests one id, and Abort or Stop of one would end the other.
		c.nextID++
		req.ID = "req-" + strconv.FormatUint(c.nextID, 10)
	}
	r := c.route()
	s, err := c.engines[r].Submit(ctx, req)
	c.mu.Unlock()
	return s, r, err
}

// Submit routes req to a rank and submits it there.
func (c *Coordinator) Submit(ctx context.Context, req engine.Request) (*engine.Stream, error) {
	s, _, err := c.SubmitRank(ctx, req)
	return s, err
}

// Abort aborts the request with id on the rank that holds it.
func (c *Coordinator) Abort(id string) bool {
	for _, e := range c.engines {
		if e.Abort(id) {
			return true
		}
	}
	return false
}

// Stop ends the request with id (finish reason stop) on the rank that holds it.
func (c *Coordinator) Stop(id string) bool {
	for _, e := range c.engines {
		if e.Stop(id) {
			return true
		}
	}
	return false
}

// Drain refuses new requests on every rank and waits until every rank's are done.
func (c *Coordinator) Drain(ctx context.Context) error {
	errs := make([]error, len(c.engines))
	var wg sync.WaitGroup
	for r, e := range c.engines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := e.Drain(ctx); err != nil {
				errs[r] = fmt.Errorf("dp rank %d: %w", r, err)
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Stats sums the engines' queues.
func (c *Coordinator) Stats() engine.Stats {
	var t engine.Stats
	for _, e := range c.engines {
		s := e.Stats()
		t.Running += s.Running
		t.Waiting += s.Waiting
	}
	return t
}

// Start starts the group's steppers and every engine's loop. When the group breaks (a
// rank's step failed: a dead peer, a collective past its deadline), the step in flight
// fails with that error, and so does every later step of every engine (its requests
// end with it, FinishError); Submit refuses new requests, and Err and Dead report it,
// as they report a rank whose engine's runner failed for good: a server stops.
func (c *Coordinator) Start(ctx context.Context) {
	ctx, c.cancel = context.WithCancel(ctx)
	if c.g != nil {
		c.g.Start()
	}
	for r, e := range c.engines {
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			if err := e.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
				c.mu.Lock()
				c.errs = append(c.errs, fmt.Errorf("dp rank %d: engine: %w", r, err))
				c.mu.Unlock()
			}
		}()
	}
}

// Close closes the engines (their requests end), stops the group and waits for every
// loop. It returns the error that broke the group or an engine loop, if any; calling it
// again returns the same.
func (c *Coordinator) Close() error {
	c.closeOnce.Do(func() {
		for _, e := range c.engines {
			e.Close()
		}
		var gerr error
		if c.g != nil {
			gerr = c.g.Close()
		}
		if c.cancel != nil {
			c.cancel()
		}
		c.wg.Wait()
		close(c.stop)
		c.watch.Wait()
		c.mu.Lock()
		defer c.mu.Unlock()
		c.closeErr = errors.Join(append([]error{gerr}, c.errs...)...)
	})
	return c.closeErr
}
