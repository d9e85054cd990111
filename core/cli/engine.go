package cli

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"

	"github.com/resin-llm/resin/core/dist/dp"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/core/serve"
)

// EngineFlags are the engine limits every command that runs the engine takes.
type EngineFlags struct {
	MaxBatchTokens int
	MaxSeqs        int
	MaxQueue       int
}

// Register adds --max-batch-tokens, --max-seqs and --max-queue to cmd.
func (f *EngineFlags) Register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.IntVar(&f.MaxBatchTokens, "max-batch-tokens", 8192, "tokens per engine step at most")
	fl.IntVar(&f.MaxSeqs, "max-seqs", 256, "sequences per engine step at most")
	fl.IntVar(&f.MaxQueue, "max-queue", 1024, "waiting requests at most before 429 (0 = no cap)")
}

// Config returns the engine configuration of the flags.
func (f *EngineFlags) Config() (engine.Config, error) {
	switch {
	case f.MaxBatchTokens <= 0:
		return engine.Config{}, fmt.Errorf("--max-batch-tokens %d must be positive", f.MaxBatchTokens)
	case f.MaxSeqs <= 0:
		return engine.Config{}, fmt.Errorf("--max-seqs %d must be positive", f.MaxSeqs)
	case f.MaxQueue < 0:
		return engine.Config{}, fmt.Errorf("--max-queue %d is negative", f.MaxQueue)
	}
	return engine.Config{MaxBatchTokens: f.MaxBatchTokens, MaxSeqs: f.MaxSeqs, MaxQueue: f.MaxQueue}, nil
}

// Engine is an engine whose loop runs in its own goroutine until Stop. With --dp it is
// rank 0's, and requests go through the coordinator of every rank's engine (Front).
type Engine struct {
	*engine.Engine
	front  serve.Engine    // where requests go: the engine, or coord
	coord  *dp.Coordinator // --dp: every rank's engine
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
	err    error
	// closeRunner ends an out-of-process runner's session when the engine stops (nil for
	// a runner in this process).
	closeRunner func() error
}

// load reads the engine flags and loads the model the loader's flags name.
func load(cmd *cobra.Command, l Loader, ef *EngineFlags) (*Runtime, engine.Config, error) {
	cfg, err := ef.Config()
	if err != nil {
		return nil, cfg, err
	}
	if el, ok := l.(EngineLimited); ok {
		el.SetEngineLimits(cfg)
	}
	rt, err := l.Load(cmd.ErrOrStderr())
	return rt, cfg, err
}

// Start builds the engine of rt (cfg.Pool is rt.Pool, cfg.CheckPrompt rt.CheckPrompt
// unless set) and starts its loop; with rt.DP, one engine per rank (each on its rank's
// pool) behind a dp.Coordinator.
func Start(rt *Runtime, cfg engine.Config) (*Engine, error) {
	if cfg.CheckPrompt == nil {
		cfg.CheckPrompt = rt.CheckPrompt
	}
	if rt.DP != nil {
		return startDP(rt, cfg)
	}
	cfg.Pool = rt.Pool
	e, err := engine.New(rt.Runner, cfg)
	if err != nil {
		return nil, fmt.Errorf("start engine for %s: %w", rt.RunnerName, err)
	}
	attachRunner(e, rt.Runner)
	ctx, cancel := context.WithCancel(context.Background())
	r := &Engine{Engine: e, front: e, cancel: cancel, done: make(chan error, 1), closeRunner: runnerCloser(rt.Runner)}
	go func() { r.done <- e.Run(ctx) }()
	return r, nil
}

func startDP(rt *Runtime, cfg engine.Config) (*Engine, error) {
	runners := append([]engine.Runner{rt.Runner}, rt.DP.Runners...)
	pools := append([]*kvslab.Pool{rt.Pool}, rt.DP.Pools...)
	if len(pools) != len(runners) {
		return nil, fmt.Errorf("--dp: %d runners and %d pools", len(runners), len(pools))
	}
	var closers []func() error
	for _, run := range runners {
		if c := runnerCloser(run); c != nil {
			closers = append(closers, c)
		}
	}
	closeRunners := func() error {
		var errs []error
		for _, c := range closers {
			errs = append(errs, c())
		}
		if rt.DP.Group != nil {
			errs = append(errs, rt.DP.Group.Close())
		}
		if rt.DP.Close != nil {
			errs = append(errs, rt.DP.Close())
		}
		return errors.Join(errs...)
	}
	engines := make([]*engine.Engine, len(runners))
	reg := cfg.Registry // one /metrics for every rank, each rank's series labelled engine="r"
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	for r, run := range runners {
		c := cfg
		c.Pool, c.Registry, c.EngineLabel = pools[r], reg, strconv.Itoa(r)
		e, err := engine.New(run, c)
		if err != nil {
			for _, started := range engines[:r] {
				started.Close() // ends its runner-death watch
			}
			closeRunners()
			return nil, fmt.Errorf("start engine for %s, dp rank %d: %w", rt.RunnerName, r, err)
		}
		attachRunner(e, run)
		engines[r] = e
	}
	coord, err := dp.NewCoordinator(rt.DP.Group, engines)
	if err != nil {
		closeRunners()
		return nil, err
	}
	coord.Start(context.Background())
	return &Engine{Engine: engines[0], front: coord, coord: coord, closeRunner: closeRunners}, nil
}

// Front is what requests go through: the engine, or with --dp the coordinator that
// routes each to one rank's engine.
func (e *Engine) Front() serve.Engine { return e.front }

// Submit submits req through Front.
func (e *Engine) Submit(ctx context.Context, req engine.Request) (*engine.Stream, error) {
	return e.front.Submit(ctx, req)
}

// Stop closes the engine (requests still running end with an abort), waits for its loop
// to return and reports the loop's error, if it failed. Calling it again returns the same.
func (e *Engine) Stop() error {
	e.once.Do(func() {
		if e.coord != nil {
			if err := e.coord.Close(); err != nil {
				e.err = fmt.Errorf("dp ranks: %w", err)
			}
		} else {
			e.Engine.Close()
			e.cancel()
			if err := <-e.done; err != nil && !errors.Is(err, context.Canceled) {
				e.err = fmt.Errorf("engine loop: %w", err)
			}
		}
		if e.closeRunner != nil {
			e.closeRunner()
		}
	})
	return e.err
}
