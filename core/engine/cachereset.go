package engine

// ForgetCache is for a runner that lost the contents of its cache (an out-of-process runner
// that died and was restarted): every running request is preempted, so it recomputes its
// tokens (prompt and output so far) into fresh pages, and the prefix cache is emptied, so
// no later plan counts on a page the runner no longer holds. Waiting requests keep their
// place; the preempted ones go to the front of the queue.
//
// A runner calls it from Execute (the engine's lock is not held there) and then returns
// an error for the plan at hand: that plan's requests, preempted, are not failed by it.
func (e *Engine) ForgetCache() {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := e.s
	for len(s.running) > 0 {
		s.preempt(s.running[len(s.running)-1]) // newest first: the oldest ends up in front
	}
	// The page copies not yet retired copy pages the runner no longer holds; their
	// sources, held until then, would stay cached through ClearCache.
	s.pool.DropCopies()
	s.pool.ClearCache()
	e.afterChange()
}
