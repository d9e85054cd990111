//go:build race

package engine_test

// raceEnabled: the race detector's instrumentation allocates now and then, so tests that
// count allocations skip under it.
const raceEnabled = true
