//go:build unix

package wire_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/engine/enginetest"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/core/wire"
)

// helperEnv makes this test binary an exec runner: TestMain serves an enginetest runner
// on stdin/stdout instead of running the tests.
const helperEnv = "RESIN_WIRE_TEST_RUNNER"

// stallEnv=N makes the helper runner stall in its N-th step (after reading it, before
// answering) and say so on stderr with stallLine, so that a test kills it in a known step.
const (
	stallEnv  = "RESIN_WIRE_TEST_STALL_AT"
	stallLine = "runner stalled"
)

// stallingRunner stalls in its at-th step until it is killed.
type stallingRunner struct {
	*enginetest.Runner
	steps, at int
}

func (s *stallingRunner) Execute(ctx context.Context, p *engine.BatchPlan) (engine.StepResult, error) {
	if s.steps++; s.steps == s.at {
		fmt.Fprintf(os.Stderr, "%s in step %d\n", stallLine, s.steps)
		time.Sleep(time.Hour)
	}
	return s.Runner.Execute(ctx, p)
}

// lineWatch is an exec runner's stderr that closes seen once a write holds line.
type lineWatch struct {
	line string
	seen chan struct{}
	once sync.Once
}

func (w *lineWatch) Write(p []byte) (int, error) {
	if bytes.Contains(p, []byte(w.line)) {
		w.once.Do(func() { close(w.seen) })
	}
	return len(p), nil
}

// engineEnv makes this test binary an engine for TestRunnerDiesWithTheEngine: it starts
// the helper runner, which stalls in its first step, prints the runner's pid once the
// runner stalls, and waits to be killed.
const engineEnv = "RESIN_WIRE_TEST_ENGINE"

func TestMain(m *testing.M) {
	if os.Getenv(engineEnv) == "1" {
		os.Unsetenv(engineEnv)
		os.Setenv(helperEnv, "1")
		os.Setenv(stallEnv, "1")
		self, _ := os.Executable()
		stalled := &lineWatch{line: stallLine, seen: make(chan struct{})}
		r, err := wire.Dial(context.Background(), wire.Config{Spec: "exec:" + self, Stderr: stalled, NoRestart: true})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		pid := r.Pid() // before the step: Pid waits for the step in flight, and that one stalls
		go r.Execute(context.Background(), bigPlan(16))
		select {
		case <-stalled.seen:
		case <-time.After(time.Minute):
			fmt.Fprintln(os.Stderr, "the runner never stalled")
			os.Exit(2)
		}
		fmt.Println(pid)
		time.Sleep(2 * time.Minute)
		os.Exit(3)
	}
	if os.Getenv(helperEnv) == "1" {
		tr, err := enginetest.New(enginetest.Config{VocabSize: 100, Pages: 64})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		var run engine.Runner = tr
		if at, err := strconv.Atoi(os.Getenv(stallEnv)); err == nil && at > 0 {
			run = &stallingRunner{Runner: tr, at: at}
		}
		if err := wire.Serve(context.Background(), os.Stdin, os.Stdout, run, wire.ServeOptions{}); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// waitFor polls cond until it holds; a generous guard turns a hang into a failure.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for guard := time.Now().Add(30 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(guard) {
			t.Fatalf("still waiting for %s", what)
		}
	}
}

// runReference runs prompt p for n tokens (greedy, EOS ignored) and fails t unless it
// ends by length with the enginetest reference tokens of a vocabulary of vocab.
func runReference(t *testing.T, e *engine.Engine, vocab int, p []int32, n int) {
	t.Helper()
	st, err := e.Submit(context.Background(), engine.Request{Prompt: p, Sampling: engine.SamplingParams{MaxTokens: n, IgnoreEOS: true}})
	if err != nil {
		t.Fatal(err)
	}
	got, ev, err := st.Collect(context.Background())
	if err != nil || ev.Finish != engine.FinishLength {
		t.Fatalf("request ended with %v, %v: %v", ev.Finish, err, ev.Err)
	}
	if want := enginetest.Reference(vocab, p, n, engine.SamplingRow{Logprobs: -1}); !slices.Equal(got, want) {
		t.Fatalf("tokens %v, want %v", got, want)
	}
}

// TestRemoteExitBetweenSteps: an exec runner that dies while the engine is idle is
// reported by Health at once (not at the next step, which an idle server behind a load
// balancer that trusts /health would never get), restarted without a step, and the next
// request is served by the new process with the reference tokens. No zombie is left.
func TestRemoteExitBetweenSteps(t *testing.T) {
	t.Setenv(helperEnv, "1")
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cfg := enginetest.Config{VocabSize: 100, Pages: 64}
	base := runtime.NumGoroutine()
	e, r, stop := startRemote(t, wire.Config{Spec: "exec:" + self, RestartBackoff: time.Millisecond}, cfg, engine.Config{})
	runReference(t, e, cfg.VocabSize, []int32{1, 2, 3, 4, 5}, 8)
	pid := r.Pid()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a restart without any step", func() bool { return r.Restarts() == 1 && r.Health() == nil })
	if p := r.Pid(); p == pid || p == 0 {
		t.Fatalf("runner pid %d after the restart (was %d)", p, pid)
	}
	// The killed child was reaped: signal 0 to its pid finds no process (a zombie would).
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Fatalf("the killed runner %d is still there (zombie?): %v", pid, err)
	}
	runReference(t, e, cfg.VocabSize, []int32{1, 2, 3, 4, 5, 6}, 8)
	// Closed, the remote leaves no goroutine behind (process watchers, restarts).
	stop()
	waitFor(t, fmt.Sprintf("the goroutines to return to %d", base), func() bool { return runtime.NumGoroutine() <= base })
}

// TestRemoteHealthBetweenSteps: with NoRestart, Health says the runner is down as soon as
// the process is gone, naming how it exited.
func TestRemoteHealthBetweenSteps(t *testing.T) {
	t.Setenv(helperEnv, "1")
	self, _ := os.Executable()
	r, err := wire.Dial(context.Background(), wire.Config{Spec: "exec:" + self, NoRestart: true})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := syscall.Kill(r.Pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "Health to report the death", func() bool { return r.Health() != nil })
	if err := r.Health(); !errors.Is(err, wire.ErrRunnerDown) || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("health %v, want ErrRunnerDown saying the runner was killed", err)
	}
}

// bigPlan is a valid one-sequence prefill of n tokens (n a multiple of 16) on one full
// attention group with pages 0, 1, ...
func bigPlan(n int) *engine.BatchPlan {
	p := &engine.BatchPlan{
		Step: 1, ReqIDs: []uint64{1}, Computed: []int32{0}, Scheduled: []int32{int32(n)}, PromptLen: []int32{int32(n)},
		NumDrafts: []int32{0}, Temperature: []float32{0}, TopP: []float32{1}, TopK: []int32{0}, MinP: []float32{0},
		Seed: []uint64{0}, Logprobs: []int32{-1}, QueryStart: []int32{0, int32(n)}, LogitsStart: []int32{0, 1},
		LogitsIndices: []int32{int32(n - 1)}, Groups: []engine.GroupPlan{{PageTableStart: []int32{0, int32(n / 16)}}},
	}
	for i := range n {
		p.Tokens = append(p.Tokens, int32(i%50))
		p.Positions = append(p.Positions, int32(i))
		p.Groups[0].SlotMapping = append(p.Groups[0].SlotMapping, int64(i))
	}
	for i := range n / 16 {
		p.Groups[0].PageTable = append(p.Groups[0].PageTable, kvslab.PageID(i))
	}
	return p
}

// TestRemoteRunnerStopsReading: a runner that answers the handshake and then stops
// reading (hung, SIGSTOPped) cannot block the engine in a write of a step larger than the
// socket buffer: the step times out like a missing answer does.
func TestRemoteRunnerStopsReading(t *testing.T) {
	path := filepath.Join(t.TempDir(), "hung.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	release := make(chan struct{})
	defer close(release)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		fr := wire.NewFrameReader(c, 0)
		if _, _, err := fr.Read(); err != nil {
			return
		}
		info := engine.RunnerInfo{Name: "hung", VocabSize: 100, MaxContext: 1 << 20,
			CacheGroups: []kvslab.GroupSpec{{Name: "kv", Kind: kvslab.Full, Layers: 1, BytesPerToken: 8, PageTokens: 16}}}
		c.Write(wire.AppendInfo(nil, wire.Info{Version: wire.Version, Caps: wire.CapCacheOps | wire.CapReleases, Runner: info}))
		<-release // never reads the step
	}()
	r, err := wire.Dial(context.Background(), wire.Config{Spec: "unix:" + path, StepTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	res := make(chan error, 1)
	go func() {
		_, err := r.Execute(context.Background(), bigPlan(1<<18)) // a ~4.5 MB frame
		res <- err
	}()
	select {
	case err := <-res:
		if !errors.Is(err, wire.ErrRunnerDied) || !strings.Contains(err.Error(), "timed out") {
			t.Fatalf("Execute: %v, want ErrRunnerDied after a timeout", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Execute is still blocked writing to a runner that does not read")
	}
}

// TestRemoteStepOverMaxFrame: a step whose frame exceeds the frame limit is not sent (the
// runner would refuse it and close the session): it fails alone, the runner is neither
// killed nor restarted, the runner is told to forget the step's requests, and later
// requests run on the same session with the reference tokens.
func TestRemoteStepOverMaxFrame(t *testing.T) {
	cfg := enginetest.Config{VocabSize: 200, Pages: 256}
	g := newGoRunner(t, cfg)
	e, r := startEngine(t, g, engine.Config{MaxBatchTokens: 1024}, wire.Config{MaxFrame: 4096})
	run := func(p []int32) (engine.Event, []int32) {
		t.Helper()
		st, err := e.Submit(context.Background(), engine.Request{Prompt: p, Sampling: engine.SamplingParams{MaxTokens: 20, IgnoreEOS: true}})
		if err != nil {
			t.Fatal(err)
		}
		got, ev, err := st.Collect(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return ev, got
	}
	short := []int32{5, 6, 7, 8, 9}
	if ev, _ := run(short); ev.Finish != engine.FinishLength {
		t.Fatalf("short request: %v %v", ev.Finish, ev.Err)
	}
	long := make([]int32, 600) // a 600-token prefill step: ~15 KB
	for i := range long {
		long[i] = int32(i % cfg.VocabSize)
	}
	ev, _ := run(long)
	if ev.Finish != engine.FinishError || !strings.Contains(fmt.Sprint(ev.Err), "over the runner protocol's limit") {
		t.Fatalf("oversize step ended with %v: %v, want an error naming the frame limit", ev.Finish, ev.Err)
	}
	if r.Restarts() != 0 || r.Health() != nil {
		t.Fatalf("restarts %d, health %v: the runner was taken for dead", r.Restarts(), r.Health())
	}
	for i := range 3 {
		p := append(slices.Clone(short), int32(i))
		ev, got := run(p)
		if want := enginetest.Reference(cfg.VocabSize, p, 20, engine.SamplingRow{Logprobs: -1}); ev.Finish != engine.FinishLength || !slices.Equal(got, want) {
			t.Fatalf("request %d after the oversize step: %v %v, tokens %v want %v", i, ev.Finish, ev.Err, got, want)
		}
	}
	if err := g.errs(); err != nil {
		t.Fatalf("the runner saw a wrong cache: %v", err)
	}
	// The last request's release notice goes with the next step; every other request
	// (the voided one included) is forgotten.
	if n := r.Tracked(); n > 1 {
		t.Fatalf("the engine shadows the tables of %d requests after all but one were released", n)
	}
	if r.Restarts() != 0 {
		t.Fatalf("%d restarts", r.Restarts())
	}
}

// TestFrameLengthLies: a frame header that claims the maximum size on a stream that ends
// after a few bytes gives an error naming the truncation and allocates memory in
// proportion to the bytes received, not to the length claimed.
func TestFrameLengthLies(t *testing.T) {
	const claimed = 60 << 20
	stream := append(binary.LittleEndian.AppendUint32(nil, claimed), byte(wire.KindStep), 1, 2, 3)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, _, err := wire.NewFrameReader(bytes.NewReader(stream), 64<<20).Read()
	runtime.ReadMemStats(&after)
	if !errors.Is(err, io.ErrUnexpectedEOF) || !strings.Contains(err.Error(), "62914560") {
		t.Fatalf("truncated frame: %v, want ErrUnexpectedEOF naming the length", err)
	}
	if n := after.TotalAlloc - before.TotalAlloc; n > 8<<20 {
		t.Fatalf("reading 8 bytes of a frame that claims %d allocated %d bytes", claimed, n)
	}
}

// alive reports whether process pid exists and is not a zombie (an orphan killed in a
// container may stay a zombie when pid 1 does not reap).
func alive(t *testing.T, pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

// TestRemoteKillsWhatTheRunnerStarted: an exec runner's command line that starts other
// processes (here a background sleep) leaves none behind when the engine closes it, and
// none when the engine kills it.
func TestRemoteKillsWhatTheRunnerStarted(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("needs /proc")
	}
	t.Setenv(helperEnv, "1")
	self, _ := os.Executable()
	for _, how := range []string{"close", "kill"} {
		pidFile := filepath.Join(t.TempDir(), "pid")
		spec := fmt.Sprintf(`exec:sh -c 'sleep 300 & echo $! > %s; exec %s'`, pidFile, self)
		r, err := wire.Dial(context.Background(), wire.Config{Spec: spec, NoRestart: true})
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(pidFile)
		if err != nil {
			t.Fatal(err)
		}
		var child int
		fmt.Sscan(string(b), &child)
		if !alive(t, child) {
			t.Fatalf("%s: the runner's child %d is not running", how, child)
		}
		if how == "kill" {
			syscall.Kill(r.Pid(), syscall.SIGKILL)
			waitFor(t, "the death to be noticed", func() bool { return r.Health() != nil })
		}
		r.Close()
		t.Cleanup(func() { syscall.Kill(child, syscall.SIGKILL) })
		waitFor(t, fmt.Sprintf("%s: the runner's child %d to die with it", how, child), func() bool { return !alive(t, child) })
	}
}

// TestRemoteShutdownDuringRestart: the engine shutting down while a background restart
// waits for a runner that never answers the handshake does not wait for the handshake
// timeout: the step waiting for the restart ends with the engine's context.
func TestRemoteShutdownDuringRestart(t *testing.T) {
	t.Setenv(helperEnv, "1")
	self, _ := os.Executable()
	flag := filepath.Join(t.TempDir(), "started")
	// The first start serves; every later one hangs before the handshake.
	spec := fmt.Sprintf(`exec:sh -c 'if [ -e %s ]; then sleep 300; fi; touch %s; exec %s'`, flag, flag, self)
	r, err := wire.Dial(context.Background(), wire.Config{Spec: spec, RestartBackoff: time.Millisecond, HandshakeTimeout: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	twin, err := enginetest.New(enginetest.Config{VocabSize: 100, Pages: 64})
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.New(r, engine.Config{Pool: twin.Pool()})
	if err != nil {
		t.Fatal(err)
	}
	r.Attach(e)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	syscall.Kill(r.Pid(), syscall.SIGKILL)
	waitFor(t, "the death to be noticed", func() bool { return r.Health() != nil })
	if _, err := e.Submit(context.Background(), engine.Request{Prompt: []int32{1, 2, 3}, Sampling: engine.SamplingParams{MaxTokens: 4}}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // let the engine's step wait for the restart
	e.Close()
	cancel()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the engine loop is still waiting for a runner's handshake after its context ended")
	}
}

// TestRemoteDeathBetweenSteps: a unix runner that dies while the engine is idle (nothing
// can notice it then) is found gone when the next step cannot be written; that step never
// reached it, so its request is recomputed on the restarted runner instead of failing.
func TestRemoteDeathBetweenSteps(t *testing.T) {
	cfg := enginetest.Config{VocabSize: 200, Pages: 64}
	g := newGoRunner(t, cfg)
	e, r := startEngine(t, g, engine.Config{}, wire.Config{})
	runReference(t, e, cfg.VocabSize, []int32{1, 2, 3}, 10)
	g.kill()
	runReference(t, e, cfg.VocabSize, []int32{4, 5, 6}, 10)
	if r.Restarts() != 1 || r.Health() != nil {
		t.Fatalf("restarts %d, health %v; want one restart and a healthy runner", r.Restarts(), r.Health())
	}
	if err := g.errs(); err != nil {
		t.Fatalf("a runner saw a wrong cache: %v", err)
	}
}

// TestRemoteExecDiesUnderLoad: an exec runner killed (SIGKILL) while the engine is busy,
// in its fifth step with three requests decoding and two queued, fails the step in flight
// alone; the queued requests complete after the restart with exactly the reference tokens.
func TestRemoteExecDiesUnderLoad(t *testing.T) {
	t.Setenv(helperEnv, "1")
	t.Setenv(stallEnv, "5")
	self, _ := os.Executable()
	cfg := enginetest.Config{VocabSize: 100, Pages: 64}
	stderr := &lineWatch{line: stallLine, seen: make(chan struct{})}
	var prompts [][]int32
	for i := range 5 {
		prompts = append(prompts, []int32{int32(i + 1), 2, 3, 4, 5, 6, 7})
	}
	var streams []*engine.Stream
	var pid int
	// All five are queued before the first step, which prefills the first three: they
	// decode in the fifth.
	wc := wire.Config{Spec: "exec:" + self, RestartBackoff: time.Millisecond, Stderr: stderr}
	startRemoteQueued(t, wc, cfg, engine.Config{MaxSeqs: 3, MaxBatchTokens: 64}, func(e *engine.Engine, r *wire.Remote) {
		pid = r.Pid() // before any step: Pid waits for the step in flight, and that one stalls
		streams = submitAll(t, e, prompts, 150)
	})
	select {
	case <-stderr.seen:
	case <-time.After(30 * time.Second):
		t.Fatal("the runner never reached the step it stalls in")
	}
	os.Unsetenv(stallEnv) // the restarted runner does not stall (t.Setenv restores it)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if failed, done := collectAfterDeath(t, streams, prompts, cfg.VocabSize, 150); failed != 3 || done != 2 {
		t.Fatalf("%d requests failed and %d completed; want the 3 of the step in flight failed, the 2 queued completed", failed, done)
	}
}

// TestRunnerDiesWithTheEngine: an exec runner busy in a step (so not reading its stdin)
// dies with the engine's process when that is killed without closing the session
// (SIGKILL, the OOM killer). Before, it went on running, holding its memory.
func TestRunnerDiesWithTheEngine(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the parent-death signal is Linux's")
	}
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("needs /proc")
	}
	self, _ := os.Executable()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, self)
	cmd.Env = append(os.Environ(), engineEnv+"=1")
	var errOut bytes.Buffer
	cmd.Stderr = &errOut
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := make(chan int, 1)
	go func() {
		var p int
		fmt.Fscan(out, &p)
		pid <- p
	}()
	var runner int
	select {
	case runner = <-pid:
	case <-time.After(90 * time.Second):
	}
	if runner <= 0 {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("the engine process printed no runner pid: %s", errOut.String())
	}
	t.Cleanup(func() { syscall.Kill(runner, syscall.SIGKILL) })
	if !alive(t, runner) {
		t.Fatalf("the runner %d is not running", runner)
	}
	cmd.Process.Kill()
	cmd.Wait()
	waitFor(t, fmt.Sprintf("the runner %d to die with its engine", runner), func() bool { return !alive(t, runner) })
}
