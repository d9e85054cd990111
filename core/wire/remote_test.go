package wire_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/engine/enginetest"
	"github.com/resin-llm/resin/core/wire"
)

// goRunner serves fresh enginetest runners on a Unix socket, one per connection, as a
// runner process restarted by its supervisor would: each starts with an empty cache.
// The enginetest runner keeps its model state in its cache pages, so any table, slot or
// cache op the protocol got wrong, or any page the engine trusted after a restart,
// changes the generated tokens.
type goRunner struct {
	t     *testing.T
	cfg   enginetest.Config
	path  string
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
	runs  []*enginetest.Runner
	dieAt int // the first runner dies while it executes its dieAt-th step (0: never)
}

func newGoRunner(t *testing.T, cfg enginetest.Config) *goRunner {
	t.Helper()
	g := &goRunner{t: t, cfg: cfg, path: filepath.Join(t.TempDir(), "runner.sock")}
	ln, err := net.Listen("unix", g.path)
	if err != nil {
		t.Fatal(err)
	}
	g.ln = ln
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			tr, err := enginetest.New(cfg)
			if err != nil {
				t.Error(err)
				c.Close()
				return
			}
			g.mu.Lock()
			var run engine.Runner = tr
			if g.dieAt > 0 && len(g.runs) == 0 {
				run = &dyingRunner{Runner: tr, at: g.dieAt, die: func() { c.Close() }}
			}
			g.conns, g.runs = append(g.conns, c), append(g.runs, tr)
			g.mu.Unlock()
			go func() {
				defer c.Close()
				wire.Serve(context.Background(), c, c, run, wire.ServeOptions{})
			}()
		}
	}()
	return g
}

// dyingRunner dies (closes its connection, as its process dying would) while it executes
// its at-th step: after it read the step, before it answers. The death hits a known step,
// whatever the scheduling of the goroutines; a test that kills the runner once it has seen
// a stream's first event may find the stream already ended (a late reader gets every token
// and the terminal event in one event), or every request done.
type dyingRunner struct {
	*enginetest.Runner
	steps, at int
	die       func()
}

func (d *dyingRunner) Execute(ctx context.Context, p *engine.BatchPlan) (engine.StepResult, error) {
	if d.steps++; d.steps == d.at {
		d.die()
	}
	return d.Runner.Execute(ctx, p)
}

// dieDuring makes the first runner die while it executes its step-th step.
func (g *goRunner) dieDuring(step int) {
	g.mu.Lock()
	g.dieAt = step
	g.mu.Unlock()
}

// kill closes the connection of the runner in use, as its process dying would.
func (g *goRunner) kill() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.conns[len(g.conns)-1].Close()
}

func (g *goRunner) errs() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, r := range g.runs {
		if err := r.Err(); err != nil {
			return err
		}
	}
	return nil
}

// startEngine dials the runner and runs an engine over it whose pool has the runner's
// geometry (a twin enginetest runner's pool).
func startEngine(t *testing.T, g *goRunner, cfg engine.Config, wc wire.Config) (*engine.Engine, *wire.Remote) {
	t.Helper()
	wc.Spec = "unix:" + g.path
	if wc.RestartBackoff == 0 {
		wc.RestartBackoff = time.Nanosecond
	}
	e, r, _ := startRemote(t, wc, g.cfg, cfg)
	return e, r
}

// startRemote dials wc and runs an engine of cfg on it, its pool shaped as twin's; stop
// shuts both down, once (t's cleanup calls it too).
func startRemote(t *testing.T, wc wire.Config, twin enginetest.Config, cfg engine.Config) (e *engine.Engine, r *wire.Remote, stop func()) {
	t.Helper()
	return startRemoteQueued(t, wc, twin, cfg, nil)
}

// startRemoteQueued is startRemote that calls queue (unless nil) before the engine runs:
// what it submits is all queued when the first step is planned, so which requests run in
// which step does not depend on how the test's goroutine is scheduled.
func startRemoteQueued(t *testing.T, wc wire.Config, twin enginetest.Config, cfg engine.Config, queue func(*engine.Engine, *wire.Remote)) (e *engine.Engine, r *wire.Remote, stop func()) {
	t.Helper()
	r, err := wire.Dial(context.Background(), wc)
	if err != nil {
		t.Fatal(err)
	}
	tw, err := enginetest.New(twin)
	if err != nil {
		r.Close()
		t.Fatal(err)
	}
	cfg.Pool = tw.Pool()
	if e, err = engine.New(r, cfg); err != nil {
		r.Close()
		t.Fatal(err)
	}
	r.Attach(e)
	if queue != nil {
		queue(e, r)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	stop = sync.OnceFunc(func() {
		e.Close()
		cancel()
		<-done
		r.Close()
	})
	t.Cleanup(stop)
	return e, r, stop
}

// submitAll submits one greedy request of n tokens (EOS ignored) per prompt.
func submitAll(t *testing.T, e *engine.Engine, prompts [][]int32, n int) []*engine.Stream {
	t.Helper()
	streams := make([]*engine.Stream, len(prompts))
	for i, p := range prompts {
		st, err := e.Submit(context.Background(), engine.Request{Prompt: p, Sampling: engine.SamplingParams{MaxTokens: n, IgnoreEOS: true}})
		if err != nil {
			t.Fatal(err)
		}
		streams[i] = st
	}
	return streams
}

func prompt(rng *rand.Rand, prefix []int32, n, vocab int) []int32 {
	p := slices.Clone(prefix)
	for range n {
		p = append(p, int32(rng.IntN(vocab)))
	}
	return p
}

// TestRemoteMatchesReference runs many requests through the protocol against a runner
// that checks its cache: shared prefixes (prefix hits), a pool small enough to preempt,
// a sliding-window mirror group (tables whose old entries are dropped) and a recurrent
// group (state checkpoints restored by cache ops). Every output must be the reference's.
func TestRemoteMatchesReference(t *testing.T) {
	cfg := enginetest.Config{VocabSize: 200, Pages: 24, Mirror: true, Recurrent: true}
	g := newGoRunner(t, cfg)
	e, r := startEngine(t, g, engine.Config{MaxBatchTokens: 256, MaxSeqs: 16}, wire.Config{})
	rng := rand.New(rand.NewPCG(1, 2))
	shared := prompt(rng, nil, 40, cfg.VocabSize)
	type job struct {
		p  []int32
		n  int
		st *engine.Stream
	}
	var jobs []*job
	for i := range 24 {
		var p []int32
		if i%2 == 0 {
			p = prompt(rng, shared, 3+rng.IntN(20), cfg.VocabSize)
		} else {
			p = prompt(rng, nil, 5+rng.IntN(60), cfg.VocabSize)
		}
		jobs = append(jobs, &job{p: p, n: 10 + rng.IntN(40)})
	}
	// The first wave fills the prefix cache; the second hits it under pressure.
	for wave := range 2 {
		for _, j := range jobs[wave*12 : wave*12+12] {
			st, err := e.Submit(context.Background(), engine.Request{Prompt: j.p, Sampling: engine.SamplingParams{MaxTokens: j.n, IgnoreEOS: true}})
			if err != nil {
				t.Fatal(err)
			}
			j.st = st
		}
		for _, j := range jobs[wave*12 : wave*12+12] {
			got, ev, err := j.st.Collect(context.Background())
			if err != nil || ev.Finish != engine.FinishLength {
				t.Fatalf("request ended with %v (%v): %v", ev.Finish, ev.Err, err)
			}
			want := enginetest.Reference(cfg.VocabSize, j.p, j.n, engine.SamplingRow{Logprobs: -1})
			if !slices.Equal(got, want) {
				t.Fatalf("tokens %v, want %v", got, want)
			}
		}
	}
	if err := g.errs(); err != nil {
		t.Fatalf("the runner saw a wrong cache: %v", err)
	}
	// One more step delivers the last release notices: then only its own request's tables
	// are held on either side.
	st, err := e.Submit(context.Background(), engine.Request{Prompt: []int32{1, 2}, Sampling: engine.SamplingParams{MaxTokens: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.Collect(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := r.Tracked(); n > 1 {
		t.Fatalf("the engine still shadows the tables of %d requests after all finished: release notices are lost", n)
	}
	c := e.Counters()
	if c.PrefixHits == 0 || c.Preemptions == 0 {
		t.Fatalf("the run had %d prefix hits and %d preemptions; the test needs both", c.PrefixHits, c.Preemptions)
	}
	ops, released := g.runs[0].CacheOps()
	t.Logf("prefix hits %d, preemptions %d, cache ops %d, releases %d, restarts %d", c.PrefixHits, c.Preemptions, ops, released, r.Restarts())
	if ops == 0 {
		t.Fatalf("no cache op crossed the protocol (the recurrent group's restores should)")
	}
}

// collectAfterDeath collects streams, whose runner was killed, and returns how many failed
// with a wrapped ErrRunnerDied and how many completed (n tokens, each prompts[i]'s
// reference in a vocabulary of vocab); it fails t on any other end.
func collectAfterDeath(t *testing.T, streams []*engine.Stream, prompts [][]int32, vocab, n int) (failed, done int) {
	t.Helper()
	for i, st := range streams {
		got, ev, err := st.Collect(context.Background())
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		switch ev.Finish {
		case engine.FinishError:
			if !errors.Is(ev.Err, wire.ErrRunnerDied) || !errors.Is(ev.Err, engine.ErrRunner) {
				t.Fatalf("request %d failed with %v, want a wrapped ErrRunnerDied", i, ev.Err)
			}
			failed++
		case engine.FinishLength:
			want := enginetest.Reference(vocab, prompts[i], n, engine.SamplingRow{Logprobs: -1})
			if !slices.Equal(got, want) {
				t.Fatalf("request %d completed with tokens that differ from the reference:\n got %v\nwant %v", i, got, want)
			}
			done++
		default:
			t.Fatalf("request %d ended with %v: %v", i, ev.Finish, ev.Err)
		}
	}
	return failed, done
}

// TestRemoteRunnerDies kills the runner in the middle of a decode (in its fifth step, the
// first two requests decoding): the requests of the step in flight fail with
// ErrRunnerDied, /health's source reports it, the runner is restarted with an empty cache,
// and the queued requests complete exactly as the reference says (so the engine did not
// reuse a page the new runner does not hold).
func TestRemoteRunnerDies(t *testing.T) {
	cfg := enginetest.Config{VocabSize: 200, Pages: 256}
	g := newGoRunner(t, cfg)
	g.dieDuring(5)
	rng := rand.New(rand.NewPCG(3, 4))
	shared := prompt(rng, nil, 48, cfg.VocabSize)
	var prompts [][]int32
	for range 5 {
		prompts = append(prompts, prompt(rng, shared, 4, cfg.VocabSize))
	}
	var streams []*engine.Stream
	// The runner dies well within the restart backoff of its start: the restart waits for
	// it rather than failing the queue. All five are queued before the first step, which
	// prefills the first two: they decode in the fifth.
	wc := wire.Config{Spec: "unix:" + g.path, RestartBackoff: 300 * time.Millisecond}
	_, r, _ := startRemoteQueued(t, wc, cfg, engine.Config{MaxBatchTokens: 256, MaxSeqs: 2}, func(e *engine.Engine, _ *wire.Remote) {
		streams = submitAll(t, e, prompts, 200)
	})
	failed, done := collectAfterDeath(t, streams, prompts, cfg.VocabSize, 200)
	// The runner had read the step: its two requests fail, the three queued complete.
	if failed != 2 || done != 3 {
		t.Fatalf("%d requests failed and %d completed; want the 2 of the step in flight failed, the other 3 completed", failed, done)
	}
	if r.Restarts() != 1 || r.Health() != nil {
		t.Fatalf("restarts %d, health %v; want one restart and a healthy runner", r.Restarts(), r.Health())
	}
	if err := g.errs(); err != nil {
		t.Fatalf("a runner saw a wrong cache: %v", err)
	}
}

// TestRemoteStaysDown: with NoRestart a dead runner stays down, says so through Health,
// and every later request fails with ErrRunnerDown instead of hanging.
func TestRemoteStaysDown(t *testing.T) {
	cfg := enginetest.Config{VocabSize: 100}
	g := newGoRunner(t, cfg)
	e, r := startEngine(t, g, engine.Config{}, wire.Config{NoRestart: true})
	run := func() engine.Event {
		st, err := e.Submit(context.Background(), engine.Request{Prompt: []int32{1, 2, 3}, Sampling: engine.SamplingParams{MaxTokens: 4}})
		if err != nil {
			t.Fatal(err)
		}
		_, ev, err := st.Collect(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return ev
	}
	if ev := run(); ev.Finish == engine.FinishError {
		t.Fatalf("healthy runner: %v", ev.Err)
	}
	g.kill()
	if ev := run(); ev.Finish != engine.FinishError || !errors.Is(ev.Err, wire.ErrRunnerDied) {
		t.Fatalf("the step during which the runner died ended with %v: %v", ev.Finish, ev.Err)
	}
	if err := r.Health(); !errors.Is(err, wire.ErrRunnerDown) {
		t.Fatalf("health %v, want ErrRunnerDown", err)
	}
	if ev := run(); ev.Finish != engine.FinishError || !errors.Is(ev.Err, wire.ErrRunnerDown) {
		t.Fatalf("a request after the death ended with %v: %v", ev.Finish, ev.Err)
	}
	if r.Restarts() != 0 {
		t.Fatalf("%d restarts with NoRestart", r.Restarts())
	}
}

// TestDialErrors: bad specs and runners that refuse the handshake give clear errors.
func TestDialErrors(t *testing.T) {
	for _, c := range []struct{ spec, want string }{
		{"python -m x", "want exec:COMMAND or unix:PATH"},
		{"tcp:1.2.3.4:5", "unknown scheme"},
		{"unix:" + filepath.Join(t.TempDir(), "none.sock"), "connect to runner"},
		{"exec:sh -c 'exit 3'", "exit status 3"},
		{"exec:RESIN_X=1 sh -c 'exit $RESIN_X$RESIN_X'", "exit status 11"}, // env assignments lead the line
		{"exec:echo not a frame", "handshake"},
		// A runner that logs to stdout is told so, quoting the text.
		{"exec:echo Loading weights", `"Load"`},
		{"exec:echo Loading weights", "never stdout"},
		// A path that is there but is no socket is named as such.
		{"unix:" + os.Args[0], "is not a socket"},
		{"exec:sh -c 'head -c 3 >/dev/null; exit 0'", "closed the stream without answering"},
	} {
		_, err := wire.Dial(context.Background(), wire.Config{Spec: c.spec, HandshakeTimeout: 5 * time.Second})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Dial(%q) = %v, want an error saying %q", c.spec, err, c.want)
		}
	}
}

// TestDialTimeout: a runner that never answers the handshake is given up on after
// HandshakeTimeout, not waited for forever.
func TestDialTimeout(t *testing.T) {
	_, err := wire.Dial(context.Background(), wire.Config{Spec: "exec:sleep 30", HandshakeTimeout: 200 * time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), "timeout") {
		t.Fatalf("Dial of a silent runner: %v, want a timeout", err)
	}
}
