package launch

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"time"

	"github.com/resin-llm/resin/core/dist"
)

// Spec is one worker process to start.
type Spec struct {
	Rank int      // the worker's rank, for errors
	Path string   // the executable (os.Executable() for this binary)
	Args []string // its arguments (not the program name)
	Env  []string // added to this process's environment
	// Binding, when set, adds its Env: the worker's GPU and NUMA node (ApplyEnv binds).
	Binding        *Binding
	Stdout, Stderr io.Writer // nil: this process's stderr for both
}

// ExitError is a worker that exited while its group ran.
type ExitError struct {
	Rank, Pid int
	Err       error // what Wait said; nil for a clean exit before the group stopped
}

func (e *ExitError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("launch: worker rank %d (pid %d) exited before the group stopped", e.Rank, e.Pid)
	}
	return fmt.Sprintf("launch: worker rank %d (pid %d) exited: %v", e.Rank, e.Pid, e.Err)
}

func (e *ExitError) Unwrap() error { return e.Err }

// Permanent reports true: a group whose worker exited can run no more steps (an engine
// that finds it in a step's error stops: engine.Engine.Err).
func (e *ExitError) Permanent() bool { return true }

type proc struct {
	rank int
	cmd  *exec.Cmd
	done chan struct{} // closed once reaped; err is Wait's
	err  error
}

// Workers supervises the worker processes of one host's ranks. Each is started with
// SIGKILL as its parent-death signal (Linux: the signal comes when the thread that
// started it ends, which for Go's runtime threads is the process's end), so none
// outlives a launcher that dies. Every worker that exits before Stop is recorded; the
// first is Err and closes Exited. The collectives notice a dead peer themselves (shared memory by its
// pid, TCP by the closed connection, the rest at their deadline): StepError puts the
// worker's exit status on the step's error.
type Workers struct {
	procs  []*proc
	exited chan struct{}

	mu       sync.Mutex
	first    *ExitError
	exits    map[int]*ExitError // every worker that exited before Stop, by rank
	changed  chan struct{}      // closed and replaced when exits grows
	stopping bool
	once     sync.Once
}

// Start starts every spec's process. If one fails to start, those started are killed
// and reaped.
func Start(specs []Spec) (*Workers, error) {
	w := &Workers{exited: make(chan struct{}), exits: map[int]*ExitError{}, changed: make(chan struct{})}
	for _, s := range specs {
		cmd := exec.Command(s.Path, s.Args...)
		cmd.Env = append(os.Environ(), s.Env...)
		if s.Binding != nil {
			cmd.Env = append(cmd.Env, s.Binding.Env()...)
		}
		cmd.Stdout, cmd.Stderr = s.Stdout, s.Stderr
		if cmd.Stdout == nil {
			cmd.Stdout = os.Stderr
		}
		if cmd.Stderr == nil {
			cmd.Stderr = os.Stderr
		}
		cmd.SysProcAttr = sysProcAttr()
		if err := cmd.Start(); err != nil {
			w.Kill()
			return nil, fmt.Errorf("launch: start worker rank %d: %w", s.Rank, err)
		}
		p := &proc{rank: s.Rank, cmd: cmd, done: make(chan struct{})}
		w.procs = append(w.procs, p)
		go w.wait(p)
	}
	return w, nil
}

func (w *Workers) wait(p *proc) {
	p.err = p.cmd.Wait()
	close(p.done)
	w.mu.Lock()
	if w.stopping {
		w.mu.Unlock()
		return
	}
	xe := &ExitError{Rank: p.rank, Pid: p.cmd.Process.Pid, Err: p.err}
	w.exits[p.rank] = xe
	close(w.changed)
	w.changed = make(chan struct{})
	first := w.first == nil
	if first {
		w.first = xe
	}
	w.mu.Unlock()
	if first {
		w.once.Do(func() { close(w.exited) })
	}
}

// Exited is closed when a worker exits before Stop (dist.Options.Cancel of a join that
// waits for the workers).
// A nil *Workers is no workers (ranks that are not this process's children, on other
// nodes): it never exits, has no error and stops at once.
func (w *Workers) Exited() <-chan struct{} {
	if w == nil {
		return nil
	}
	return w.exited
}

// Err returns the first worker that exited before Stop, as an *ExitError, or nil.
func (w *Workers) Err() error {
	if w == nil {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.first == nil {
		return nil
	}
	return w.first
}

// StepError is err (a step that failed) with the exit of the worker behind it, when a
// worker has exited: "launch: worker rank 1 (pid 812) exited: signal: killed; the step:
// dist: …" — the worker of the rank the error names (a *dist.PeerError's Peer, the
// worker's Spec.Rank being its rank in the group), else the first to exit. A collective
// can see a dead peer (its pid gone) before this process has reaped it, so for an error
// that says a peer is gone or late (dist.ErrPeerGone, dist.ErrTimeout) it waits up to a
// second for that exit.
func (w *Workers) StepError(err error) error {
	if err == nil || w == nil {
		return err
	}
	want := -1
	var pe *dist.PeerError
	if errors.As(err, &pe) {
		want = pe.Peer
	}
	exit := func() (*ExitError, <-chan struct{}) {
		w.mu.Lock()
		defer w.mu.Unlock()
		if xe := w.exits[want]; xe != nil {
			return xe, nil
		}
		return nil, w.changed
	}
	xe, changed := exit()
	if xe == nil && (errors.Is(err, dist.ErrPeerGone) || errors.Is(err, dist.ErrTimeout)) {
		timeout := time.After(time.Second)
	wait:
		for xe == nil {
			select {
			case <-changed:
				xe, changed = exit()
			case <-timeout:
				break wait
			}
		}
	}
	if xe == nil {
		w.mu.Lock()
		xe = w.first
		w.mu.Unlock()
	}
	if xe != nil && !errors.Is(err, xe) {
		return fmt.Errorf("%w; the step: %w", xe, err)
	}
	return err
}

// Pids returns the workers' process ids, in Spec order.
func (w *Workers) Pids() []int {
	if w == nil {
		return nil
	}
	out := make([]int, len(w.procs))
	for i, p := range w.procs {
		out[i] = p.cmd.Process.Pid
	}
	return out
}

// Stop waits up to grace for every worker to exit (after the group's stop message) and
// kills those still running, then reaps all. It returns the first worker's exit error,
// if one exited before Stop or badly after it, and names the workers it had to kill.
func (w *Workers) Stop(grace time.Duration) error {
	if w == nil {
		return nil
	}
	w.mu.Lock()
	w.stopping = true
	var errs []error
	firstRank := -1
	if w.first != nil {
		errs, firstRank = append(errs, w.first), w.first.Rank
	}
	w.mu.Unlock()
	expired := make(chan struct{})
	t := time.AfterFunc(grace, func() { close(expired) })
	defer t.Stop()
	for _, p := range w.procs {
		select {
		case <-p.done:
			if p.err != nil && p.rank != firstRank {
				errs = append(errs, &ExitError{Rank: p.rank, Pid: p.cmd.Process.Pid, Err: p.err})
			}
		case <-expired:
			p.cmd.Process.Kill()
			<-p.done
			errs = append(errs, fmt.Errorf("launch: worker rank %d (pid %d) did not stop within %v; killed", p.rank, p.cmd.Process.Pid, grace))
		}
	}
	return errors.Join(errs...)
}

// Kill kills every worker still running and reaps them all.
func (w *Workers) Kill() {
	if w == nil {
		return
	}
	w.mu.Lock()
	w.stopping = true
	w.mu.Unlock()
	for _, p := range w.procs {
		select {
		case <-p.done:
		default:
			p.cmd.Process.Kill()
			<-p.done
		}
	}
}
