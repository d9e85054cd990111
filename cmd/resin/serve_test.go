package main

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/engine/enginetest"
	"github.com/resin-llm/resin/core/tokenizer"
	"github.com/resin-llm/resin/core/tokenizer/tiny"
)

// openaiScript drives a server with the official openai npm client and prints what the
// client received, one JSON object.
const openaiScript = `
const OpenAI = require(process.env.OPENAI_MODULES + "/openai");
const { BadRequestError, NotFoundError, AuthenticationError } = OpenAI;
const client = new OpenAI({ baseURL: process.env.BASE_URL + "/v1", apiKey: "e2e-key", maxRetries: 0 });
const messages = [{ role: "system", content: "Be brief." }, { role: "user", content: "Hello there" }];
function describe(e) {
  return { status: e.status, name: e.constructor.name, message: e.message,
    badRequest: e instanceof BadRequestError, notFound: e instanceof NotFoundError,
    auth: e instanceof AuthenticationError, code: e.code ?? null, type: e.type ?? null };
}
(async () => {
  const out = {};
  out.models = (await client.models.list()).data.map((m) => m.id);
  const c = await client.completions.create({ model: "e2e", prompt: "Hello", max_tokens: 8, temperature: 0 });
  out.completion = { text: c.choices[0].text, finish: c.choices[0].finish_reason, usage: c.usage, object: c.object };
  const chat = await client.chat.completions.create({ model: "e2e", messages, max_tokens: 12, temperature: 0 });
  out.chat = { content: chat.choices[0].message.content, role: chat.choices[0].message.role,
    finish: chat.choices[0].finish_reason, usage: chat.usage, object: chat.object };
  const stream = await client.chat.completions.create({ model: "e2e", messages, max_tokens: 12, temperature: 0,
    stream: true, stream_options: { include_usage: true } });
  let text = "", finish = null, chunks = 0, usage = null, role = null;
  for await (const chunk of stream) {
    chunks++;
    if (chunk.usage) usage = chunk.usage;
    const ch = chunk.choices[0];
    if (!ch) continue;
    if (ch.delta.role) role = ch.delta.role;
    if (ch.delta.content) text += ch.delta.content;
    if (ch.finish_reason) finish = ch.finish_reason;
  }
  out.stream = { text, finish, chunks, usage, role };
  const cs = await client.completions.create({ model: "e2e", prompt: "Hello", max_tokens: 8, temperature: 0, stream: true });
  let ctext = "", cfinish = null;
  for await (const chunk of cs) {
    ctext += chunk.choices[0].text;
    if (chunk.choices[0].finish_reason) cfinish = chunk.choices[0].finish_reason;
  }
  out.completionStream = { text: ctext, finish: cfinish };
  const lp = await client.chat.completions.create({ model: "e2e", messages, max_tokens: 6, temperature: 0,
    logprobs: true, top_logprobs: 2, stop: ["\u0000never"], seed: 42 });
  out.logprobs = { n: lp.choices[0].logprobs.content.length, tokens: lp.usage.completion_tokens,
    top: lp.choices[0].logprobs.content.every((c) => c.top_logprobs.length === 2 && c.logprob <= 0),
    joined: lp.choices[0].logprobs.content.map((c) => c.token).join(""), content: lp.choices[0].message.content };
  try { await client.chat.completions.create({ model: "e2e", messages, max_tokens: -1 }); out.bad = "no error"; }
  catch (e) { out.bad = describe(e); }
  try { await client.completions.create({ model: "no-such-model", prompt: "x" }); out.unknown = "no error"; }
  catch (e) { out.unknown = describe(e); }
  const wrong = new OpenAI({ baseURL: process.env.BASE_URL + "/v1", apiKey: "wrong", maxRetries: 0 });
  try { await wrong.models.list(); out.badKey = "no error"; }
  catch (e) { out.badKey = describe(e); }
  console.log(JSON.stringify(out));
})().catch((e) => { console.error("client failed:", e); process.exit(1); });
`

type clientError struct {
	Status     int     `json:"status"`
	Name       string  `json:"name"`
	Message    string  `json:"message"`
	BadRequest bool    `json:"badRequest"`
	NotFound   bool    `json:"notFound"`
	Auth       bool    `json:"auth"`
	Code       *string `json:"code"`
}

type clientUsage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

type clientReport struct {
	Models     []string `json:"models"`
	Completion struct {
		Text   string      `json:"text"`
		Finish string      `json:"finish"`
		Usage  clientUsage `json:"usage"`
		Object string      `json:"object"`
	} `json:"completion"`
	Chat struct {
		Content string      `json:"content"`
		Role    string      `json:"role"`
		Finish  string      `json:"finish"`
		Usage   clientUsage `json:"usage"`
		Object  string      `json:"object"`
	} `json:"chat"`
	Stream struct {
		Text   string       `json:"text"`
		Finish string       `json:"finish"`
		Chunks int          `json:"chunks"`
		Usage  *clientUsage `json:"usage"`
		Role   string       `json:"role"`
	} `json:"stream"`
	CompletionStream struct {
		Text   string `json:"text"`
		Finish string `json:"finish"`
	} `json:"completionStream"`
	Logprobs struct {
		N       int    `json:"n"`
		Tokens  int    `json:"tokens"`
		Top     bool   `json:"top"`
		Joined  string `json:"joined"`
		Content string `json:"content"`
	} `json:"logprobs"`
	Bad     clientError `json:"bad"`
	Unknown clientError `json:"unknown"`
	BadKey  clientError `json:"badKey"`
}

// startServer starts `bin args...` (a resin serve), killed when the test ends, and reads
// its log up to the line that gives its URL. It returns the process, the URL and the
// scanner over the rest of the log, which the caller must read to its end before Wait.
func startServer(t *testing.T, ctx context.Context, bin string, args ...string) (*exec.Cmd, string, *bufio.Scanner) {
	t.Helper()
	srv := exec.CommandContext(ctx, bin, args...)
	stderr, err := srv.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Process.Kill() })
	logs := bufio.NewScanner(stderr)
	urlRe := regexp.MustCompile(`url=(http://\S+)`)
	var logText strings.Builder
	for logs.Scan() {
		logText.WriteString(logs.Text() + "\n")
		if m := urlRe.FindStringSubmatch(logs.Text()); m != nil {
			return srv, m[1], logs
		}
	}
	t.Fatalf("resin serve did not report its address:\n%s", logText.String())
	return nil, "", nil
}

// expected computes, without the server, what the test runner generates greedily.
func expected(t *testing.T, tok *tokenizer.Tokenizer, eos []int32, prompt []int32, n int) (string, string, int) {
	t.Helper()
	toks := enginetest.Reference(tok.VocabSize(), prompt, n, engine.SamplingRow{Logprobs: -1}, eos...)
	finish := "length"
	shown := toks
	if slices.Contains(eos, toks[len(toks)-1]) {
		finish, shown = "stop", toks[:len(toks)-1]
	}
	return tok.Decode(shown, true), finish, len(toks)
}

func TestServeWithOpenAINodeClient(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed: the openai npm client cannot run")
	}
	modules := os.Getenv("RESIN_OPENAI_NODE_MODULES")
	if modules == "" {
		modules = filepath.Join("..", "..", ".cache", "node-openai", "node_modules")
	}
	if _, err := os.Stat(filepath.Join(modules, "openai", "package.json")); err != nil {
		t.Skipf("the openai npm package is not installed in %s: run .ci/setup.d/31-openai-npm.sh (scripts/test.sh does)", modules)
	}
	modules, _ = filepath.Abs(modules)

	dir := t.TempDir()
	bin := filepath.Join(dir, "resin")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, base, logs := startServer(t, ctx, bin, "serve", "--port", "0", "--served-model-name", "e2e", "--api-key", "e2e-key", "--max-context", "1024")
	rest := make(chan string, 1)
	go func() {
		var b strings.Builder
		for logs.Scan() {
			b.WriteString(logs.Text() + "\n")
		}
		rest <- b.String()
	}()

	script := filepath.Join(dir, "client.cjs")
	if err := os.WriteFile(script, []byte(openaiScript), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, node, script)
	cmd.Env = append(os.Environ(), "OPENAI_MODULES="+modules, "BASE_URL="+base)
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("node client: %v\n%s\n%s", err, out, stderr)
	}
	var rep clientReport
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("client output %q: %v", out, err)
	}

	tok, chat, err := tiny.Load()
	if err != nil {
		t.Fatal(err)
	}
	eos := endTokens(tok)
	if len(rep.Models) != 1 || rep.Models[0] != "e2e" {
		t.Errorf("models.list gave %v", rep.Models)
	}

	ids, _ := tok.Encode("Hello", true)
	text, finish, n := expected(t, tok, eos, ids, 8)
	c := rep.Completion
	if c.Object != "text_completion" || c.Text != text || c.Finish != finish || c.Usage.PromptTokens != len(ids) || c.Usage.CompletionTokens != n {
		t.Errorf("completion: client got %+v, want text %q finish %s usage %d/%d", c, text, finish, len(ids), n)
	}

	if cs := rep.CompletionStream; cs.Text != c.Text || cs.Finish != c.Finish {
		t.Errorf("streaming completion: client got %+v, want %q (%s)", cs, c.Text, c.Finish)
	}

	prompt, err := chat.Render([]map[string]any{{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}}, tokenizer.ChatOptions{AddGenerationPrompt: true})
	if err != nil {
		t.Fatal(err)
	}
	ids, _ = tok.Encode(prompt, false)
	text, finish, n = expected(t, tok, eos, ids, 12)
	ch := rep.Chat
	if ch.Object != "chat.completion" || ch.Role != "assistant" || ch.Content != text || ch.Finish != finish || ch.Usage.CompletionTokens != n || ch.Usage.PromptTokens != len(ids) {
		t.Errorf("chat: client got %+v, want content %q finish %s usage %d/%d", ch, text, finish, len(ids), n)
	}
	st := rep.Stream
	if st.Text != text || st.Finish != finish || st.Role != "assistant" || st.Chunks < 3 || st.Usage == nil || st.Usage.CompletionTokens != n {
		t.Errorf("streaming chat: client got %+v, want text %q finish %s", st, text, finish)
	}

	if lp := rep.Logprobs; lp.N == 0 || !lp.Top || (lp.N != lp.Tokens && lp.N != lp.Tokens-1) {
		t.Errorf("chat logprobs: client got %+v", lp)
	}

	if rep.Bad.Status != 400 || !rep.Bad.BadRequest || !strings.Contains(rep.Bad.Message, "max_tokens") {
		t.Errorf("bad request: client got %+v, want a 400 BadRequestError about max_tokens", rep.Bad)
	}
	if rep.Unknown.Status != 404 || !rep.Unknown.NotFound || rep.Unknown.Code == nil || *rep.Unknown.Code != "model_not_found" {
		t.Errorf("unknown model: client got %+v, want a 404 NotFoundError model_not_found", rep.Unknown)
	}
	if rep.BadKey.Status != 401 || !rep.BadKey.Auth {
		t.Errorf("wrong key: client got %+v, want a 401 AuthenticationError", rep.BadKey)
	}

	// SIGTERM drains and exits cleanly.
	if err := srv.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// Read the log to its end before Wait: Wait closes the pipe once the process has
	// exited, and a read still pending then loses the log's last lines.
	tail := <-rest
	if err := srv.Wait(); err != nil {
		t.Fatalf("resin serve exited with %v\n%s", err, tail)
	}
	if !strings.Contains(tail, "msg=stopped") {
		t.Fatalf("no clean stop in the server log:\n%s", tail)
	}
	t.Logf("openai client: completion %q, chat %q, %d stream chunks", rep.Completion.Text, rep.Chat.Content, rep.Stream.Chunks)
}
