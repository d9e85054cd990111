package wire

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/resin-llm/resin/core/engine"
)

var (
	// ErrRunnerDied wraps the error of a step during which the runner process died or the
	// connection broke: the step's requests fail with it.
	ErrRunnerDied = errors.New("wire: the runner died")
	// ErrRunnerDown: the runner is down and is not (or could not be) restarted.
	ErrRunnerDown = errors.New("wire: the runner is down")
	// errRestarted voids the first plan after a restart: its requests were preempted by
	// Engine.ForgetCache and will be recomputed.
	errRestarted = errors.New("wire: the runner restarted with an empty cache; the step's requests are recomputed")
	// errGone: the step could not be written because the runner had already closed its
	// end (it died between steps; a unix runner's death is only found this way).
	errGone = errors.New("the runner had closed its end before the message was sent")
)

// Config says how to reach a runner and how to supervise it.
type Config struct {
	// Spec is "exec:COMMAND" (a shell command line started as a child that speaks the
	// protocol on its stdin/stdout) or "unix:PATH" (a runner listening on a Unix socket).
	Spec string
	// MaxFrame caps the frames either side sends (default DefaultMaxFrame).
	MaxFrame int
	// HandshakeTimeout bounds starting the runner and its Info answer (default 2 min: a
	// runner loads its weights before it answers).
	HandshakeTimeout time.Duration
	// StepTimeout bounds the wait for one step's result (default 10 min); a runner that
	// takes longer is taken for dead.
	StepTimeout time.Duration
	// NoRestart keeps a dead runner down: every later step fails. By default the runner
	// is restarted (once attached to its engine, see Attach) in the background as soon as
	// its death is noticed, or by the next step if that comes first.
	NoRestart bool
	// RestartBackoff is the least time between two starts of the runner (default 1 s): a
	// step that needs a restart sooner waits.
	RestartBackoff time.Duration
	// Stderr receives an exec runner's stderr (default os.Stderr).
	Stderr io.Writer
	// Logger receives runner deaths and restarts (default slog.Default()).
	Logger *slog.Logger
	// WholeTables sends every row's whole page tables each step instead of deltas (to
	// measure what the deltas save; the runner sees no difference).
	WholeTables bool
}

// Remote is an engine.Runner whose model runs in another process, driven through the
// protocol. Build it with Dial, then Attach it to the engine built over it.
type Remote struct {
	cfg Config
	// name is the runner in errors, /health and logs: the spec with the values of an
	// exec command line's leading VAR=value words hidden (see redactSpec).
	name string

	mu        sync.Mutex // serializes Execute, restarts and Close
	sess      *session   // nil while down
	info      engine.RunnerInfo
	enc       Encoder
	res       engine.StepResult
	forget    func() // the engine's ForgetCache
	needReset bool   // the runner restarted: the engine's view of the cache must be reset
	lastStart time.Time
	restarts  int
	closed    bool

	steps, sent, received uint64 // traffic of the steps, frames included

	healthMu sync.Mutex
	health   error // nil while up

	// Restarts in the background: a runner that died is started again at once (after
	// RestartBackoff), not only when the next step comes, so that /health recovers on an
	// idle server, whose load balancer sends no step while /health says down.
	bg       context.Context
	bgCancel context.CancelFunc
	bgWG     sync.WaitGroup
	bgBusy   bool // a background restart is pending (under mu)
	// bgAbort cancels the pending background restart: a step whose context ends while it
	// waits for the restart (the engine shutting down) must not wait for a handshake.
	bgAbort atomic.Pointer[context.CancelFunc]
}

var _ engine.Runner = (*Remote)(nil)

// Dial starts (exec:) or connects to (unix:) the runner and does the handshake.
func Dial(ctx context.Context, cfg Config) (*Remote, error) {
	if cfg.MaxFrame <= 0 {
		cfg.MaxFrame = DefaultMaxFrame
	}
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = 2 * time.Minute
	}
	if cfg.StepTimeout <= 0 {
		cfg.StepTimeout = 10 * time.Minute
	}
	if cfg.RestartBackoff <= 0 {
		cfg.RestartBackoff = time.Second
	}
	if cfg.Stderr == nil {
		cfg.Stderr = os.Stderr
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if _, _, err := ParseSpec(cfg.Spec); err != nil {
		return nil, err
	}
	r := &Remote{cfg: cfg, name: redactSpec(cfg.Spec)}
	r.enc.WholeTables = cfg.WholeTables
	r.bg, r.bgCancel = context.WithCancel(context.Background())
	s, err := r.start(ctx)
	if err != nil {
		r.bgCancel()
		return nil, err
	}
	r.sess, r.info = s, s.info
	r.watch(s)
	// The runner's cache is in its own process: it executes the cache ops it is sent.
	r.info.ExecutesCacheOps = true
	return r, nil
}

// ParseSpec splits a runner spec into its scheme ("exec" or "unix") and the rest.
func ParseSpec(spec string) (scheme, rest string, err error) {
	scheme, rest, ok := strings.Cut(spec, ":")
	switch {
	case !ok || rest == "":
		return "", "", fmt.Errorf("runner %q: want exec:COMMAND or unix:PATH", spec)
	case scheme != "exec" && scheme != "unix":
		return "", "", fmt.Errorf("runner %q: unknown scheme %q (want exec:COMMAND or unix:PATH)", spec, scheme)
	}
	return scheme, rest, nil
}

// Attach gives the remote its engine: after a restart the runner's cache is empty, and the
// engine must forget what it thought the cache held (Engine.ForgetCache). Without it a
// dead runner stays down.
func (r *Remote) Attach(e *engine.Engine) {
	r.mu.Lock()
	r.forget = e.ForgetCache
	r.mu.Unlock()
}

// Info returns what the runner declared at the handshake.
func (r *Remote) Info() engine.RunnerInfo { return r.info }

// Health returns nil while the runner is up, else why it is down.
func (r *Remote) Health() error {
	r.healthMu.Lock()
	defer r.healthMu.Unlock()
	return r.health
}

func (r *Remote) setHealth(err error) {
	r.healthMu.Lock()
	r.health = err
	r.healthMu.Unlock()
}

// Pid returns the process id of an exec runner (0 for a unix: runner or while down).
func (r *Remote) Pid() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.sess == nil || r.sess.cmd == nil {
		return 0
	}
	return r.sess.cmd.Process.Pid
}

// Traffic returns the steps executed and the bytes of their frames sent and received.
func (r *Remote) Traffic() (steps, sent, received uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.steps, r.sent, r.received
}

// voidForRestart voids the step after a restart: the encoder's shadow page tables start
// empty, the engine puts every running request back in the queue (Engine.ForgetCache),
// and the step fails with errRestarted. r.mu is held.
func (r *Remote) voidForRestart() error {
	r.needReset = false
	r.enc.Reset()
	r.forget()
	return errRestarted
}

// Restarts returns how many times the runner was restarted.
func (r *Remote) Restarts() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.restarts
}

// Execute sends the plan and waits for its result. A runner that dies meanwhile fails the
// step (ErrRunnerDied); unless NoRestart it is restarted (in the background, or by the
// next step if that comes first), and the first step after the restart is voided after
// Engine.ForgetCache put every running request back in the queue.
func (r *Remote) Execute(ctx context.Context, plan *engine.BatchPlan) (engine.StepResult, error) {
	if ctx.Done() != nil {
		stop := context.AfterFunc(ctx, func() {
			if abort := r.bgAbort.Load(); abort != nil {
				(*abort)()
			}
		})
		defer stop()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return engine.StepResult{}, fmt.Errorf("%w: closed", ErrRunnerDown)
	}
	if r.sess == nil {
		if err := r.restart(ctx); err != nil {
			return engine.StepResult{}, err
		}
	}
	if r.needReset {
		return engine.StepResult{}, r.voidForRestart()
	}
	s := r.sess
	frame, err := r.enc.AppendStep(s.wbuf[:0], plan)
	if err != nil {
		return engine.StepResult{}, err
	}
	s.wbuf = frame
	if n := len(frame) - 4; n > r.cfg.MaxFrame {
		// The runner would refuse it and close the session. The step fails alone; the
		// runner is told to forget what the step's requests had (see Encoder.Void).
		r.enc.Void(plan)
		return engine.StepResult{}, fmt.Errorf("wire: step %d of %d sequences and %d tokens is a frame of %d bytes, over the runner protocol's limit of %d (Config.MaxFrame, --runner-max-frame): its requests fail, the runner goes on",
			plan.Step, len(plan.ReqIDs), len(plan.Tokens), n, r.cfg.MaxFrame)
	}
	kind, payload, err := s.exchange(ctx, frame, r.cfg.StepTimeout)
	if err != nil && ctx.Err() != nil {
		// The engine is shutting down: the session is cut, nothing died.
		r.sess = nil
		s.kill()
		r.needReset = r.forget != nil
		r.setHealth(fmt.Errorf("%w: step %d cancelled: %w", ErrRunnerDown, plan.Step, context.Cause(ctx)))
		return engine.StepResult{}, err
	}
	if err != nil {
		err = r.died(fmt.Errorf("step %d: %w", plan.Step, err))
		if errors.Is(err, errGone) && r.needReset && !r.cfg.NoRestart {
			// The runner died before this step (a unix runner that died while the engine
			// was idle, or an exec one whose exit was not noticed yet) and never got it:
			// as when the death is noticed between steps, the running requests are
			// recomputed after the restart instead of failing for a death before them.
			return engine.StepResult{}, r.voidForRestart()
		}
		return engine.StepResult{}, err
	}
	r.steps++
	r.sent += uint64(len(frame))
	r.received += uint64(len(payload) + frameHeader)
	switch kind {
	case KindResult:
		step, err := DecodeResult(payload, &r.res)
		if err == nil && step != plan.Step {
			err = fmt.Errorf("%w: result of step %d for step %d", ErrMalformed, step, plan.Step)
		}
		if err != nil {
			return engine.StepResult{}, r.died(err)
		}
		return r.res, nil
	case KindError:
		m, err := DecodeError(payload)
		if err != nil {
			return engine.StepResult{}, r.died(err)
		}
		if m.Code == CodeStepFailed && m.Step == plan.Step {
			return engine.StepResult{}, &m
		}
		return engine.StepResult{}, r.died(&m)
	}
	return engine.StepResult{}, r.died(fmt.Errorf("%w: a %s message in answer to step %d", ErrMalformed, kind, plan.Step))
}

// died ends the session after err and returns the step's error.
func (r *Remote) died(err error) error {
	s := r.sess
	r.sess = nil
	if exit := s.kill(); exit != "" {
		err = fmt.Errorf("%w (%s)", err, exit)
	}
	err = fmt.Errorf("%w: %s: %w", ErrRunnerDied, r.name, err)
	r.needReset = r.forget != nil
	if r.cfg.NoRestart || r.forget == nil {
		r.setHealth(fmt.Errorf("%w: %w", ErrRunnerDown, err))
	} else {
		r.setHealth(fmt.Errorf("%w (restarting): %w", ErrRunnerDown, err))
	}
	r.cfg.Logger.Error("runner died", "runner", r.name, "error", err, "restart", !r.cfg.NoRestart && r.forget != nil)
	r.restartInBackground()
	return err
}

// restartInBackground starts the runner again without waiting for a step (r.mu held).
func (r *Remote) restartInBackground() {
	if r.cfg.NoRestart || r.forget == nil || r.closed || r.bgBusy {
		return
	}
	r.bgBusy = true
	ctx, cancel := context.WithCancel(r.bg)
	r.bgAbort.Store(&cancel)
	r.bgWG.Add(1)
	go func() {
		defer r.bgWG.Done()
		defer cancel()
		for {
			r.mu.Lock()
			if r.closed || r.sess != nil || ctx.Err() != nil {
				r.bgBusy = false
				r.bgAbort.CompareAndSwap(&cancel, nil)
				r.mu.Unlock()
				return
			}
			// restart waits out RestartBackoff since the last start, so a runner that
			// keeps failing to start is retried at that pace.
			r.restart(ctx)
			r.mu.Unlock()
		}
	}()
}

// watch marks the runner down as soon as an exec runner's process exits on its own,
// between steps too, and restarts it.
func (r *Remote) watch(s *session) {
	if s.cmd == nil {
		return
	}
	go func() {
		<-s.exited
		if s.ended.Load() {
			return // the engine ended the session itself
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.sess != s {
			return
		}
		r.died(errors.New("the runner process exited between steps"))
	}()
}

// restart starts a new session, at most once per RestartBackoff.
func (r *Remote) restart(ctx context.Context) error {
	down := r.Health()
	if r.cfg.NoRestart || r.forget == nil {
		return down
	}
	// A runner that dies at once is not restarted in a tight loop: the step waits out the
	// backoff (the queue waits with it) and fails only if the restart does.
	if wait := r.cfg.RestartBackoff - time.Since(r.lastStart); wait > 0 {
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w (restart cancelled: %w)", down, ctx.Err())
		}
	}
	s, err := r.start(ctx)
	if want := r.info; err == nil && !sameInfo(s.info, func() engine.RunnerInfo { want.ExecutesCacheOps = false; return want }()) {
		s.kill()
		err = fmt.Errorf("the restarted runner declares %+v, not %+v as before", s.info, r.info)
	}
	if err != nil {
		err = fmt.Errorf("%w: restart: %w", ErrRunnerDown, err)
		r.setHealth(err)
		r.cfg.Logger.Error("runner restart failed", "runner", r.name, "error", err)
		return err
	}
	r.sess = s
	r.watch(s)
	r.restarts++
	r.cfg.Logger.Info("runner restarted", "runner", r.name, "restarts", r.restarts)
	return nil
}

func sameInfo(a, b engine.RunnerInfo) bool {
	return fmt.Sprint(a) == fmt.Sprint(b)
}

// Close asks the runner to shut down and waits for an exec runner to exit (killing it
// after a grace period).
func (r *Remote) Close() error {
	r.bgCancel()
	defer r.bgWG.Wait()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	r.setHealth(fmt.Errorf("%w: closed", ErrRunnerDown))
	if r.sess == nil {
		return nil
	}
	s := r.sess
	r.sess = nil
	s.ended.Store(true)
	if s.wd != nil {
		s.wd.SetWriteDeadline(time.Now().Add(time.Second))
	}
	s.w.Write(AppendShutdown(nil))
	s.closeWrite()
	if s.cmd != nil {
		select {
		case <-s.exited:
		case <-time.After(5 * time.Second):
		}
	}
	s.kill()
	return nil
}

// envPrefix matches a command line that starts with an environment assignment.
var envPrefix = regexp.MustCompile(`^\s*[A-Za-z_][A-Za-z0-9_]*=`)

// redactSpec is spec with the value of each VAR=value word that starts an exec command
// line replaced by "***". Such words are how a runner is given credentials (an access
// token for its weights' hub, say), and the runner's name reaches clients: the errors of
// the requests a dead runner fails, and /health, which no API key guards.
func redactSpec(spec string) string {
	scheme, rest, err := ParseSpec(spec)
	if err != nil || scheme != "exec" {
		return spec
	}
	var b strings.Builder
	b.WriteString("exec:")
	for {
		loc := envPrefix.FindStringIndex(rest)
		if loc == nil {
			break
		}
		b.WriteString(rest[:loc[1]])
		b.WriteString("***")
		rest = rest[loc[1]+shellWordLen(rest[loc[1]:]):]
	}
	b.WriteString(rest)
	return b.String()
}

// shellWordLen is the length of the shell word at the start of s: up to the first
// whitespace outside quotes ('...', "...", and backslash escapes).
func shellWordLen(s string) int {
	var quote byte
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case quote == '\'':
			if c == '\'' {
				quote = 0
			}
		case c == '\\':
			i++
		case quote == '"':
			if c == '"' {
				quote = 0
			}
		case c == '\'' || c == '"':
			quote = c
		case c == ' ' || c == '\t' || c == '\n':
			return i
		}
	}
	return len(s)
}

// session is one connection to one runner process.
type session struct {
	fr     *FrameReader
	w      io.Writer
	rd     Deadliner      // the read side, for deadlines (nil: none)
	wd     writeDeadliner // the write side, for deadlines (nil: none)
	ended  atomic.Bool    // the engine ended the session (kill or Close)
	closer []io.Closer
	cmd    *exec.Cmd
	exited chan struct{}
	exit   error
	info   engine.RunnerInfo
	wbuf   []byte
}

// start launches or connects to the runner and does the handshake.
func (r *Remote) start(ctx context.Context) (*session, error) {
	r.lastStart = time.Now()
	scheme, rest, _ := ParseSpec(r.cfg.Spec)
	s := &session{}
	switch scheme {
	case "exec":
		inR, inW, err := os.Pipe()
		if err != nil {
			return nil, err
		}
		outR, outW, err := os.Pipe()
		if err != nil {
			inR.Close()
			inW.Close()
			return nil, err
		}
		// exec: the shell becomes the runner, so the runner is the child the engine
		// supervises and kills. Leading VAR=value words go through env, which exec takes.
		line := "exec " + rest
		if envPrefix.MatchString(rest) {
			line = "exec env " + rest
		}
		cmd := exec.Command("/bin/sh", "-c", line)
		cmd.Stdin, cmd.Stdout, cmd.Stderr = inR, outW, r.cfg.Stderr
		ownGroup(cmd)
		s.exited = make(chan struct{})
		err = startSupervised(cmd, func(err error) { s.exit = err; close(s.exited) })
		inR.Close()
		outW.Close()
		if err != nil {
			inW.Close()
			outR.Close()
			return nil, fmt.Errorf("start runner %s: %w", r.name, err)
		}
		s.cmd = cmd
		s.fr, s.w, s.rd, s.wd = NewFrameReader(outR, r.cfg.MaxFrame), inW, outR, inW
		s.closer = []io.Closer{inW, outR}
	case "unix":
		var dl net.Dialer
		c, err := dl.DialContext(ctx, "unix", rest)
		if err != nil {
			if fi, serr := os.Stat(rest); serr == nil && fi.Mode()&os.ModeSocket == 0 {
				err = fmt.Errorf("%w (%s is not a socket: a runner listens with --listen unix:PATH)", err, rest)
			}
			return nil, fmt.Errorf("connect to runner: %w", err)
		}
		s.fr, s.w, s.rd, s.wd = NewFrameReader(c, r.cfg.MaxFrame), c, c, c
		s.closer = []io.Closer{c}
	}
	hello := AppendHello(nil, Hello{Version: Version, MaxFrame: uint32(r.cfg.MaxFrame), Caps: CapCacheOps | CapReleases | CapTokenMasks})
	kind, payload, err := s.exchange(ctx, hello, r.cfg.HandshakeTimeout)
	if err != nil {
		return nil, r.startFailed(s, fmt.Errorf("handshake: %w", err))
	}
	switch kind {
	case KindInfo:
		m, err := DecodeInfo(payload)
		if err != nil {
			return nil, r.startFailed(s, err)
		}
		s.info = m.Runner
	case KindError:
		m, err := DecodeError(payload)
		if err == nil {
			err = &m
		}
		return nil, r.startFailed(s, fmt.Errorf("handshake refused: %w", err))
	default:
		return nil, r.startFailed(s, fmt.Errorf("%w: a %s message in answer to hello", ErrMalformed, kind))
	}
	r.setHealth(nil)
	return s, nil
}

func (r *Remote) startFailed(s *session, err error) error {
	if exit := s.kill(); exit != "" {
		err = fmt.Errorf("%w (%s)", err, exit)
	}
	return fmt.Errorf("runner %s: %w", r.name, err)
}

type writeDeadliner interface {
	SetWriteDeadline(t time.Time) error
}

// exchange writes frame and reads the answer, both within timeout (a runner that stops
// reading blocks the write once the pipe or socket buffer is full); cancelling ctx cuts
// the wait short.
func (s *session) exchange(ctx context.Context, frame []byte, timeout time.Duration) (Kind, []byte, error) {
	deadline := time.Now().Add(timeout)
	if s.rd != nil {
		if err := s.rd.SetReadDeadline(deadline); err != nil {
			return 0, nil, err
		}
	}
	if s.wd != nil {
		if err := s.wd.SetWriteDeadline(deadline); err != nil {
			return 0, nil, err
		}
	}
	if ctx.Done() != nil {
		stop := context.AfterFunc(ctx, func() {
			if s.rd != nil {
				s.rd.SetReadDeadline(time.Now())
			}
			if s.wd != nil {
				s.wd.SetWriteDeadline(time.Now())
			}
		})
		defer stop()
	}
	explain := func(err error) error {
		switch {
		case ctx.Err() != nil:
			return fmt.Errorf("%w (%w)", err, ctx.Err())
		case errors.Is(err, os.ErrDeadlineExceeded):
			return fmt.Errorf("timed out after %v: %w", timeout, err)
		case errors.Is(err, io.EOF):
			return fmt.Errorf("the runner closed the stream without answering: %w", err)
		}
		return err
	}
	if _, err := s.w.Write(frame); err != nil {
		if errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET) {
			// What the runner wrote before it closed says more (a log line on stdout,
			// an Error frame) than the broken pipe does.
			if _, _, rerr := s.fr.Read(); rerr != nil && !errors.Is(rerr, io.EOF) && !errors.Is(rerr, io.ErrUnexpectedEOF) {
				return 0, nil, fmt.Errorf("send: %w: %w; it had written: %w", errGone, err, rerr)
			}
			err = fmt.Errorf("%w: %w", errGone, err)
		}
		return 0, nil, fmt.Errorf("send: %w", explain(err))
	}
	k, payload, err := s.fr.Read()
	if err != nil {
		return 0, nil, fmt.Errorf("read the answer: %w", explain(err))
	}
	return k, payload, nil
}

func (s *session) closeWrite() {
	if len(s.closer) > 1 {
		s.closer[0].Close() // the child's stdin: it sees EOF
	}
}

// kill closes the session and kills an exec runner, returning how it exited ("" when
// unknown).
func (s *session) kill() string {
	s.ended.Store(true)
	for _, c := range s.closer {
		c.Close()
	}
	if s.cmd == nil {
		return ""
	}
	// The whole group, even when the runner exited on its own: what it started may not
	// have (the group's id stays the runner's pid while any member is left).
	killGroup(s.cmd)
	<-s.exited
	if s.exit == nil {
		return "exited with status 0"
	}
	return s.exit.Error()
}

// startSupervised starts cmd and waits for it on one goroutine that holds its OS thread
// from before the start until the runner has exited, then calls done with Wait's error.
// Linux sends the parent-death signal (dieWithEngine) when the thread that started the
// child ends, not the process: Go ends a thread when a goroutine locked to it exits, so
// a runner started from any thread could be killed the day another goroutine (a cgo
// library's) locked that thread and returned. This thread is locked to a goroutine that
// only returns after the runner, so it ends with the engine's process alone.
func startSupervised(cmd *exec.Cmd, done func(error)) error {
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		done(cmd.Wait())
	}()
	return <-started
}
