package serve

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/engine/enginetest"
	"github.com/resin-llm/resin/core/tokenizer"
	"github.com/resin-llm/resin/core/tokenizer/tiny"
)

// harness is a Server over a real engine, the engine's deterministic test runner and the
// tiny tokenizer, behind an httptest server.
type harness struct {
	t      *testing.T
	srv    *Server
	ts     *httptest.Server
	eng    *engine.Engine
	runner *enginetest.Runner
	tok    *tokenizer.Tokenizer
	eos    int32
	stop   context.CancelFunc
	done   chan error
}

type harnessOpts struct {
	cfg    func(*Config)
	eng    engine.Config
	runner enginetest.Config
	// wrap, when set, is the runner the engine drives, built around the test runner.
	wrap   func(r *enginetest.Runner, tok *tokenizer.Tokenizer, eos int32) engine.Runner
	noRun  bool // do not start the engine loop
	noHTTP bool // do not start the httptest server
}

func newHarness(t *testing.T, o harnessOpts) *harness {
	t.Helper()
	tok, chat, err := tiny.Load()
	if err != nil {
		t.Fatal(err)
	}
	eos := tiny.EOS(tok)
	rc := o.runner
	rc.VocabSize = tok.VocabSize()
	rc.EOS = []int32{eos}
	if rc.MaxContext == 0 {
		rc.MaxContext = 2048
	}
	runner, err := enginetest.New(rc)
	if err != nil {
		t.Fatal(err)
	}
	ec := o.eng
	ec.Pool = runner.Pool()
	var driven engine.Runner = runner
	if o.wrap != nil {
		driven = o.wrap(runner, tok, eos)
	}
	eng, err := engine.New(driven, ec)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Engine: eng, Tokenizer: tok, ChatTemplate: chat, Model: "tiny-test",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if o.cfg != nil {
		o.cfg(&cfg)
	}
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, srv: srv, eng: eng, runner: runner, tok: tok, eos: eos, done: make(chan error, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	h.stop = cancel
	if !o.noRun {
		go func() { h.done <- eng.Run(ctx) }()
	} else {
		h.done <- nil
	}
	if !o.noHTTP {
		h.ts = httptest.NewServer(srv.Handler())
	}
	t.Cleanup(h.close)
	return h
}

// serveListener runs h's server through Serve on a fresh local listener. It returns the
// listener's address, the cancel that starts the shutdown and the channel that receives
// Serve's result.
func (h *harness) serveListener() (addr string, shutdown context.CancelFunc, served <-chan error) {
	h.t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		h.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.srv.Serve(ctx, ln) }()
	return ln.Addr().String(), cancel, done
}

// stopEngine ends the engine loop and waits for it.
func (h *harness) stopEngine() {
	h.stop()
	<-h.done
	h.done <- nil
}

// stopAndCheck stops the engine loop and checks that what happened (named by after) left
// no sequence open in the pool, the pool consistent and the runner without error.
func (h *harness) stopAndCheck(after string) {
	h.t.Helper()
	h.stopEngine()
	if st := h.eng.Pool().Stats(); st.Sequences != 0 {
		h.t.Fatalf("%d sequences still open in the pool after %s", st.Sequences, after)
	}
	if err := h.eng.Pool().Check(); err != nil {
		h.t.Fatalf("pool invariants: %v", err)
	}
	if err := h.runner.Err(); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) close() {
	if h.ts != nil {
		h.ts.Close()
	}
	h.eng.Close()
	h.stop()
	<-h.done
}

// post sends body as JSON and returns the status and the raw response.
func (h *harness) post(path string, body any, header ...string) (int, []byte) {
	h.t.Helper()
	raw, ok := body.([]byte)
	if !ok {
		var err error
		if raw, err = json.Marshal(body); err != nil {
			h.t.Fatal(err)
		}
	}
	req, err := http.NewRequest(http.MethodPost, h.ts.URL+path, bytes.NewReader(raw))
	if err != nil {
		h.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		h.t.Fatal(err)
	}
	return resp.StatusCode, out
}

// postJSON posts and decodes the JSON answer into v, failing unless the status is want.
func (h *harness) postJSON(path string, body any, want int, v any) {
	h.t.Helper()
	code, raw := h.post(path, body)
	if code != want {
		h.t.Fatalf("POST %s: status %d, want %d: %s", path, code, want, raw)
	}
	if v != nil {
		if err := json.Unmarshal(raw, v); err != nil {
			h.t.Fatalf("POST %s: %v in %s", path, err, raw)
		}
	}
}

// sseEvents splits an SSE body into its data payloads.
func sseEvents(t *testing.T, body []byte) []string {
	t.Helper()
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("SSE line without data: %q", line)
		}
		out = append(out, data)
	}
	return out
}

// reference is what the test runner generates greedily for prompt: the tokens (ending at
// EOS or after n) and their text as the server should show it.
func (h *harness) reference(prompt []int32, n int) ([]int32, string) {
	toks := enginetest.Reference(h.tok.VocabSize(), prompt, n, engine.SamplingRow{Logprobs: -1}, h.eos)
	shown := toks
	if len(shown) > 0 && shown[len(shown)-1] == h.eos {
		shown = shown[:len(shown)-1]
	}
	return toks, h.tok.Decode(shown, true)
}

type errorResp struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}

// waitFor polls cond until it holds or a generous deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
