package serve

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
)

// Engine is what the server needs of the engine that runs its requests: an
// *engine.Engine, or a front over several (core/dist/dp's Coordinator, which routes each
// request to one data-parallel rank's engine).
type Engine interface {
	Info() engine.RunnerInfo
	Registry() *prometheus.Registry
	// Pool describes the cache layout in the metrics (one engine's, for a front).
	Pool() *kvslab.Pool
	Submit(ctx context.Context, req engine.Request) (*engine.Stream, error)
	Abort(id string) bool
	Stop(id string) bool
	Drain(ctx context.Context) error
	Close() error
	// Err is the runner's permanent failure (a dead rank), nil while there is none; Dead
	// is closed when it happens. The server then answers /health 503 and stops.
	Err() error
	Dead() <-chan struct{}
}

var _ Engine = (*engine.Engine)(nil)
