package cli

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/spf13/cobra"

	"github.com/resin-llm/resin/core/engine"
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

// Engine is an engine whose loop runs in its own goroutine until Stop.
type Engine struct {
	*engine.Engine
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

// Start builds the engine of rt (cfg.Pool is rt.Pool) and starts its loop.
func Start(rt *Runtime, cfg engine.Config) (*Engine, error) {
	cfg.Pool = rt.Pool
	e, err := engine.New(rt.Runner, cfg)
	if err != nil {
		return nil, fmt.Errorf("start engine for %s: %w", rt.RunnerName, err)
	}
	attachRunner(e, rt.Runner)
	ctx, cancel := context.WithCancel(context.Background())
	r := &Engine{Engine: e, cancel: cancel, done: make(chan error, 1), closeRunner: runnerCloser(rt.Runner)}
	go func() { r.done <- e.Run(ctx) }()
	return r, nil
}

// Stop closes the engine (requests still running end with an abort), waits for its loop
// to return and reports the loop's error, if it failed. Calling it again returns the same.
func (e *Engine) Stop() error {
	e.once.Do(func() {
		e.Engine.Close()
		e.cancel()
		if err := <-e.done; err != nil && !errors.Is(err, context.Canceled) {
			e.err = fmt.Errorf("engine loop: %w", err)
		}
		if e.closeRunner != nil {
			e.closeRunner()
		}
	})
	return e.err
}
