package dp

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/resin-llm/resin/core/engine"
)

// Coordinator routes requests over the engines of a Group's ranks (engine r runs on
// rank r) and runs their loops. A request goes to the rank with the fewest waiting
// requests, then the fewest running, then the lowest rank (SGLang's shortest-queue
// routing), and stays there: its cache is that rank's pool.
type Coordinator struct {
	g       *Group
	engines []*engine.Engine

	mu     sync.Mutex
	wg     sync.WaitGroup
	cancel context.CancelFunc
	errs   []error
}

// NewCoordinator pairs g's ranks with their engines, whose runners run through
// g.Forward(r).
func NewCoordinator(g *Group, engines []*engine.Engine) (*Coordinator, error) {
	if len(engines) != g.Size() {
		return nil, fmt.Errorf("dp: %d engines for %d ranks", len(engines), g.Size())
	}
	return &Coordinator{g: g, engines: engines}, nil
}

// Engine returns rank r's engine.
func (c *Coordinator) Engine(r int) *engine.Engine { return c.engines[r] }

// Route returns the rank the next request goes to.
func (c *Coordinator) Route() int {
	best, bs := 0, c.engines[0].Stats()
	for r, e := range c.engines[1:] {
		s := e.Stats()
		if s.Waiting < bs.Waiting || s.Waiting == bs.Waiting && s.Running < bs.Running {
			best, bs = r+1, s
		}
	}
	return best
}

// Submit routes req to a rank (Route) and submits it there.
func (c *Coordinator) Submit(ctx context.Context, req engine.Request) (*engine.Stream, int, error) {
	if err := c.g.Err(); err != nil {
		return nil, -1, err
	}
	c.mu.Lock()
	r := c.Route()
	s, err := c.engines[r].Submit(ctx, req)
	c.mu.Unlock()
	return s, r, err
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
// end with it, FinishError); Submit refuses new requests. Group.Done tells a server to
// stop.
func (c *Coordinator) Start(ctx context.Context) {
	ctx, c.cancel = context.WithCancel(ctx)
	c.g.Start()
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
// loop. It returns the error that broke the group or an engine loop, if any.
func (c *Coordinator) Close() error {
	for _, e := range c.engines {
		e.Close()
	}
	gerr := c.g.Close()
	if c.cancel != nil {
		c.cancel()
	}
	c.wg.Wait()
	c.mu.Lock()
	defer c.mu.Unlock()
	return errors.Join(append([]error{gerr}, c.errs...)...)
}
