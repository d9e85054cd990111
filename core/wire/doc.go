// Package wire is the runner protocol: how the engine drives a runner that lives in
// another process (Python, another language, another build) over a byte stream, a
// child's stdin/stdout or a Unix socket. docs/runner-protocol.md is its specification;
// testdata/*.bin pins the bytes of every message kind.
//
// The engine side is Remote, an engine.Runner: Dial starts ("exec:CMD") or connects to
// ("unix:PATH") the runner, does the handshake (version, capabilities, the runner's
// RunnerInfo), then each Execute sends one Step and reads one Result. A Step is the
// BatchPlan with its page tables sent as deltas against the tables the runner already
// holds (Encoder keeps a shadow copy per request and forgets released ones), the plan's
// CacheOps in order and its release notices. A runner that dies fails the step in flight
// (ErrRunnerDied), and an exec runner that exits between steps is noticed at once; with
// the engine attached (Remote.Attach) it is restarted in the background right away, and
// the next step calls Engine.ForgetCache, since the new process holds no cache. Health
// reports the runner's state for /health.
//
// The runner side in Go is Serve (any engine.Runner behind the protocol, with Tables
// rebuilding each plan's page tables); python/resin_runner is the Python one.
package wire
