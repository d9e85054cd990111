package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"testing"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/engine/enginetest"
	"github.com/resin-llm/resin/core/wire"
)

// TestStopClosesRemoteRunner: stopping the engine of an out-of-process runner ends the
// runner's session with Shutdown (the runner returns cleanly), not by leaving the process
// to notice the engine's exit.
func TestStopClosesRemoteRunner(t *testing.T) {
	path := filepath.Join(t.TempDir(), "runner.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	tr, err := enginetest.New(enginetest.Config{VocabSize: 100, Pages: 64})
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			served <- err
			return
		}
		defer c.Close()
		served <- wire.Serve(context.Background(), c, c, tr, wire.ServeOptions{})
	}()
	f := RemoteFlags{CacheBytes: 1 << 20}
	r, pool, err := f.Open("unix:"+path, t.Output())
	if err != nil {
		t.Fatal(err)
	}
	e, err := Start(&Runtime{Runner: r, Pool: pool, RunnerName: "remote"}, engine.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := r.(*wire.Remote).Health(); !errors.Is(err, wire.ErrRunnerDown) {
		t.Fatalf("health after Stop: %v, want the runner closed", err)
	}
	if err := <-served; err != nil {
		t.Fatalf("the runner's session ended with %v, want a clean Shutdown", err)
	}
}

// healthyRunner is a runner whose ranks' worker processes report through Health.
type healthyRunner struct {
	engine.Runner
	err error
}

func (r *healthyRunner) Health() error { return r.err }

// TestRunnerHealthAsksWorkers: /health asks a runner with a Health method (ranks in worker
// processes) whether they still run; it asked only remote runners, so a killed worker
// left /health ok until the next request failed.
func TestRunnerHealthAsksWorkers(t *testing.T) {
	r, err := enginetest.New(enginetest.Config{VocabSize: tinyVocab, MaxContext: 64, Pages: 16})
	if err != nil {
		t.Fatal(err)
	}
	if runnerHealth(r) != nil {
		t.Error("a runner in this process has a health check")
	}
	dead := &healthyRunner{Runner: r, err: errors.New("worker rank 1 exited")}
	if h := runnerHealth(dead); h == nil || h() == nil {
		t.Error("a runner with Health: /health does not ask it")
	}
}

// closeRecorder is a runner (enginetest's) with StopRanks and Close that record their
// calls in order.
type closeRecorder struct {
	engine.Runner
	calls *[]string
}

func (r closeRecorder) StopRanks() error { *r.calls = append(*r.calls, "stop"); return nil }
func (r closeRecorder) Close() error {
	*r.calls = append(*r.calls, "close")
	return errors.New("closed")
}

// onlyClose is a runner with a Close alone (a single GPU runner's shape).
type onlyClose struct {
	engine.Runner
	calls *[]string
}

func (r onlyClose) Close() error { *r.calls = append(*r.calls, "close"); return nil }

// TestRunnerCloserStopsThenCloses: when an engine stops, a parallel group's other ranks
// are stopped (StopRanks, which reaps worker processes) and then the runner is closed
// (its device memory freed), its Close's error reported; a runner with only a Close is
// closed; one with neither needs nothing.
func TestRunnerCloserStopsThenCloses(t *testing.T) {
	tr, err := enginetest.New(enginetest.Config{VocabSize: 100, Pages: 64})
	if err != nil {
		t.Fatal(err)
	}
	var calls []string
	if err := runnerCloser(closeRecorder{tr, &calls})(); err == nil || err.Error() != "closed" {
		t.Errorf("the closer's error %v, want Close's", err)
	}
	if got := fmt.Sprint(calls); got != "[stop close]" {
		t.Errorf("calls %s, want [stop close]", got)
	}
	calls = nil
	if err := runnerCloser(onlyClose{tr, &calls})(); err != nil || fmt.Sprint(calls) != "[close]" {
		t.Errorf("a runner with Close alone: %v, calls %v", err, calls)
	}
	if c := runnerCloser(tr); c != nil {
		t.Errorf("a runner with neither StopRanks nor Close got a closer")
	}
}
