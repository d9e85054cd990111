package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/core/wire"
)

// RemoteFlags configure an out-of-process runner (--runner exec:'CMD ...' or
// --runner unix:PATH): a model that runs in another process, Python for instance, and
// speaks the runner protocol (core/wire, docs/runner-protocol.md).
type RemoteFlags struct {
	NoRestart        bool
	StepTimeout      time.Duration
	HandshakeTimeout time.Duration
	MaxFrame         int
	CacheBytes       int64
}

// Register adds --runner-no-restart, --runner-step-timeout, --runner-handshake-timeout,
// --runner-max-frame and --runner-cache-bytes to cmd. The command's own --runner flag
// names the runner (see IsRemoteRunner).
func (f *RemoteFlags) Register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.BoolVar(&f.NoRestart, "runner-no-restart", false, "with --runner exec:/unix:, keep a runner that died down (every later request fails) instead of restarting it")
	fl.DurationVar(&f.StepTimeout, "runner-step-timeout", 10*time.Minute, "with --runner exec:/unix:, how long one step may take before the runner is taken for dead")
	fl.DurationVar(&f.HandshakeTimeout, "runner-handshake-timeout", 2*time.Minute, "with --runner exec:/unix:, how long the runner may take to start and answer the handshake")
	fl.IntVar(&f.MaxFrame, "runner-max-frame", wire.DefaultMaxFrame, "with --runner exec:/unix:, the largest protocol frame either side accepts, in bytes")
	fl.Int64Var(&f.CacheBytes, "runner-cache-bytes", 0, "with --runner exec:/unix:, the engine's page pool in bytes of the runner's cache groups: how much cache the runner must be able to hold (0: 256 MiB, cut to the slabs a page id addresses when the runner's slabs are small)")
}

// IsRemoteRunner reports whether a --runner value names an out-of-process runner.
func IsRemoteRunner(spec string) bool {
	return strings.HasPrefix(spec, "exec:") || strings.HasPrefix(spec, "unix:")
}

// Open starts (exec:) or connects to (unix:) the runner of spec and builds the engine's
// page pool for the cache groups it declares. The runner's stderr goes to warn. Start
// attaches the runner to its engine, which lets a dead runner be restarted.
func (f *RemoteFlags) Open(spec string, warn io.Writer) (engine.Runner, *kvslab.Pool, error) {
	if f.CacheBytes < 0 {
		return nil, nil, fmt.Errorf("--runner-cache-bytes %d must be positive, or 0 for the default", f.CacheBytes)
	}
	r, err := wire.Dial(context.Background(), wire.Config{
		Spec: spec, MaxFrame: f.MaxFrame, StepTimeout: f.StepTimeout, HandshakeTimeout: f.HandshakeTimeout,
		NoRestart: f.NoRestart, Stderr: warn, Logger: slog.New(slog.NewTextHandler(warn, nil)),
	})
	if err != nil {
		return nil, nil, fmt.Errorf("--runner: %w", err)
	}
	pool, err := engine.NewHostPool(r.Info().CacheGroups, f.CacheBytes)
	if err != nil {
		r.Close()
		return nil, nil, fmt.Errorf("--runner %s: the page pool for its cache groups: %w", spec, err)
	}
	return r, pool, nil
}

// attachRunner gives an out-of-process runner its engine (so that after a restart the
// engine forgets the cache the old process held); other runners need nothing.
func attachRunner(e *engine.Engine, r engine.Runner) {
	if rem, ok := r.(*wire.Remote); ok {
		rem.Attach(e)
	}
}

// runnerCloser returns what ends a runner once its engine has stopped: an out-of-process
// runner's session (Shutdown, then an exec runner's exit is waited for and reaped); a
// parallel group's StopRanks (which stops its other ranks and reaps its worker
// processes); then, where the runner has one, its Close (a GPU runner's device memory,
// graphs and device, which a program opening runners one after another would otherwise
// keep until it exits). Every Close a runner reaches here must be safe after StopRanks
// and a second time. Nil when there is nothing to end.
func runnerCloser(r engine.Runner) func() error {
	if rem, ok := r.(*wire.Remote); ok {
		return rem.Close
	}
	stop, _ := r.(interface{ StopRanks() error })
	closer, _ := r.(interface{ Close() error })
	if stop == nil && closer == nil {
		return nil
	}
	return func() error {
		var errs []error
		if stop != nil {
			errs = append(errs, stop.StopRanks())
		}
		if closer != nil {
			errs = append(errs, closer.Close())
		}
		return errors.Join(errs...)
	}
}

// runnerHealth returns what /health asks besides draining: an out-of-process runner's
// state, or whether the worker processes of its ranks still run (a Health method), or
// nil for a runner wholly in this process.
func runnerHealth(r engine.Runner) func() error {
	if rem, ok := r.(*wire.Remote); ok {
		return rem.Health
	}
	if h, ok := r.(interface{ Health() error }); ok { // ranks in worker processes
		return h.Health
	}
	return nil
}
