package cudart

import (
	"fmt"
	"strconv"
)

// GraphKind separates the graphs a runner captures.
type GraphKind uint8

const (
	// GraphDecode is a decode step over a padded batch of Bucket sequences.
	GraphDecode GraphKind = iota
	// GraphPrefill is a prefill step over a padded count of Bucket tokens.
	GraphPrefill
)

func (k GraphKind) String() string {
	switch k {
	case GraphDecode:
		return "decode"
	case GraphPrefill:
		return "prefill"
	}
	return "kind(" + strconv.Itoa(int(k)) + ")"
}

// GraphKey names one captured graph: the step kind, its bucket (batch size for decode,
// token count for prefill) and a runner-defined variant for anything else that changes
// the recorded work (say, with or without draft tokens).
type GraphKey struct {
	Kind    GraphKind
	Bucket  int
	Variant int
}

func (k GraphKey) String() string {
	s := k.Kind.String() + "/" + strconv.Itoa(k.Bucket)
	if k.Variant != 0 {
		s += "/" + strconv.Itoa(k.Variant)
	}
	return s
}

// GraphCache holds a device's executable graphs by key, at most Cap of them: capturing
// one more destroys the least recently replayed. A runner keeps one per device and uses
// it only inside that device's Do; it is not safe for concurrent use. Lookups and replays
// allocate nothing.
type GraphCache struct {
	lru     *lru[GraphKey, *GraphExec]
	destroy func(c *Ctx, e *GraphExec) error // (*Ctx).DestroyGraphExec; a fake in tests
	capture func(c *Ctx, s *Stream, fn func() error) (*GraphExec, error)
	evicted int
}

// NewGraphCache makes a cache of at most capacity graphs.
func NewGraphCache(capacity int) (*GraphCache, error) {
	if capacity < 1 {
		return nil, fmt.Errorf("graph cache: capacity must be at least 1, got %d", capacity)
	}
	return &GraphCache{lru: newLRU[GraphKey, *GraphExec](capacity),
		destroy: (*Ctx).DestroyGraphExec, capture: (*Ctx).Capture}, nil
}

// Len returns the number of graphs held; Cap the most it holds.
func (g *GraphCache) Len() int { return g.lru.len() }

// Cap returns the most graphs the cache holds.
func (g *GraphCache) Cap() int { return g.lru.cap() }

// Evicted returns how many graphs were destroyed to make room.
func (g *GraphCache) Evicted() int { return g.evicted }

// Get returns the graph under k, marking it recently used.
func (g *GraphCache) Get(k GraphKey) (*GraphExec, bool) { return g.lru.get(k) }

// Keys lists the keys held, most recently used first.
func (g *GraphCache) Keys() []GraphKey {
	out := make([]GraphKey, 0, g.lru.len())
	g.lru.each(func(k GraphKey, _ *GraphExec) { out = append(out, k) })
	return out
}

// Put stores e under k, destroying the graph it displaces (the one under k before, or
// the least recently used when the cache is full).
func (g *GraphCache) Put(c *Ctx, k GraphKey, e *GraphExec) error {
	oldK, old, displaced := g.lru.put(k, e)
	if !displaced || old == e {
		return nil
	}
	if oldK != k {
		g.evicted++
	}
	if err := g.destroy(c, old); err != nil {
		return fmt.Errorf("graph cache: destroy %s: %w", oldK, err)
	}
	return nil
}

// Capture records fn on s (Ctx.Capture: thread-local mode, aborted cleanly on error) and
// stores the graph under k. On error nothing is stored and s stays usable.
func (g *GraphCache) Capture(c *Ctx, s *Stream, k GraphKey, fn func() error) (*GraphExec, error) {
	e, err := g.capture(c, s, fn)
	if err != nil {
		return nil, fmt.Errorf("graph %s: %w", k, err)
	}
	if err := g.Put(c, k, e); err != nil {
		return e, err
	}
	return e, nil
}

// Replay launches the graph under k on s. It returns false, and launches nothing, when
// no graph is held under k: the caller runs the step eagerly (or captures it).
func (g *GraphCache) Replay(c *Ctx, s *Stream, k GraphKey) (bool, error) {
	e, ok := g.lru.get(k)
	if !ok {
		return false, nil
	}
	if err := c.LaunchGraph(e, s); err != nil {
		return true, fmt.Errorf("replay graph %s: %w", k, err)
	}
	return true, nil
}

// Drop destroys the graph under k, if any (after the buffers it reads were reallocated).
func (g *GraphCache) Drop(c *Ctx, k GraphKey) error {
	e, ok := g.lru.remove(k)
	if !ok {
		return nil
	}
	return g.destroy(c, e)
}

// Close destroys every graph; the cache stays usable, empty.
func (g *GraphCache) Close(c *Ctx) error {
	var first error
	g.lru.each(func(k GraphKey, e *GraphExec) {
		if err := g.destroy(c, e); err != nil && first == nil {
			first = fmt.Errorf("graph cache: destroy %s: %w", k, err)
		}
	})
	g.lru.clear()
	return first
}
