package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/tokenizer/tiny"
	"github.com/resin-llm/resin/core/weights"
	"github.com/resin-llm/resin/core/wire"
	"github.com/resin-llm/resin/models/llama"
)

// runnerPython returns the Python of the resin-runner venv (.ci/setup.d/40-python-runner.sh)
// with PYTHONPATH set to this checkout's python/, or skips the test.
func runnerPython(t *testing.T) string {
	t.Helper()
	py := os.Getenv("RESIN_RUNNER_PYTHON")
	if py == "" {
		py = filepath.Join("..", "..", ".cache", "runner-venv", "bin", "python")
	}
	if _, err := os.Stat(py); err != nil {
		t.Skipf("no Python runner venv at %s: run .ci/setup.d/40-python-runner.sh (scripts/test.sh does)", py)
	}
	py, _ = filepath.Abs(py)
	src, _ := filepath.Abs(filepath.Join("..", "..", "python"))
	t.Setenv("PYTHONPATH", src)
	return py
}

// llamaCheckpoint writes the tiny llama config of testdata/tiny-llama with seeded random
// weights as float32 safetensors, so the Go runner and the Python one load the same checkpoint.
func llamaCheckpoint(t *testing.T) string {
	t.Helper()
	dir, _ := tinyLlamaCheckpoint(t, 7, weights.F32)
	return dir
}

// pageBudget is a pool of about 40 pages of 16 tokens of the tiny llama (2 layers, K and V
// of 2 heads of 8 floats): small enough that the requests below preempt each other.
const pageBudget = 40 * 16 * 2 * 2 * 2 * 8 * 4

func runEngine(t *testing.T, r engine.Runner, cfg engine.Config) *engine.Engine {
	t.Helper()
	e, err := engine.New(r, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if rem, ok := r.(*wire.Remote); ok {
		rem.Attach(e)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	t.Cleanup(func() { e.Close(); cancel(); <-done })
	return e
}

func goLlama(t *testing.T, dir string, cfg engine.Config) *engine.Engine {
	t.Helper()
	r, err := llama.Load(dir, llama.Options{})
	if err != nil {
		t.Fatal(err)
	}
	pool, err := r.NewPool(cfg.CacheBytes)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Pool = pool
	return runEngine(t, r, cfg)
}

func pyLlama(t *testing.T, dir string, cfg engine.Config, wc wire.Config) (*engine.Engine, *wire.Remote) {
	t.Helper()
	py := runnerPython(t)
	if wc.Spec == "" {
		wc.Spec = "exec:" + py + " -m resin_runner.llama --weights " + dir
	}
	wc.RestartBackoff = time.Nanosecond
	r, err := wire.Dial(context.Background(), wc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return runEngine(t, r, cfg), r
}

type genJob struct {
	prompt []int32
	n      int
}

// generate submits the jobs at once and returns each one's tokens (greedy).
func generate(t *testing.T, e *engine.Engine, jobs []genJob) [][]int32 {
	t.Helper()
	var streams []*engine.Stream
	for _, j := range jobs {
		st, err := e.Submit(context.Background(), engine.Request{Prompt: j.prompt, Sampling: engine.SamplingParams{MaxTokens: j.n, IgnoreEOS: true}})
		if err != nil {
			t.Fatal(err)
		}
		streams = append(streams, st)
	}
	var out [][]int32
	for i, st := range streams {
		toks, ev, err := st.Collect(context.Background())
		if err != nil || ev.Finish != engine.FinishLength {
			t.Fatalf("job %d ended with %v (%v): %v", i, ev.Finish, ev.Err, err)
		}
		out = append(out, toks)
	}
	return out
}

func randomPrompt(rng *rand.Rand, prefix []int32, n int) []int32 {
	p := slices.Clone(prefix)
	for range n {
		p = append(p, int32(3+rng.IntN(500)))
	}
	return p
}

// TestPythonRunnerMatchesGo: the numpy reference runner, driven through the protocol,
// generates the same greedy tokens as the Go llama runner on the same checkpoint, with
// prefix hits (a second wave sharing the first's prefixes) and preemption (a pool of 40
// pages for 10 sequences of up to 90 tokens).
func TestPythonRunnerMatchesGo(t *testing.T) {
	dir := llamaCheckpoint(t)
	cfg := engine.Config{MaxBatchTokens: 512, MaxSeqs: 10, CacheBytes: pageBudget}
	ge := goLlama(t, dir, cfg)
	pe, _ := pyLlama(t, dir, cfg, wire.Config{})
	rng := rand.New(rand.NewPCG(5, 6))
	shared := randomPrompt(rng, nil, 33)
	var waves [2][]genJob
	for w := range waves {
		for i := range 10 {
			var p []int32
			if i%2 == 0 {
				p = randomPrompt(rng, shared, 2+rng.IntN(20))
			} else {
				p = randomPrompt(rng, nil, 4+rng.IntN(40))
			}
			waves[w] = append(waves[w], genJob{p, 20 + rng.IntN(30)})
		}
	}
	for w, jobs := range waves {
		want, got := generate(t, ge, jobs), generate(t, pe, jobs)
		for i := range jobs {
			if !slices.Equal(got[i], want[i]) {
				t.Fatalf("wave %d job %d: the Python runner generated %v, the Go runner %v", w, i, got[i], want[i])
			}
		}
	}
	c := pe.Counters()
	if c.PrefixHits == 0 || c.Preemptions == 0 {
		t.Fatalf("the Python run had %d prefix hits and %d preemptions; the test needs both", c.PrefixHits, c.Preemptions)
	}
	t.Logf("prefix hits %d tokens, preemptions %d", c.PrefixHits, c.Preemptions)
}

// TestPythonRunnerAbortAndKill: an aborted request ends with abort and the others go on;
// killing the runner process mid-stream fails only the requests of the step in flight,
// the runner is restarted, and the queued requests complete with the Go runner's tokens.
func TestPythonRunnerAbortAndKill(t *testing.T) {
	dir := llamaCheckpoint(t)
	cfg := engine.Config{MaxBatchTokens: 512, MaxSeqs: 2, CacheBytes: pageBudget}
	ge := goLlama(t, dir, cfg)
	pe, rem := pyLlama(t, dir, cfg, wire.Config{})
	rng := rand.New(rand.NewPCG(7, 8))
	var jobs []genJob
	for range 5 {
		jobs = append(jobs, genJob{randomPrompt(rng, nil, 10), 60})
	}
	want := generate(t, ge, jobs)

	// Abort: the first request is cancelled after its first tokens.
	ctx, cancel := context.WithCancel(context.Background())
	st, err := pe.Submit(ctx, engine.Request{Prompt: jobs[0].prompt, Sampling: engine.SamplingParams{MaxTokens: 200, IgnoreEOS: true}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(context.Background()); err != nil {
		t.Fatal(err)
	}
	cancel()
	if _, ev, err := st.Collect(context.Background()); err != nil || ev.Finish != engine.FinishAbort {
		t.Fatalf("the aborted request ended with %v: %v", ev.Finish, err)
	}

	var streams []*engine.Stream
	for _, j := range jobs {
		st, err := pe.Submit(context.Background(), engine.Request{Prompt: j.prompt, Sampling: engine.SamplingParams{MaxTokens: j.n, IgnoreEOS: true}})
		if err != nil {
			t.Fatal(err)
		}
		streams = append(streams, st)
	}
	if _, err := streams[0].Recv(context.Background()); err != nil {
		t.Fatal(err)
	}
	pid := rem.Pid()
	if pid == 0 {
		t.Fatal("no runner process")
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	failed := 0
	for i, st := range streams {
		toks, ev, err := st.Collect(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		switch ev.Finish {
		case engine.FinishError:
			if !errors.Is(ev.Err, wire.ErrRunnerDied) || !strings.Contains(ev.Err.Error(), "killed") {
				t.Fatalf("request %d failed with %v; want ErrRunnerDied saying the process was killed", i, ev.Err)
			}
			failed++
		case engine.FinishLength:
			if !slices.Equal(toks, want[i]) {
				t.Fatalf("request %d after the restart generated %v, the Go runner %v", i, toks, want[i])
			}
		default:
			t.Fatalf("request %d ended with %v: %v", i, ev.Finish, ev.Err)
		}
	}
	if failed == 0 || failed > 2 {
		t.Fatalf("%d requests failed; only those in flight (1 or 2) may", failed)
	}
	if rem.Restarts() != 1 || rem.Health() != nil || rem.Pid() == pid {
		t.Fatalf("restarts %d, health %v, pid %d (was %d)", rem.Restarts(), rem.Health(), rem.Pid(), pid)
	}
}

// TestPythonRunnerUnixSocket: the runner listening on a Unix socket (--listen) serves
// the engine as the exec one does.
func TestPythonRunnerUnixSocket(t *testing.T) {
	py := runnerPython(t)
	dir := llamaCheckpoint(t)
	sock := filepath.Join(t.TempDir(), "llama.sock")
	cmd := exec.Command(py, "-m", "resin_runner.llama", "--weights", dir, "--listen", "unix:"+sock)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	for i := 0; ; i++ {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		if i > 600 {
			t.Fatal("the runner did not create its socket")
		}
		time.Sleep(100 * time.Millisecond)
	}
	cfg := engine.Config{CacheBytes: pageBudget}
	pe, _ := pyLlama(t, dir, cfg, wire.Config{Spec: "unix:" + sock})
	ge := goLlama(t, dir, cfg)
	jobs := []genJob{{[]int32{1, 5, 9, 200, 7}, 12}}
	if got, want := generate(t, pe, jobs), generate(t, ge, jobs); !slices.Equal(got[0], want[0]) {
		t.Fatalf("unix runner: %v, Go runner %v", got[0], want[0])
	}
}

// nodeCompletion makes one completion with the openai npm client and prints its text.
const nodeCompletion = `
const OpenAI = require(process.env.OPENAI_MODULES + "/openai");
const client = new OpenAI({ baseURL: process.env.BASE_URL + "/v1", apiKey: "none", maxRetries: 0 });
(async () => {
  const c = await client.completions.create({ model: "e2e", prompt: "Hello", max_tokens: 8, temperature: 0 });
  console.log(JSON.stringify({ text: c.choices[0].text, finish: c.choices[0].finish_reason }));
})().catch((e) => { console.error("client failed:", e); process.exit(1); });
`

// TestServePythonRunner: `resin serve --runner exec:'python -m resin_runner.llama ...'`
// answers /health and completions (through the openai npm client when it is installed,
// else plain HTTP) with the Go llama runner's greedy text; when the runner process is
// killed /health says so, and the next request restarts it and is answered.
func TestServePythonRunner(t *testing.T) {
	py := runnerPython(t)
	dir := llamaCheckpoint(t)
	tok, _, err := tiny.Load()
	if err != nil {
		t.Fatal(err)
	}
	ids, _ := tok.Encode("Hello", true)
	ge := goLlama(t, dir, engine.Config{})
	st, err := ge.Submit(context.Background(), engine.Request{Prompt: ids, Sampling: engine.SamplingParams{MaxTokens: 8}})
	if err != nil {
		t.Fatal(err)
	}
	toks, ev, err := st.Collect(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if ev.Finish == engine.FinishStop {
		toks = toks[:len(toks)-1]
	}
	want := tok.Decode(toks, true)

	bin := filepath.Join(t.TempDir(), "resin")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, base, logs := startServer(t, ctx, bin, "serve", "--port", "0", "--served-model-name", "e2e",
		"--runner", "exec:"+py+" -m resin_runner.llama --weights "+dir, "--runner-cache-bytes", "4000000")
	died := make(chan string, 1)
	go func() {
		for logs.Scan() {
			if strings.Contains(logs.Text(), "runner died") {
				select {
				case died <- logs.Text():
				default:
				}
			}
		}
	}()
	health := func() (int, string) {
		resp, err := http.Get(base + "/health")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	// complete returns the completion's text, or its error message with ok false.
	complete := func() (text string, ok bool) {
		body := `{"model":"e2e","prompt":"Hello","max_tokens":8,"temperature":0}`
		resp, err := http.Post(base+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out struct {
			Choices []struct {
				Text string `json:"text"`
			} `json:"choices"`
			Error struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		b, _ := io.ReadAll(resp.Body)
		if err := json.Unmarshal(b, &out); err != nil {
			t.Fatalf("completion: %d %s", resp.StatusCode, b)
		}
		if len(out.Choices) != 1 {
			return out.Error.Message, false
		}
		return out.Choices[0].Text, true
	}
	if code, body := health(); code != 200 {
		t.Fatalf("/health: %d %s", code, body)
	}
	if text, ok := complete(); !ok || text != want {
		t.Fatalf("completion through the Python runner: %q, the Go runner says %q", text, want)
	}
	if node, err := exec.LookPath("node"); err == nil {
		modules := os.Getenv("RESIN_OPENAI_NODE_MODULES")
		if modules == "" {
			modules = filepath.Join("..", "..", ".cache", "node-openai", "node_modules")
		}
		if _, err := os.Stat(filepath.Join(modules, "openai", "package.json")); err == nil {
			modules, _ = filepath.Abs(modules)
			script := filepath.Join(t.TempDir(), "client.cjs")
			if err := os.WriteFile(script, []byte(nodeCompletion), 0o644); err != nil {
				t.Fatal(err)
			}
			cmd := exec.CommandContext(ctx, node, script)
			cmd.Env = append(os.Environ(), "OPENAI_MODULES="+modules, "BASE_URL="+base)
			out, err := cmd.CombinedOutput()
			var got struct{ Text, Finish string }
			if err != nil || json.Unmarshal(out, &got) != nil || got.Text != want {
				t.Fatalf("openai client: %v, %s; want text %q", err, out, want)
			}
		} else {
			t.Logf("the openai npm package is not installed in %s: checked over plain HTTP only", modules)
		}
	}

	// Kill the runner. The engine watches an exec runner's process, so it logs the death
	// at once and restarts the runner in the background (core/wire's tests pin /health's
	// 503 while it is down; here the restart can win that race). A request then runs on
	// the restarted runner, or, when it was in flight as the runner died, fails saying why.
	child := childOf(t, srv.Process.Pid)
	if err := syscall.Kill(child, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case line := <-died:
		if !strings.Contains(line, "killed") {
			t.Fatalf("the runner's death was logged without its cause: %s", line)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the runner was killed and resin serve logged no 'runner died' in 30 s")
	}
	text, ok := complete()
	if !ok {
		if !strings.Contains(text, "runner died") || !strings.Contains(text, "killed") {
			t.Fatalf("the request during which the runner died: %q", text)
		}
		text, ok = complete()
	}
	if !ok || text != want {
		t.Fatalf("completion after the restart: ok %v, %q, want %q", ok, text, want)
	}
	if code, body := health(); code != 200 {
		t.Fatalf("/health after the restart: %d %s", code, body)
	}
}

// childOf returns the pid of the one child process of pid.
func childOf(t *testing.T, pid int) int {
	t.Helper()
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	for _, f := range tasks {
		b, _ := os.ReadFile(f)
		for _, s := range strings.Fields(string(b)) {
			if c, err := strconv.Atoi(s); err == nil {
				return c
			}
		}
	}
	t.Skip("cannot find the runner process under /proc (not Linux?)")
	return 0
}

// TestPythonRunnerSampling: seeded sampling (temperature, top-k, top-p, min-p), penalties,
// logit bias, min_tokens, logprobs with alternatives and prompt logprobs give the Go
// runner's tokens, and logprobs within float tolerance: the Python sampler is the Go one.
func TestPythonRunnerSampling(t *testing.T) {
	dir := llamaCheckpoint(t)
	cfg := engine.Config{CacheBytes: pageBudget}
	ge := goLlama(t, dir, cfg)
	pe, _ := pyLlama(t, dir, cfg, wire.Config{})
	rng := rand.New(rand.NewPCG(9, 10))
	params := []engine.SamplingParams{
		{Temperature: 0.9, Seed: 11, HasSeed: true},
		{Temperature: 0.7, TopK: 40, TopP: 0.9, Seed: 12, HasSeed: true},
		{Temperature: 1.2, MinP: 0.05, Seed: 13, HasSeed: true, Logprobs: true, TopLogprobs: 3},
		{Temperature: 0.8, Seed: 14, HasSeed: true, PresencePenalty: 0.5, FrequencyPenalty: 0.3, RepetitionPenalty: 1.2,
			LogitBias: map[int32]float32{7: 5, 9: -100}, MinTokens: 5},
		{Logprobs: true, TopLogprobs: 2, PromptLogprobs: true},
	}
	for k, sp := range params {
		sp.MaxTokens = 24
		p := randomPrompt(rng, nil, 12)
		run := func(e *engine.Engine) ([]int32, []engine.TokenLogprob, []engine.TokenLogprob) {
			st, err := e.Submit(context.Background(), engine.Request{Prompt: p, Sampling: sp})
			if err != nil {
				t.Fatal(err)
			}
			var toks []int32
			var lps, plps []engine.TokenLogprob
			for {
				ev, err := st.Recv(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				toks, lps = append(toks, ev.Tokens...), append(lps, ev.Logprobs...)
				plps = append(plps, ev.PromptLogprobs...)
				if ev.Finish != engine.FinishNone {
					if ev.Finish == engine.FinishError || ev.Finish == engine.FinishAbort {
						t.Fatalf("params %d: %v: %v", k, ev.Finish, ev.Err)
					}
					return toks, lps, plps
				}
			}
		}
		gt, gl, gp := run(ge)
		pt, pl, pp := run(pe)
		if !slices.Equal(gt, pt) {
			t.Fatalf("params %d: the Python runner sampled %v, the Go runner %v", k, pt, gt)
		}
		if len(gl) != len(pl) || len(gp) != len(pp) {
			t.Fatalf("params %d: %d/%d logprobs from Python, %d/%d from Go", k, len(pl), len(pp), len(gl), len(gp))
		}
		for _, pair := range [][2][]engine.TokenLogprob{{gl, pl}, {gp, pp}} {
			for j := range pair[0] {
				g, q := pair[0][j], pair[1][j]
				if g.Token != q.Token || math.Abs(float64(g.Logprob-q.Logprob)) > 1e-3 || len(g.Top) != len(q.Top) {
					t.Fatalf("params %d, logprob %d: Python %+v, Go %+v", k, j, q, g)
				}
				for a := range g.Top {
					if g.Top[a].Token != q.Top[a].Token || math.Abs(float64(g.Top[a].Logprob-q.Top[a].Logprob)) > 1e-3 {
						t.Fatalf("params %d, logprob %d, alternative %d: Python %+v, Go %+v", k, j, a, q.Top[a], g.Top[a])
					}
				}
			}
		}
		if (sp.Logprobs && len(gl) == 0) || (sp.PromptLogprobs && len(gp) != len(p)-1) {
			t.Fatalf("params %d: %d logprobs, %d prompt logprobs", k, len(gl), len(gp))
		}
	}
}

// TestTorchRunnerMatchesGo: the PyTorch variant (resin_runner.llama_torch) generates the Go
// runner's greedy tokens, with prefix hits and preemption. It needs a Python with torch:
// $RESIN_TORCH_PYTHON or .cache/torch-venv (not installed by CI; the test skips without).
func TestTorchRunnerMatchesGo(t *testing.T) {
	py := os.Getenv("RESIN_TORCH_PYTHON")
	if py == "" {
		py = filepath.Join("..", "..", ".cache", "torch-venv", "bin", "python")
	}
	if out, err := exec.Command(py, "-c", "import torch, numpy").CombinedOutput(); err != nil {
		t.Skipf("no Python with torch and numpy at %s (set RESIN_TORCH_PYTHON): %v %s", py, err, out)
	}
	py, _ = filepath.Abs(py)
	src, _ := filepath.Abs(filepath.Join("..", "..", "python"))
	t.Setenv("PYTHONPATH", src)
	dir := llamaCheckpoint(t)
	cfg := engine.Config{MaxBatchTokens: 512, MaxSeqs: 8, CacheBytes: pageBudget}
	ge := goLlama(t, dir, cfg)
	r, err := wire.Dial(context.Background(), wire.Config{Spec: "exec:" + py + " -m resin_runner.llama_torch --weights " + dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	te := runEngine(t, r, cfg)
	rng := rand.New(rand.NewPCG(11, 12))
	shared := randomPrompt(rng, nil, 36)
	var jobs []genJob
	for i := range 10 {
		if i%2 == 0 {
			jobs = append(jobs, genJob{randomPrompt(rng, shared, 3+rng.IntN(10)), 40})
		} else {
			jobs = append(jobs, genJob{randomPrompt(rng, nil, 5+rng.IntN(30)), 40})
		}
	}
	// The first two fill the prefix cache, the rest hit it.
	for _, wave := range [][]genJob{jobs[:2], jobs[2:]} {
		want, got := generate(t, ge, wave), generate(t, te, wave)
		for i := range wave {
			if !slices.Equal(got[i], want[i]) {
				t.Fatalf("job %d: the torch runner generated %v, the Go runner %v", i, got[i], want[i])
			}
		}
	}
	if c := te.Counters(); c.PrefixHits == 0 || c.Preemptions == 0 {
		t.Fatalf("%d prefix hits, %d preemptions; the test needs both", c.PrefixHits, c.Preemptions)
	}
}
