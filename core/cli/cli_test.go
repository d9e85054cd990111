package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/spf13/cobra"

	"github.com/resin-llm/resin/core/cli/clitest"
	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/engine/enginetest"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/core/tokenizer"
)

// tinyVocab is the vocabulary of core/tokenizer/tiny, which the test models use.
const tinyVocab = 1025

// testOpener opens the engine's deterministic test runner whatever dir holds.
func testOpener(dir string, cacheBytes int64) (engine.Runner, *kvslab.Pool, error) {
	r, err := enginetest.New(enginetest.Config{VocabSize: tinyVocab, MaxContext: 512, Pages: 256})
	if err != nil {
		return nil, nil, err
	}
	return r, r.Pool(), nil
}

// modelDir returns a model directory, with the tiny tokenizer in it when withTokenizer.
func modelDir(t *testing.T, withTokenizer bool) string {
	t.Helper()
	dir := t.TempDir()
	if withTokenizer {
		for _, f := range []string{"tokenizer.json", "tokenizer_config.json"} {
			b, err := os.ReadFile(filepath.Join("..", "tokenizer", "tiny", f))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	return dir
}

func run(t *testing.T, cmd *cobra.Command, args ...string) (string, string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), errOut.String(), err
}

func greedyRef(prompt []int32, n int) []int32 {
	return enginetest.Reference(tinyVocab, prompt, n, engine.SamplingRow{Logprobs: -1})
}

func TestGenerateTokenIDs(t *testing.T) {
	dir := modelDir(t, false)
	for _, c := range []struct {
		args   []string
		prompt []int32
	}{
		{[]string{"--prompt-ids", "5, 6,7"}, []int32{5, 6, 7}},
		{nil, defaultPromptIDs},
	} {
		out, _, err := run(t, GenerateCmd(NewModelDir("test", testOpener)), append([]string{"--model", dir, "--max-tokens", "8"}, c.args...)...)
		if err != nil {
			t.Fatalf("generate %v: %v", c.args, err)
		}
		for _, want := range []string{
			fmt.Sprintf("prompt: %v\n", c.prompt),
			fmt.Sprintf("tokens: %v\n", greedyRef(c.prompt, 8)),
			"finish: length, " + fmt.Sprint(len(c.prompt)) + " prompt + 8 generated tokens",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("generate %v printed\n%s\nwant a line with %q", c.args, out, want)
			}
		}
		if strings.Contains(out, "text:") {
			t.Errorf("generate without a tokenizer printed text:\n%s", out)
		}
	}
}

func TestGenerateText(t *testing.T) {
	dir := modelDir(t, true)
	tok, err := tokenizer.Load(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	ids, err := tok.Encode("Once upon a time", true)
	if err != nil {
		t.Fatal(err)
	}
	want := tok.Decode(greedyRef(ids, 12), true) + "\n"
	for _, args := range [][]string{{"Once upon a time"}, {"--prompt", "Once upon a time"}} {
		out, errOut, err := run(t, GenerateCmd(NewModelDir("test", testOpener)), append([]string{"--model", dir, "--max-tokens", "12", "--stats"}, args...)...)
		if err != nil {
			t.Fatalf("generate %v: %v", args, err)
		}
		if out != want {
			t.Errorf("generate %v printed %q, want %q", args, out, want)
		}
		if !strings.Contains(errOut, "finish_reason=length prompt_tokens="+fmt.Sprint(len(ids))+" completion_tokens=12") {
			t.Errorf("generate %v stats: %q", args, errOut)
		}
	}
	// With ids and a tokenizer, the text of the tokens is printed too.
	out, _, err := run(t, GenerateCmd(NewModelDir("test", testOpener)), "--model", dir, "--max-tokens", "4", "--prompt-ids", "40,41")
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("text:   %q\n", tok.Decode(greedyRef([]int32{40, 41}, 4), true)); !strings.Contains(out, want) {
		t.Errorf("generate --prompt-ids printed\n%s\nwant %q", out, want)
	}
}

func TestGenerateBadInput(t *testing.T) {
	bare, withTok := modelDir(t, false), modelDir(t, true)
	failing := func(string, int64) (engine.Runner, *kvslab.Pool, error) {
		return nil, nil, errors.New("no weights here")
	}
	for _, c := range []struct {
		open Opener
		args []string
		want string
	}{
		{testOpener, []string{"--model", bare, "--prompt-ids", "1,x"}, `--prompt-ids: "x" is not a token id`},
		{testOpener, []string{"--model", bare, "--prompt-ids", " , "}, "no token ids"},
		{testOpener, []string{"--model", bare, "--prompt-ids", ""}, "no token ids"},
		{testOpener, []string{"--model", bare, "hello"}, "needs a tokenizer"},
		{testOpener, []string{"--model", withTok, ""}, "the prompt is empty"},
		{testOpener, []string{"--model", withTok, "--prompt", ""}, "the prompt is empty"},
		{testOpener, []string{"--model", withTok, "--prompt", "a", "b"}, "give the prompt once"},
		{testOpener, []string{"--model", withTok, "--prompt-ids", "1", "hi"}, "exclusive"},
		{testOpener, []string{"--model", withTok, "--chat"}, "apply to a text prompt"},
		{testOpener, []string{"--model", withTok, "--max-tokens", "-2", "hi"}, "--max-tokens -2"},
		// 0 generated up to the context (the engine's 0), 254 tokens of the test runner.
		{testOpener, []string{"--model", bare, "--max-tokens", "0"}, "--max-tokens 0: a run generates at least one token"},
		{testOpener, []string{"--model", filepath.Join(bare, "nope")}, "nope"},
		{testOpener, []string{"--model", bare, "--cache-bytes", "-1"}, "--cache-bytes -1 is negative"},
		{testOpener, []string{"--model", bare, "--max-batch-tokens", "0"}, "--max-batch-tokens 0"},
		{testOpener, []string{"--model", bare, "--tokenizer", filepath.Join(bare, "none.json")}, "none.json"},
		{testOpener, []string{"--model", withTok, "--chat-template", filepath.Join(withTok, "tokenizer.json")}, "no chat template"},
		{testOpener, []string{"--model", withTok, "--chat-template", filepath.Join(withTok, "missing.json")}, "--chat-template: "},
		{failing, []string{"--model", bare}, "open model test in " + bare + ": no weights here"},
	} {
		_, _, err := run(t, GenerateCmd(NewModelDir("test", c.open)), c.args...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("generate %v: error %v, want one containing %q", c.args, err, c.want)
		}
	}
}

func TestServe(t *testing.T) {
	dir := modelDir(t, true)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv := clitest.StartServe(t, ctx, ServeCmd(NewModelDir("test", testOpener)),
		"--model", dir, "--port", "0", "--served-model-name", "tiny", "--api-key", "k")
	base := srv.URL
	body, _ := json.Marshal(map[string]any{"model": "tiny", "prompt": "Hello", "max_tokens": 6, "temperature": 0})
	req, _ := http.NewRequest("POST", base+"/v1/completions", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer k")
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var got struct {
		Choices []struct {
			Text string `json:"text"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(raw, &got); err != nil || resp.StatusCode != 200 || len(got.Choices) != 1 {
		t.Fatalf("completion: %d %s (%v)", resp.StatusCode, raw, err)
	}
	tok, _ := tokenizer.Load(filepath.Join(dir, "tokenizer.json"))
	ids, _ := tok.Encode("Hello", true)
	if want := tok.Decode(greedyRef(ids, 6), true); got.Choices[0].Text != want {
		t.Errorf("completion text %q, want %q", got.Choices[0].Text, want)
	}
	cancel()
	if err := srv.Wait(); err != nil {
		t.Fatalf("serve: %v", err)
	}
	for _, want := range []string{"model=tiny", "runner=test", "auth=true", "msg=stopped"} {
		if !strings.Contains(srv.Logs(), want) {
			t.Errorf("server log lacks %q:\n%s", want, srv.Logs())
		}
	}

	_, _, err = run(t, ServeCmd(NewModelDir("test", testOpener)), "--model", modelDir(t, false), "--port", "0")
	if err == nil || !strings.Contains(err.Error(), "needs a tokenizer") {
		t.Errorf("serve without a tokenizer: %v", err)
	}
	_, _, err = run(t, ServeCmd(NewModelDir("test", testOpener)), "--model", dir, "--addr", "no-port")
	if err == nil || !strings.Contains(err.Error(), "no-port") {
		t.Errorf("serve --addr no-port: %v", err)
	}
}

func TestBench(t *testing.T) {
	dir := modelDir(t, false)
	out, _, err := run(t, BenchCmd(NewModelDir("test", testOpener)), "--model", dir, "--requests", "5", "--prompt-len", "9", "--gen-len", "4", "--concurrency", "2")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "bench test: 5 requests × (9 prompt + 4 generated) tokens, concurrency 2") || !strings.Contains(out, "tokens/s") {
		t.Errorf("bench printed %q", out)
	}
	t.Logf("%s", out)
	if _, _, err := run(t, BenchCmd(NewModelDir("test", testOpener)), "--model", dir, "--gen-len", "0"); err == nil {
		t.Error("bench --gen-len 0 accepted")
	}
}

func TestStartStop(t *testing.T) {
	r, p, err := testOpener("", 0)
	if err != nil {
		t.Fatal(err)
	}
	e, err := Start(&Runtime{Runner: r, Pool: p, RunnerName: "test"}, engine.Config{})
	if err != nil {
		t.Fatal(err)
	}
	s, err := e.Submit(context.Background(), engine.Request{Prompt: []int32{3, 4}, Sampling: engine.SamplingParams{MaxTokens: 3}})
	if err != nil {
		t.Fatal(err)
	}
	if toks, _, err := s.Collect(context.Background()); err != nil || len(toks) != 3 {
		t.Fatalf("collect: %v %v", toks, err)
	}
	if err := e.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := e.Stop(); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	if _, err := e.Submit(context.Background(), engine.Request{Prompt: []int32{3}}); !errors.Is(err, engine.ErrClosed) {
		t.Fatalf("submit after Stop: %v, want ErrClosed", err)
	}
	if p.OpenSeqs() != 0 {
		t.Fatalf("%d sequences left open", p.OpenSeqs())
	}
}

func TestKernels(t *testing.T) {
	cacheDir := t.TempDir()
	empty := KernelsCmd(Kernels{Sources: fstest.MapFS{"a.txt": {Data: []byte("x")}}})
	if _, _, err := run(t, empty, "--cache-dir", cacheDir); err == nil || !strings.Contains(err.Error(), "no .cu files") {
		t.Fatalf("kernels with no .cu files: %v", err)
	}
	if _, _, err := run(t, KernelsCmd(Kernels{}), "--cache-dir", cacheDir); err == nil || !strings.Contains(err.Error(), "no sources") {
		t.Fatalf("kernels with no sources: %v", err)
	}
	good := fstest.MapFS{"scale.cu": {Data: []byte(`extern "C" __global__ void scale(float* x, float a) { x[threadIdx.x] *= a; }`)}}
	out, _, err := run(t, KernelsCmd(Kernels{Sources: good}), "--cache-dir", cacheDir, "--arch", "sm_90a")
	if errors.Is(err, cudart.ErrNoNVRTC) {
		t.Skipf("NVRTC is not installed (run .ci/setup.d and source .cache/test.env): %v", err)
	}
	if err != nil || !strings.Contains(out, "scale.cu") || !strings.Contains(out, "sm_90a") {
		t.Fatalf("kernels: %v, printed %q", err, out)
	}
	t.Logf("%s", out)
	bad := fstest.MapFS{"broken.cu": {Data: []byte(`extern "C" __global__ void k( { }`)}}
	if _, _, err := run(t, KernelsCmd(Kernels{Sources: bad}), "--cache-dir", cacheDir, "--arch", "sm_90a"); err == nil || !strings.Contains(err.Error(), "broken.cu") {
		t.Fatalf("kernels on a broken source: %v", err)
	}
}

func TestProfiling(t *testing.T) {
	dir := t.TempDir()
	var preRan bool
	newRoot := func() *cobra.Command {
		root := &cobra.Command{Use: "x", SilenceUsage: true, SilenceErrors: true,
			PersistentPreRunE: func(*cobra.Command, []string) error { preRan = true; return nil }}
		AddProfiling(root)
		root.AddCommand(&cobra.Command{Use: "work", RunE: func(*cobra.Command, []string) error {
			s := 0
			for i := 0; i < 1e6; i++ {
				s += i % 7
			}
			_ = fmt.Sprint(s)
			return nil
		}})
		return root
	}
	cpu, mem := filepath.Join(dir, "cpu.prof"), filepath.Join(dir, "heap.prof")
	if _, _, err := run(t, newRoot(), "work", "--cpuprofile", cpu, "--memprofile", mem); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{cpu, mem} {
		if st, err := os.Stat(p); err != nil || st.Size() == 0 {
			t.Errorf("%s: %v (empty or missing profile)", p, err)
		}
	}
	if !preRan {
		t.Error("the root's own PersistentPreRunE did not run")
	}
	if _, _, err := run(t, newRoot(), "work", "--cpuprofile", filepath.Join(dir, "no", "cpu.prof")); err == nil || !strings.Contains(err.Error(), "--cpuprofile") {
		t.Errorf("--cpuprofile into a missing directory: %v", err)
	}
}

// TestGenerateMaxTokensUnlimited: --max-tokens -1 generates up to the model's context (the
// test runner's 512 tokens, less the prompt); 0 is refused (TestGenerateBadInput): it
// meant the same before, and a user asking for none got 254 tokens.
func TestGenerateMaxTokensUnlimited(t *testing.T) {
	out, _, err := run(t, GenerateCmd(NewModelDir("test", testOpener)), "--model", modelDir(t, false), "--max-tokens", "-1", "--prompt-ids", "1,2,3,4")
	if err != nil {
		t.Fatal(err)
	}
	if want := "finish: length, 4 prompt + 508 generated tokens"; !strings.Contains(out, want) {
		t.Errorf("--max-tokens -1 printed\n%s\nwant a line with %q", out, want)
	}
}

// TestGenerateInterrupted: generate whose context ends (Ctrl-C) fails saying it was
// interrupted; it said "context canceled".
func TestGenerateInterrupted(t *testing.T) {
	dir := modelDir(t, false)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	cmd := GenerateCmd(NewModelDir("test", testOpener))
	cmd.SetOut(io.Discard)
	cmd.SetErr(io.Discard)
	cmd.SetArgs([]string{"--model", dir, "--max-tokens", "8", "--prompt-ids", "40,41"})
	if err := cmd.ExecuteContext(ctx); err == nil || err.Error() != "interrupted" {
		t.Fatalf("generate with its context ended: %v, want \"interrupted\"", err)
	}
}
