package pydemo

// The model's own tests: yours to extend as the model becomes real. The model-agnostic
// checks are in conformance_test.go, which resin-new keeps up to date; they get the runner
// from testRunner below. Every test here needs the Python interpreter FindPython finds and
// skips, saying what to install, without it.

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/core/runnertest"
)

// needPython returns the interpreter that runs the model, or skips the test.
func needPython(t testing.TB) string {
	t.Helper()
	py, err := FindPython()
	if err != nil {
		t.Skipf("the model runs in Python, and %v", err)
	}
	return py
}

// tinyDir writes the scaffold's config.json shrunk to a size the tests run in a blink,
// keeping the variant (model type, GQA ratio, biases, tied head, rope scaling, window), to
// a directory without safetensors: the runner uses its seeded random weights.
func tinyDir(t testing.TB) string {
	t.Helper()
	data, err := os.ReadFile("config.json")
	if err != nil {
		t.Fatal(err)
	}
	var c map[string]any
	if err := json.Unmarshal(data, &c); err != nil {
		t.Fatalf("config.json: %v", err)
	}
	num := func(k string) int { f, _ := c[k].(float64); return int(f) }
	heads, kv := num("num_attention_heads"), max(num("num_key_value_heads"), 1)
	c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"] = 64, 96, 2
	c["num_key_value_heads"], c["num_attention_heads"], c["head_dim"] = 2, 2*min(max(heads/kv, 1), 4), 16
	c["vocab_size"] = min(num("vocab_size"), 384)
	if num("sliding_window") > 0 {
		c["sliding_window"] = 5 // short enough that the tests cross it
	}
	out, _ := json.Marshal(c)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "config.json"), out, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// testRunner starts the Python runner on tinyDir's model with 4-token pages (so that the
// suite's prompts span pages) and a 4 MiB pool. The runner stops when the test ends.
func testRunner(t testing.TB) (engine.Runner, *kvslab.Pool) {
	t.Helper()
	py := needPython(t)
	r, pool, err := OpenPython(tinyDir(t), 4<<20, PythonOptions{Python: py, Args: []string{"--page-tokens", "4", "--seed", "7"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r, pool
}

// runPythonTests runs `py -m unittest ARGS` in the scaffold with python/ on PYTHONPATH and
// skips when every test it ran skipped.
func runPythonTests(t *testing.T, py string, args ...string) string {
	t.Helper()
	src, _ := filepath.Abs("python")
	cmd := exec.Command(py, append(append([]string{"-m", "unittest"}, args...), "-v")...)
	cmd.Env = append(os.Environ(), "PYTHONPATH="+src+string(os.PathListSeparator)+os.Getenv("PYTHONPATH"), "PYTHONDONTWRITEBYTECODE=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s -m unittest %s: %v\n%s", py, strings.Join(args, " "), err, out)
	}
	if s := string(out); strings.Contains(s, "OK (skipped=") && strings.Contains(s, "Ran 1 test in ") {
		for _, l := range strings.Split(s, "\n") {
			if _, why, ok := strings.Cut(l, "... skipped "); ok {
				t.Skipf("%s skipped it: %s", py, why)
			}
		}
		t.Skipf("%s skipped it", py)
	}
	t.Logf("%s", out)
	return string(out)
}

// TestEngineGreedy serves the model through core/engine and the runner protocol and checks
// that greedy generation equals the naive forward's argmax loop
// (python -m pydemo_runner.reference), for two requests batched together.
func TestEngineGreedy(t *testing.T) {
	r, pool := testRunner(t)
	e, err := engine.New(r, engine.Config{Pool: pool})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.Run(ctx); close(done) }()
	defer func() { cancel(); <-done; e.Close() }()

	vocab := r.Info().VocabSize
	prompts := [][]int32{runnertest.Prompt(7, vocab, 4), runnertest.Prompt(5, vocab, 5)}
	var streams []*engine.Stream
	for _, p := range prompts {
		s, err := e.Submit(ctx, engine.Request{Prompt: p, Sampling: engine.SamplingParams{MaxTokens: 6, IgnoreEOS: true}})
		if err != nil {
			t.Fatal(err)
		}
		streams = append(streams, s)
	}
	dir := tinyDir(t)
	for i, s := range streams {
		got, ev, err := s.Collect(ctx)
		if err == nil {
			err = ev.Err
		}
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		want := referenceGreedy(t, dir, prompts[i], 6)
		if join(got) != join(want) {
			t.Fatalf("request %d: the engine generated %v, the naive forward %v", i, got, want)
		}
	}
}

// referenceGreedy runs python -m pydemo_runner.reference on the model in dir.
func referenceGreedy(t *testing.T, dir string, prompt []int32, n int) []int32 {
	t.Helper()
	src, _ := filepath.Abs("python")
	cmd := exec.Command(needPython(t), "-m", PythonModule+".reference", "--weights", dir, "--seed", "7",
		"--prompt-ids", join(prompt), "--max-tokens", strconv.Itoa(n), "--ignore-eos")
	cmd.Env = append(os.Environ(), "PYTHONPATH="+src, "PYTHONDONTWRITEBYTECODE=1")
	out, err := cmd.Output()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		t.Fatalf("%s: %v\n%s", cmd, err, ee.Stderr)
	} else if err != nil {
		t.Fatal(err)
	}
	var toks []int32
	for _, f := range strings.Split(strings.TrimSpace(string(out)), ",") {
		v, err := strconv.Atoi(f)
		if err != nil {
			t.Fatalf("reference printed %q, want token ids", out)
		}
		toks = append(toks, int32(v))
	}
	return toks
}

func join(toks []int32) string {
	s := make([]string, len(toks))
	for i, t := range toks {
		s[i] = strconv.Itoa(int(t))
	}
	return strings.Join(s, ",")
}

// TestTransformersParity runs the Python package's transformers parity test
// (python/tests/test_transformers.py) with $RESIN_TORCH_PYTHON, an interpreter that has
// torch, transformers and resin_runner (default: the runtime's), and skips where it skips.
func TestTransformersParity(t *testing.T) {
	py := os.Getenv("RESIN_TORCH_PYTHON")
	if py == "" {
		py = needPython(t)
	}
	runPythonTests(t, py, "tests.test_transformers")
}
