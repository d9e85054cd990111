package gpurunner

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/resin-llm/resin/core/cudart"
)

// DefaultWatchdog is Options.Watchdog's default: how long one step of a rank whose
// collectives run on NCCL may take before its communicator is aborted (SGLang's
// --watchdog-timeout default). A first step that compiles kernels or captures graphs
// stays far below it.
const DefaultWatchdog = 5 * time.Minute

// Watchdog bounds the steps of a rank whose collectives run on NCCL. NCCL's collectives
// have no deadline: one whose peer died or hangs waits for good, and with it the host
// thread that waits on the stream, so a step would never fail and the group never stop.
// The watchdog aborts the rank's communicator (cudart.Comm.Abort: NCCL ends the queued
// collectives and the stream's wait returns) when a step runs past the timeout, or at
// once when Abort is called (a supervisor that saw a worker process exit: launch.Workers).
// The step in flight then fails with the reason, whatever its stream said, and so does
// every later one: the communicator is gone, the group can run no more steps (the error
// is permanent: the engine stops; the group restarts from its launcher).
//
// This is PyTorch's NCCL watchdog (TORCH_NCCL_ASYNC_ERROR_HANDLING) and SGLang's
// --watchdog-timeout, per rank: each rank's watchdog fires on its own, so a rank whose
// peer is on another node, or whose rank 0 died, does not wait for good either.
type Watchdog struct {
	comm    *cudart.Comm
	also    []*cudart.Comm // the rank's other communicators (Also), aborted with comm
	timeout time.Duration
	name    string

	mu   sync.Mutex
	why  error // set once, by the abort
	step int64 // steps started, for the deadline's message
}

// AbortError is a step that a Watchdog ended by aborting the rank's communicator, or any
// step after that.
type AbortError struct {
	Why error
}

func (e *AbortError) Error() string {
	return fmt.Sprintf("the NCCL communicator was aborted: %v", e.Why)
}

func (e *AbortError) Unwrap() error { return e.Why }

// Permanent reports true: the rank's communicator is gone (engine.Engine.Err).
func (e *AbortError) Permanent() bool { return true }

// NewWatchdog watches comm's steps (Step) with the timeout (≤ 0: DefaultWatchdog). name
// prefixes its messages ("tp rank 1"). A nil comm (a group of one) gives a watchdog that
// only runs the steps.
func NewWatchdog(comm *cudart.Comm, timeout time.Duration, name string) *Watchdog {
	if timeout <= 0 {
		timeout = DefaultWatchdog
	}
	return &Watchdog{comm: comm, timeout: timeout, name: name}
}

// Step runs fn, one step of the rank (its device work and the wait for it), under the
// deadline. If the watchdog aborted the communicator before fn returned, or had before
// Step, the step fails with an *AbortError.
func (w *Watchdog) Step(fn func() error) error {
	if w == nil || w.comm == nil {
		return fn()
	}
	if err := w.Err(); err != nil {
		return err
	}
	w.mu.Lock()
	w.step++
	n := w.step
	w.mu.Unlock()
	t := time.AfterFunc(w.timeout, func() {
		w.Abort(fmt.Errorf("%s: step %d ran past the watchdog's %v (--watchdog-timeout): a peer rank died or hangs in a collective", w.name, n, w.timeout))
	})
	err := fn()
	t.Stop()
	if why := w.Err(); why != nil {
		return why
	}
	return err
}

// Abort aborts the communicator now, for why (the first call's reason is kept): a step in
// flight and every later one fail with it. It is safe from any goroutine, and idempotent.
func (w *Watchdog) Abort(why error) {
	if w == nil || w.comm == nil {
		return
	}
	if why == nil {
		why = errors.New("aborted")
	}
	w.mu.Lock()
	if w.why != nil {
		w.mu.Unlock()
		return
	}
	w.why = &AbortError{Why: why}
	w.mu.Unlock()
	var failed []error
	for _, c := range append([]*cudart.Comm{w.comm}, w.also...) {
		if err := c.Abort(); err != nil {
			failed = append(failed, err)
		}
	}
	if len(failed) > 0 {
		w.mu.Lock()
		w.why = &AbortError{Why: fmt.Errorf("%w (and ncclCommAbort failed: %v)", why, errors.Join(failed...))}
		w.mu.Unlock()
	}
}

// Also puts comm, another communicator of the rank's (a CP × TP rank's cp group beside
// its tp group), under the watchdog: an abort aborts it too. Call it before the first
// step.
func (w *Watchdog) Also(comm *cudart.Comm) {
	if w != nil && w.comm != nil && comm != nil {
		w.also = append(w.also, comm)
	}
}

// Err is the *AbortError once the watchdog aborted the communicator, else nil.
func (w *Watchdog) Err() error {
	if w == nil {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.why == nil {
		return nil
	}
	return w.why
}
