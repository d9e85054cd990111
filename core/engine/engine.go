package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/resin-llm/resin/core/kvslab"
)

// Policy orders the waiting queue.
type Policy uint8

// Scheduling policies.
const (
	// PolicyFCFS serves waiting requests by arrival.
	PolicyFCFS Policy = iota
	// PolicyPriority serves lower Request.Priority values first, then by arrival, and
	// preempts the lowest-priority running request first.
	PolicyPriority
)

// Config sets the engine's limits. Zero values take the defaults noted.
type Config struct {
	// MaxBatchTokens is the per-step token budget (default 8192, at most 1<<24).
	MaxBatchTokens int
	// MaxSeqs caps the sequences in one step (default 256, at most 1<<20).
	MaxSeqs int
	// MaxQueue caps the waiting requests; Submit beyond it returns ErrQueueFull
	// (default 0 = no cap).
	MaxQueue int
	// Policy orders the waiting queue (default PolicyFCFS).
	Policy Policy
	// Async builds the next plan while the runner executes the current one. It needs a
	// runner that declares AsyncTokens. With a runner that proposes drafts, a plan is
	// built ahead only while the plan in flight samples nothing (prompt chunks): where
	// and with which drafts a sequence continues depends on how many drafts the step in
	// flight accepts, so such steps are planned after it (see Scheduler.Schedule).
	Async bool
	// Pool is the cache pool, built with the runner's cache groups. Nil: New builds one in
	// host memory of CacheBytes bytes (default 256 MiB).
	Pool       *kvslab.Pool
	CacheBytes int64
	// Registry receives the engine's metrics (names start with resin_, and the same
	// under vLLM's names, which start with vllm:). Nil: New makes a fresh registry,
	// returned by Engine.Registry.
	Registry *prometheus.Registry
	// EngineLabel is the value of the "engine" label on the engine's metrics: vLLM's
	// names carry it always ("0" when empty, as vLLM's one engine), Resin's only when it
	// is set. Engines sharing one Registry (the dp ranks' under --dp, vLLM's engine
	// index) each set their own, so that their series stay apart.
	EngineLabel string
	// CheckPrompt, when set, refuses prompts as a PromptChecker runner does, besides the
	// runner's own check: for a runner wrapped so that its model's check is not seen (a
	// parallel layout's rank 0, a data-parallel rank's forward).
	CheckPrompt func(prompt []int32) error
}

// Option changes how New builds an Engine.
type Option func(*options)

type options struct {
	now func() time.Time
}

// WithClock replaces time.Now for the engine's latency metrics (tests).
func WithClock(now func() time.Time) Option { return func(o *options) { o.now = now } }

// Engine runs a Scheduler and a Runner: Submit and Abort may be called from any
// goroutine; Run is the loop that executes steps.
type Engine struct {
	runner      Runner
	checkPrompt func([]int32) error // Config.CheckPrompt
	info        RunnerInfo
	reg         *prometheus.Registry
	now         func() time.Time

	mu       sync.Mutex
	s        *Scheduler
	draining bool
	closed   bool
	drained  chan struct{} // closed once draining and empty
	nextID   uint64
	seeds    uint64

	wake    chan struct{}
	closeCh chan struct{}
	running atomic.Bool

	// dead is closed, and deadErr set, at the first step error that is permanent (Err).
	dead     chan struct{}
	deadErr  atomic.Pointer[error]
	deadOnce sync.Once
}

// ErrRunnerDead: the runner failed for good (a permanent step error, see Engine.Err);
// Submit wraps it with the cause once that happened (HTTP 503).
var ErrRunnerDead = errors.New("engine: the runner is dead")

// Err returns the first step error that is permanent, nil while there is none. An error
// is permanent when errors.As finds in it an error with a method Permanent() bool that
// returns true: a rank of a tensor/expert-parallel group whose process died
// (core/dist/launch's ExitError) cannot run another step, unlike a step that failed once.
// From then on Submit refuses requests with ErrRunnerDead; the steps of those already
// running fail as the runner makes them. A server should report itself unhealthy and stop
// (core/serve does, through Dead), as vLLM does on its engine-dead error.
func (e *Engine) Err() error {
	if p := e.deadErr.Load(); p != nil {
		return *p
	}
	return nil
}

// Dead is closed when Err becomes non-nil.
func (e *Engine) Dead() <-chan struct{} { return e.dead }

// notePermanent records err as Err if it is permanent (the first such only).
func (e *Engine) notePermanent(err error) {
	var p interface{ Permanent() bool }
	if err == nil || !errors.As(err, &p) || !p.Permanent() {
		return
	}
	e.deadOnce.Do(func() {
		e.deadErr.Store(&err)
		close(e.dead)
	})
}

// New builds an engine for runner. The runner's description is validated, and the pool
// (given or built) must hold the runner's cache groups.
func New(runner Runner, cfg Config, opts ...Option) (*Engine, error) {
	if runner == nil {
		return nil, errors.New("engine: nil runner")
	}
	o := options{now: time.Now}
	for _, opt := range opts {
		opt(&o)
	}
	info := runner.Info()
	if err := info.validate(); err != nil {
		return nil, err
	}
	if cfg.Pool == nil {
		pool, err := NewHostPool(info.CacheGroups, cfg.CacheBytes)
		if err != nil {
			return nil, fmt.Errorf("engine: build cache pool for %q: %w", info.Name, err)
		}
		cfg.Pool = pool
	}
	reg := cfg.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	e := &Engine{
		runner:      runner,
		checkPrompt: cfg.CheckPrompt,
		info:        info,
		reg:         reg,
		now:         o.now,
		drained:     make(chan struct{}),
		seeds:       uint64(o.now().UnixNano()),
		wake:        make(chan struct{}, 1),
		closeCh:     make(chan struct{}),
		dead:        make(chan struct{}),
	}
	s, err := NewScheduler(info, cfg)
	if err != nil {
		return nil, err
	}
	s.now, s.epoch = o.now, o.now()
	e.s = s
	if c := s.MaxContext(); c < info.MaxContext {
		slog.Warn("engine: the cache pool cannot hold one sequence of the model's maximum context; capping the context",
			"runner", info.Name, "max_context", info.MaxContext, "capped_to", c,
			"pool_bytes", int64(cfg.Pool.Slabs())*cfg.Pool.SlabBytes())
		e.info.MaxContext = c
	}
	if err := reg.Register(newCollector(s.metrics, &e.mu, s, cfg.EngineLabel)); err != nil {
		return nil, fmt.Errorf("engine: register metrics: %w", err)
	}
	if d, ok := runner.(RunnerDeath); ok {
		if died := d.Died(); died != nil {
			go func() {
				select {
				case <-died:
					// A permanent Health error (a worker's exit) kills the engine now; nil
					// (the ranks stopped with the engine) does nothing.
					e.notePermanent(d.Health())
				case <-e.closeCh:
				}
			}()
		}
	}
	return e, nil
}

// RunnerDeath is what a Runner whose ranks run in processes that can exit between steps
// (core/dist/launch's workers) may implement: Died is closed when one exited (or all did,
// stopped), and Health then returns the exit (nil for a stop). The engine takes a
// permanent Health error as the runner's death at once (Err, Dead: a server reports it
// and shuts down while idle) instead of at the next request's step.
type RunnerDeath interface {
	Died() <-chan struct{}
	Health() error
}

// DefaultCacheBytes is the host pool NewHostPool builds when given no size, cut to the
// slabs a page id addresses (as kvslab.Size counts a budget) where its slabs are small.
const DefaultCacheBytes = 256 << 20

// NewHostPool builds a kvslab pool for groups in a host arena of bytes bytes (0 =
// DefaultCacheBytes). A size given that is more slabs than a page id addresses is refused.
func NewHostPool(groups []kvslab.GroupSpec, bytes int64) (*kvslab.Pool, error) {
	if len(groups) == 0 {
		return nil, errors.New("engine: the runner declares no cache groups and no pool was given")
	}
	cfg := kvslab.Config{Groups: groups}
	if bytes == 0 {
		z, err := kvslab.Size(cfg, DefaultCacheBytes, 1)
		if err != nil {
			return nil, err
		}
		bytes = int64(z.Slabs) * z.SlabBytes // Size's clamp: at most MaxSlabs slabs
	}
	// Check what kvslab.New would refuse before allocating the arena: a budget with more
	// slabs than page ids address dies of out-of-memory before New can say so.
	z, err := kvslab.Size(cfg, bytes, 1)
	if err != nil {
		return nil, err
	}
	if n := bytes / z.SlabBytes; n > kvslab.MaxSlabs {
		return nil, fmt.Errorf("%w: a pool of %d bytes is %d slabs of %d bytes, more than the %d a page id can address",
			kvslab.ErrInvalidSpec, bytes, n, z.SlabBytes, kvslab.MaxSlabs)
	}
	arena, err := kvslab.NewHostArena(bytes)
	if err != nil {
		return nil, err
	}
	return kvslab.New(cfg, arena)
}

// Pool returns the engine's cache pool. It is not safe for concurrent use: touch it only
// while Run is stopped, or from the runner during Execute for reads.
func (e *Engine) Pool() *kvslab.Pool { return e.s.pool }

// Info returns the runner's description, with MaxContext capped to what the cache pool
// holds (see Scheduler.MaxContext).
func (e *Engine) Info() RunnerInfo { return e.info }

// Registry returns the registry holding the engine's metrics.
func (e *Engine) Registry() *prometheus.Registry { return e.reg }

// Stats is a snapshot of the engine's queues.
type Stats struct {
	Running, Waiting int
}

// Stats returns the number of running and waiting requests.
func (e *Engine) Stats() Stats {
	e.mu.Lock()
	defer e.mu.Unlock()
	return Stats{Running: len(e.s.running), Waiting: e.s.waiting.len()}
}

// Counters returns the scheduler's running totals (tokens, prefix hits, preemptions,
// drafts, finishes by reason).
func (e *Engine) Counters() Counters {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.s.Counters()
}

// Submit queues req and returns its stream. Cancelling ctx aborts the request. A runner
// that is a PromptChecker, or Config.CheckPrompt, may refuse the prompt
// (ErrInvalidRequest). Errors:
// ErrInvalidRequest, ErrContextTooLong, ErrQueueFull, ErrDraining, ErrClosed,
// ErrDuplicateID, ErrRunnerDead (all wrapped with detail).
func (e *Engine) Submit(ctx context.Context, req Request) (*Stream, error) {
	if err := checkConstraint(e.info, &req.Sampling); err != nil {
		return nil, err
	}
	if pc, ok := e.runner.(PromptChecker); ok {
		if err := pc.CheckPrompt(req.Prompt); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidRequest, err)
		}
	}
	if e.checkPrompt != nil {
		if err := e.checkPrompt(req.Prompt); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidRequest, err)
		}
	}
	if err := e.Err(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrRunnerDead, err)
	}
	e.mu.Lock()
	switch {
	case e.closed:
		e.mu.Unlock()
		return nil, ErrClosed
	case e.draining:
		e.mu.Unlock()
		return nil, ErrDraining
	}
	if req.ID == "" {
		e.nextID++
		req.ID = "req-" + strconv.FormatUint(e.nextID, 10)
	}
	if !req.Sampling.HasSeed {
		e.seeds++
		req.Sampling.Seed, req.Sampling.HasSeed = mix64(e.seeds), true
	}
	if req.Arrival.IsZero() {
		req.Arrival = e.now()
	}
	st := newStream(req.ID)
	if err := e.s.Add(req, (*streamOutput)(st)); err != nil {
		e.mu.Unlock()
		return nil, err
	}
	e.mu.Unlock()
	e.signal()
	if ctx.Done() != nil {
		id := req.ID
		stop := context.AfterFunc(ctx, func() {
			e.mu.Lock()
			e.s.abortOutput(id, (*streamOutput)(st), fmt.Errorf("%w: %w", ErrAborted, context.Cause(ctx)))
			e.afterChange()
			e.mu.Unlock()
		})
		st.mu.Lock()
		if st.finish != FinishNone {
			st.mu.Unlock()
			stop()
		} else {
			st.stopWatch = stop
			st.mu.Unlock()
		}
	}
	return st, nil
}

// Abort ends request id with finish reason abort and frees its cache pages at once. It
// reports whether the request was in flight.
func (e *Engine) Abort(id string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	ok := e.s.Abort(id)
	e.afterChange()
	return ok
}

// Stop finishes request id with reason stop (its pages are freed at once, and the
// finish is counted as a stop, not an abort): for stop conditions found outside the
// engine, such as a stop string in the detokenized text. It reports whether id was in
// flight.
func (e *Engine) Stop(id string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	ok := e.s.Stop(id)
	e.afterChange()
	return ok
}

// Run executes steps until ctx is done (returning ctx's error) or Close is called
// (returning nil). Only one Run may be active at a time.
func (e *Engine) Run(ctx context.Context) error {
	if !e.running.CompareAndSwap(false, true) {
		return errors.New("engine: Run is already running")
	}
	defer e.running.Store(false)
	if e.s.cfg.Async {
		return e.runAsync(ctx)
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-e.closeCh:
			return nil
		default:
		}
		t0 := time.Now()
		e.mu.Lock()
		plan := e.s.Schedule()
		if plan != nil {
			e.s.FillTokenMasks(plan)
		}
		e.mu.Unlock()
		if plan == nil {
			select {
			case <-e.wake:
			case <-ctx.Done():
				return ctx.Err()
			case <-e.closeCh:
				return nil
			}
			continue
		}
		t1 := time.Now()
		tokens := plan.NumTokens()
		res, err := e.execute(ctx, plan)
		t2 := time.Now()
		e.mu.Lock()
		if err != nil && ctx.Err() != nil {
			// Shutting down: the step did not happen; the requests stay queued.
			err = e.s.Rollback(plan)
		} else {
			err = e.s.Update(plan, res, err)
		}
		if err != nil {
			// Only a plan the scheduler did not hand out gets here, which this loop rules out.
			e.mu.Unlock()
			return err
		}
		e.afterChange()
		t3 := time.Now()
		e.s.metrics.observeStep(t1.Sub(t0)+t3.Sub(t2), t2.Sub(t1), tokens)
		e.mu.Unlock()
	}
}

// stepOut is what the runner goroutine of runAsync reports for one plan.
type stepOut struct {
	res StepResult
	err error
	dur time.Duration
}

// runAsync is Run with Config.Async: a goroutine executes plan N while this one builds
// plan N+1 (whose unknown tokens are PendingToken), then applies N's result and hands
// N+1 over.
func (e *Engine) runAsync(ctx context.Context) error {
	work := make(chan *BatchPlan)
	done := make(chan stepOut)
	go func() {
		for p := range work {
			t := time.Now()
			res, err := e.execute(ctx, p)
			done <- stepOut{res, err, time.Since(t)}
		}
	}()
	defer close(work)
	var inflight, next *BatchPlan
	// stop waits for the plan in flight and returns every plan not applied. The plan in
	// flight is applied first, as the loop would, unless it failed because ctx was
	// cancelled: a step that ran moved the sequences' recurrent states (and the runner's
	// sampled tokens), which a rollback cannot take back.
	stop := func(err error) error {
		var out stepOut
		if inflight != nil {
			out = <-done
		}
		e.mu.Lock()
		if inflight != nil && (out.err == nil || ctx.Err() == nil) {
			_ = e.s.Update(inflight, out.res, out.err) // inflight is the oldest plan pending
		}
		e.s.rollbackAll()
		e.afterChange()
		e.mu.Unlock()
		return err
	}
	var sched time.Duration
	for {
		select {
		case <-ctx.Done():
			return stop(ctx.Err())
		case <-e.closeCh:
			return stop(nil)
		default:
		}
		t0 := time.Now()
		e.mu.Lock()
		next = e.s.Schedule()
		e.mu.Unlock()
		sched = time.Since(t0)
		if inflight == nil {
			if next == nil {
				select {
				case <-e.wake:
				case <-ctx.Done():
					return stop(ctx.Err())
				case <-e.closeCh:
					return stop(nil)
				}
				continue
			}
			e.mu.Lock()
			e.s.FillTokenMasks(next) // nothing is in flight: its tokens are all known
			e.mu.Unlock()
			work <- next
			inflight, next = next, nil
			continue
		}
		out := <-done
		t2 := time.Now()
		e.mu.Lock()
		if out.err != nil && ctx.Err() != nil {
			// Shutting down: neither plan ran to completion; the requests stay queued.
			inflight = nil
			e.s.rollbackAll()
			e.afterChange()
			e.mu.Unlock()
			return ctx.Err()
		}
		tokens := inflight.NumTokens()
		if err := e.s.Update(inflight, out.res, out.err); err != nil {
			e.mu.Unlock()
			inflight = nil
			return stop(err)
		}
		e.afterChange()
		e.s.metrics.observeStep(sched+time.Since(t2), out.dur, tokens)
		if next != nil && !e.s.Pending(next) {
			next = nil // the step failed and voided the plan built after it
		}
		if next != nil {
			e.s.FillTokenMasks(next) // now that the tokens of the step before it are known
		}
		e.mu.Unlock()
		inflight = nil
		if next != nil {
			work <- next
			inflight, next = next, nil
		}
	}
}

func (e *Engine) execute(ctx context.Context, plan *BatchPlan) (res StepResult, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%w: %s panicked: %v\n%s", ErrRunner, e.info.Name, p, debug.Stack())
		}
	}()
	if len(plan.CacheOps) > 0 && !e.info.ExecutesCacheOps {
		if err := ctx.Err(); err != nil {
			return StepResult{}, err
		}
		if err := ApplyCacheOps(e.s.pool, plan.CacheOps); err != nil {
			return StepResult{}, err
		}
	}
	res, err = e.runner.Execute(ctx, plan)
	e.notePermanent(err)
	return res, err
}

// Drain stops accepting requests (Submit returns ErrDraining) and waits until every
// request in flight has finished, or ctx is done. Run must be running for requests to
// finish.
func (e *Engine) Drain(ctx context.Context) error {
	e.mu.Lock()
	e.draining = true
	e.afterChange()
	ch := e.drained
	e.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close aborts every request in flight (finish reason abort, ErrClosed), refuses new
// ones and makes Run return. It is safe to call more than once.
func (e *Engine) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil
	}
	e.closed, e.draining = true, true
	e.s.AbortAll(fmt.Errorf("%w: %w", ErrAborted, ErrClosed))
	close(e.closeCh)
	e.afterChange()
	return nil
}

// afterChange runs with e.mu held after the queues changed.
func (e *Engine) afterChange() {
	if e.draining && e.s.Len() == 0 {
		select {
		case <-e.drained:
		default:
			close(e.drained)
		}
	}
}

func (e *Engine) signal() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// mix64 is SplitMix64's finaliser: a cheap bijective hash of x.
func mix64(x uint64) uint64 {
	x += 0x9E3779B97F4A7C15
	x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9
	x = (x ^ (x >> 27)) * 0x94D049BB133111EB
	return x ^ (x >> 31)
}
