package wire

// Tracked returns the number of requests whose page tables the runner holds, as far as
// the engine knows (released requests are forgotten at the next step); for the tests.
func (r *Remote) Tracked() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.enc.Tracked()
}
