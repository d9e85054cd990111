package wire

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
)

// Serve is the runner side of the protocol in Go: it answers the engine's Hello with
// runner's Info, then decodes each Step (page tables rebuilt from the deltas), executes
// it and sends its Result, or an Error when Execute fails. It returns nil on Shutdown or
// when the engine closes the stream between frames, and an error for anything else (after
// telling the engine with a protocol Error when it can). The runner must execute the
// plan's CacheOps itself (RunnerInfo.ExecutesCacheOps), or opts.Pool must be the pool it
// reads and writes, on which Serve applies them before Execute.
func Serve(ctx context.Context, r io.Reader, w io.Writer, runner engine.Runner, opts ServeOptions) error {
	fr := NewFrameReader(r, opts.MaxFrame)
	ownOps := runner.Info().ExecutesCacheOps
	var (
		tables Tables
		plan   engine.BatchPlan
		out    []byte
		hello  bool
	)
	protocolErr := func(err error) error {
		w.Write(AppendError(nil, Error{Code: CodeProtocol, Message: err.Error()}))
		return err
	}
	for {
		kind, payload, err := fr.Read()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return protocolErr(err)
		}
		switch {
		case kind == KindHello && !hello:
			h, err := DecodeHello(payload)
			if err != nil {
				return protocolErr(err)
			}
			if h.MaxFrame > 0 && (opts.MaxFrame <= 0 || int64(h.MaxFrame) < int64(fr.Max)) {
				// The engine's limit holds both ways: a larger result would be refused
				// and the runner taken for dead. A smaller opts.MaxFrame stays.
				fr.Max = int(h.MaxFrame)
			}
			hello = true
			out = AppendInfo(out[:0], Info{Version: Version, Caps: CapCacheOps | CapReleases, Runner: runner.Info()})
		case kind == KindStep && hello:
			if err := decodeStep(&tables, payload, &plan); err != nil {
				return protocolErr(err)
			}
			var res engine.StepResult
			err := applyOps(&plan, ownOps, opts.Pool)
			if err == nil {
				res, err = execute(ctx, runner, &plan)
			}
			if err != nil {
				out = AppendError(out[:0], Error{Step: plan.Step, Code: CodeStepFailed, Message: err.Error()})
			} else {
				out = AppendResult(out[:0], plan.Step, &res)
				if n := len(out) - 4; n > fr.Max {
					out = AppendError(out[:0], Error{Step: plan.Step, Code: CodeStepFailed,
						Message: fmt.Sprintf("the result is a frame of %d bytes, over the limit of %d", n, fr.Max)})
				}
			}
		case kind == KindShutdown:
			return DecodeShutdown(payload)
		default:
			return protocolErr(fmt.Errorf("%w: unexpected %s message (hello received: %v)", ErrMalformed, kind, hello))
		}
		if _, err := w.Write(out); err != nil {
			return err
		}
	}
}

// ServeOptions configure Serve.
type ServeOptions struct {
	// MaxFrame caps the frames accepted and sent (default: the engine's, from its Hello);
	// the engine's limit still holds when it is smaller.
	MaxFrame int
	// Pool is the runner's cache pool, on which Serve applies each step's cache ops when
	// the runner does not declare ExecutesCacheOps.
	Pool *kvslab.Pool
}

// decodeStep is Tables.DecodeStep with a panic (a decoder bug a hostile frame found)
// turned into ErrMalformed, so the runner answers a protocol Error instead of dying.
func decodeStep(t *Tables, payload []byte, p *engine.BatchPlan) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: step: the decoder panicked: %v", ErrMalformed, r)
		}
	}()
	return t.DecodeStep(payload, p)
}

// execute runs the runner's Execute with a panic turned into the step's error: the engine
// fails that step's requests and the session goes on, as for any failed step.
func execute(ctx context.Context, r engine.Runner, p *engine.BatchPlan) (res engine.StepResult, err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("runner %s panicked in step %d: %v", r.Info().Name, p.Step, v)
		}
	}()
	return r.Execute(ctx, p)
}

func applyOps(p *engine.BatchPlan, ownOps bool, pool *kvslab.Pool) error {
	switch {
	case len(p.CacheOps) == 0 || ownOps:
		return nil
	case pool == nil:
		return fmt.Errorf("%d cache ops, and the runner executes none and Serve has no pool to apply them on", len(p.CacheOps))
	}
	return engine.ApplyCacheOps(pool, p.CacheOps)
}
