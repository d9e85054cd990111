package serve

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/resin-llm/resin/core/engine"
)

// serveReal runs h's server through Serve on a real listener (the http.Server settings
// and the connection cap apply there, not behind httptest) and returns its address. The
// server shuts down when the test ends.
func serveReal(t *testing.T, h *harness) string {
	t.Helper()
	addr, shutdown, served := h.serveListener()
	t.Cleanup(func() { shutdown(); <-served })
	return addr
}

// dialRaw opens a connection for hand-written HTTP, with a generous deadline so that a
// regression fails the test instead of hanging it.
func dialRaw(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	t.Cleanup(func() { c.Close() })
	return c
}

// freshClient shares no connections with other tests.
func freshClient() *http.Client { return &http.Client{Transport: &http.Transport{}} }

func completionHead(contentLength int, extra string) string {
	return fmt.Sprintf("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n", contentLength, extra)
}

// A client trickling its body is cut off by the read timeout with 408, and the server
// keeps serving others.
func TestSlowBodyIsCutByReadTimeout(t *testing.T) {
	h := newHarness(t, harnessOpts{noHTTP: true, cfg: func(c *Config) { c.ReadTimeout = 300 * time.Millisecond }})
	addr := serveReal(t, h)
	c := dialRaw(t, addr)
	const declared = 10000
	if _, err := io.WriteString(c, completionHead(declared, "")+`{"prompt":"`); err != nil {
		t.Fatal(err)
	}
	var sent atomic.Int64
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			if _, err := c.Write([]byte("a")); err != nil {
				return
			}
			sent.Add(1)
		}
	}()
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer to a slow body: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusRequestTimeout || !strings.Contains(string(body), "request_timeout") {
		t.Fatalf("slow body: status %d %s, want 408 request_timeout", resp.StatusCode, body)
	}
	if n := sent.Load(); n >= declared {
		t.Fatalf("the whole body (%d bytes) was sent before the answer", n)
	}
	resp, err = freshClient().Post("http://"+addr+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"hi","max_tokens":2}`))
	if err != nil {
		t.Fatal(err)
	}
	if out := readAll(t, resp); resp.StatusCode != 200 {
		t.Fatalf("normal request after the slow one: %d %s", resp.StatusCode, out)
	}
}

// A kept-alive connection that sends nothing more is closed by the idle timeout.
func TestIdleConnectionIsClosed(t *testing.T) {
	h := newHarness(t, harnessOpts{noHTTP: true, cfg: func(c *Config) { c.IdleTimeout = 200 * time.Millisecond }})
	c := dialRaw(t, serveReal(t, h))
	if _, err := io.WriteString(c, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	rd := bufio.NewReader(c)
	resp, err := http.ReadResponse(rd, nil)
	if err != nil {
		t.Fatal(err)
	}
	if readAll(t, resp); resp.StatusCode != 200 || resp.Close {
		t.Fatalf("first request: status %d, close %v; want 200 on a kept-alive connection", resp.StatusCode, resp.Close)
	}
	if _, err := rd.ReadByte(); err != io.EOF {
		t.Fatalf("idle connection: read %v, want EOF (closed by the server)", err)
	}
}

// blockingBody hands out a first piece of a body, then blocks until released, counting
// the bytes it gave.
type blockingBody struct {
	first   []byte
	release chan struct{}
	n       atomic.Int64
}

func (b *blockingBody) Read(p []byte) (int, error) {
	if len(b.first) > 0 {
		n := copy(p, b.first)
		b.first = b.first[n:]
		b.n.Add(int64(n))
		return n, nil
	}
	<-b.release
	return 0, io.ErrUnexpectedEOF
}

// Without the key, a request is refused with 401 before its body is read: a client that
// sends part of a body and then stalls gets its answer at once.
func TestAuthBeforeBody(t *testing.T) {
	h := newHarness(t, harnessOpts{noHTTP: true, cfg: func(c *Config) { c.APIKey = "sekret" }})
	addr := serveReal(t, h)

	// A declared body of which only a few bytes ever come: before, net/http waited for
	// the rest (to keep the connection alive) before sending the 401.
	for _, declared := range []int{100, 100 << 20} {
		c := dialRaw(t, addr)
		if _, err := io.WriteString(c, completionHead(declared, "")+`{"prompt"`); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("Content-Length %d: no answer while the body is unsent: %v", declared, err)
		}
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 401 || !strings.Contains(string(body), "invalid_api_key") {
			t.Fatalf("Content-Length %d: status %d %s, want 401", declared, resp.StatusCode, body)
		}
		if got := resp.Header.Get("WWW-Authenticate"); !strings.HasPrefix(got, "Bearer") {
			t.Errorf("401 WWW-Authenticate %q, want Bearer", got)
		}
		if !resp.Close {
			t.Errorf("401 to a request with an unread body keeps the connection open")
		}
	}

	// A chunked body from a reader that stalls after 16 bytes: the answer comes while
	// the reader is blocked, having given only those.
	body := &blockingBody{first: []byte(`{"prompt":"aaaaa`), release: make(chan struct{})}
	defer close(body.release)
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/completions", body)
	req.Header.Set("Content-Type", "application/json")
	resp, err := freshClient().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Fatalf("chunked unauthenticated body: status %d, want 401", resp.StatusCode)
	}
	if n := body.n.Load(); n > 16 {
		t.Fatalf("the client's body reader gave %d bytes, want at most the 16 it had before stalling", n)
	}
}

// A declared body over the cap is refused with 413 before it is read.
func TestOversizeBodyRefusedUnread(t *testing.T) {
	h := newHarness(t, harnessOpts{noHTTP: true, cfg: func(c *Config) { c.MaxBodyBytes = 1 << 20 }})
	c := dialRaw(t, serveReal(t, h))
	if _, err := io.WriteString(c, completionHead(64<<20, "")+`{"prompt":"`); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 413 || !strings.Contains(string(body), "request_too_large") {
		t.Fatalf("status %d %s, want 413 request_too_large", resp.StatusCode, body)
	}
}

// Only JSON bodies are served: a text/plain or untyped POST (which a web page may send
// cross-origin without asking) gets 415; a JSON value that is not an object gets a 400
// naming what was expected, in JSON's terms.
func TestContentTypeAndBodyShape(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	for _, c := range []struct {
		ct   string
		want int
	}{
		{"text/plain", 415},
		{"", 415},
		{"application/x-www-form-urlencoded", 415},
		{"application/json; charset=utf-8", 200},
		{"application/vnd.api+json", 200},
	} {
		req, _ := http.NewRequest(http.MethodPost, h.ts.URL+"/v1/completions", strings.NewReader(`{"prompt":"hi","max_tokens":1}`))
		if c.ct != "" {
			req.Header.Set("Content-Type", c.ct)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body := readAll(t, resp)
		if resp.StatusCode != c.want {
			t.Errorf("Content-Type %q: status %d %s, want %d", c.ct, resp.StatusCode, body, c.want)
		}
		if c.want == 415 && !strings.Contains(body, "application/json") {
			t.Errorf("415 does not say what to send: %s", body)
		}
	}
	// A compressed body is refused naming its encoding, not read as broken JSON.
	for _, ce := range []string{"gzip", "br"} {
		req, _ := http.NewRequest(http.MethodPost, h.ts.URL+"/v1/completions", strings.NewReader("\x1f\x8b\x08\x00"))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Content-Encoding", ce)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if body := readAll(t, resp); resp.StatusCode != 415 || !strings.Contains(body, "Content-Encoding") || !strings.Contains(body, ce) {
			t.Errorf("Content-Encoding %s: status %d %s, want 415 naming it", ce, resp.StatusCode, body)
		}
	}
	for body, want := range map[string]string{
		`[{"prompt":"x"}]`:                   "must be a JSON object; got an array",
		`"x"`:                                "must be a JSON object; got a string",
		`42`:                                 "must be a JSON object; got a number",
		`{"prompt":"x","max_tokens":"many"}`: "expected an integer, got a string",
		`{"prompt":"x","temperature":[1]}`:   "expected a number, got an array",
		`{"prompt":"x","stream":1}`:          "expected a boolean, got a number",
	} {
		code, raw := h.post("/v1/completions", []byte(body))
		var e errorResp
		_ = json.Unmarshal(raw, &e)
		if code != 400 || !strings.Contains(e.Error.Message, want) {
			t.Errorf("%s: status %d %s, want 400 saying %q", body, code, raw, want)
		}
		for _, goName := range []string{"serve.", "int", "float64", "struct"} {
			if strings.Contains(e.Error.Message, goName) && !strings.Contains(e.Error.Message, "integer") {
				t.Errorf("%s: message names a Go type: %s", body, e.Error.Message)
			}
		}
	}
}

// A tokenizing budget in use makes a request wait its turn: 429 with Retry-After.
func TestTokenizeBudgetIs429(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	b := h.srv.prompts.budget
	if err := b.acquire(b.size); err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodPost, h.ts.URL+"/v1/completions", strings.NewReader(`{"prompt":"hi","max_tokens":1}`))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body := readAll(t, resp)
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") == "" || !strings.Contains(body, "tokenizer_busy") {
		t.Fatalf("status %d Retry-After %q %s, want 429 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	b.release(b.size)
	h.postJSON("/v1/completions", map[string]any{"prompt": "hi", "max_tokens": 1}, 200, nil)
	if n := b.inUse(); n != 0 {
		t.Fatalf("%d bytes still counted as being tokenized", n)
	}
}

// The queue-full 429 says when to retry.
func TestQueueFullRetryAfter(t *testing.T) {
	h := newHarness(t, harnessOpts{noRun: true, eng: engineQueue(1)})
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(context.Background())
	wg.Add(1)
	go func() {
		defer wg.Done()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, h.ts.URL+"/v1/completions", strings.NewReader(`{"prompt":"first","max_tokens":2}`))
		req.Header.Set("Content-Type", "application/json")
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	defer func() { cancel(); wg.Wait() }()
	waitFor(t, "the first request to queue", func() bool { return h.eng.Stats().Waiting == 1 })
	req, _ := http.NewRequest(http.MethodPost, h.ts.URL+"/v1/completions", strings.NewReader(`{"prompt":"second","max_tokens":2}`))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body := readAll(t, resp)
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("status %d Retry-After %q %s, want 429 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
}

func engineQueue(n int) engine.Config { return engine.Config{MaxQueue: n} }

// The read timeout bounds reading the request, not the response: a stream goes on past
// it, and so does the connection's count in /metrics.
func TestStreamOutlastsReadTimeout(t *testing.T) {
	h := newHarness(t, harnessOpts{noHTTP: true, runner: slowRunner(5 * time.Millisecond), cfg: func(c *Config) { c.ReadTimeout = 100 * time.Millisecond }})
	addr := serveReal(t, h)
	// 60 steps of 5 ms each: the stream lasts three times the read timeout.
	resp, rd := openStream(t, context.Background(), "http://"+addr, 60)
	defer resp.Body.Close()
	m, err := freshClient().Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	if body := readAll(t, m); !strings.Contains(body, `resin_http_connections_open{model_name="tiny-test"} 2`) {
		t.Errorf("metrics do not count the stream's and the scrape's connections:\n%s", grepLines(body, "connections_open"))
	}
	rest, _ := io.ReadAll(rd)
	if !strings.Contains(string(rest), `"finish_reason":"length"`) {
		t.Fatalf("the stream did not finish: %q", rest)
	}
}

// A client still sending its body when the read timeout cuts it off (one that writes
// the whole body before reading, as most do) can finish writing and then read its 408:
// the connection is not reset under it.
func TestSlowBodyGets408NotReset(t *testing.T) {
	h := newHarness(t, harnessOpts{noHTTP: true, cfg: func(c *Config) { c.ReadTimeout = 200 * time.Millisecond }})
	addr := serveReal(t, h)
	c := dialRaw(t, addr)
	const declared, piece = 8192, 256
	if _, err := io.WriteString(c, completionHead(declared, "")+`{"prompt":"`); err != nil {
		t.Fatal(err)
	}
	timedOut := h.srv.metrics.requests.WithLabelValues("/v1/completions", "408")
	waitFor(t, "the read timeout to answer 408", func() bool { return counterValue(timedOut) == 1 })
	rest := strings.Repeat("a", piece)
	for sent := len(`{"prompt":"`); sent+piece <= declared; sent += piece {
		if _, err := io.WriteString(c, rest); err != nil {
			t.Fatalf("writing the rest of the body after the 408 (%d of %d bytes sent): %v", sent, declared, err)
		}
		time.Sleep(2 * time.Millisecond) // let a reset, if any, arrive before the next write
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer after sending the body: %v", err)
	}
	if body := readAll(t, resp); resp.StatusCode != http.StatusRequestTimeout || !strings.Contains(body, "request_timeout") || !resp.Close {
		t.Fatalf("slow body: %d close=%v %s, want 408 request_timeout closing the connection", resp.StatusCode, resp.Close, body)
	}
}

// counterValue reads a counter's value.
func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return -1
	}
	return m.GetCounter().GetValue()
}

// A body refused before it is read (here 413 for its declared size) is answered, and a
// client that goes on writing it before reading gets the answer, not a reset.
func TestRefusedBodyAnsweredNotReset(t *testing.T) {
	h := newHarness(t, harnessOpts{noHTTP: true, cfg: func(c *Config) { c.MaxBodyBytes = 1024 }})
	c := dialRaw(t, serveReal(t, h))
	const declared, piece = 16384, 256
	if _, err := io.WriteString(c, completionHead(declared, "")); err != nil {
		t.Fatal(err)
	}
	refused := h.srv.metrics.requests.WithLabelValues("/v1/completions", "413")
	waitFor(t, "the 413", func() bool { return counterValue(refused) == 1 })
	for sent := 0; sent < declared; sent += piece {
		if _, err := io.WriteString(c, strings.Repeat("a", piece)); err != nil {
			t.Fatalf("writing the body after the 413 (%d of %d bytes sent): %v", sent, declared, err)
		}
		time.Sleep(time.Millisecond)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer after sending the body: %v", err)
	}
	if body := readAll(t, resp); resp.StatusCode != http.StatusRequestEntityTooLarge || !resp.Close {
		t.Fatalf("oversize body: %d close=%v %s, want 413 closing the connection", resp.StatusCode, resp.Close, body)
	}
}

// TestStopTokenIDsCapped: stop_token_ids beyond maxStopTokenIDs get 400 naming the field,
// on both endpoints; as many as the cap are served. Before, any number the body could hold
// was taken (a million ids made every step's plan megabytes).
func TestStopTokenIDsCapped(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	ids := func(n int) []int32 {
		out := make([]int32, n)
		for i := range out {
			out[i] = int32(i % 200)
		}
		return out
	}
	for _, tc := range []struct {
		path string
		body map[string]any
	}{
		{"/v1/completions", map[string]any{"prompt": "hello", "max_tokens": 2}},
		{"/v1/chat/completions", map[string]any{"messages": []any{map[string]any{"role": "user", "content": "hi"}}, "max_tokens": 2}},
	} {
		tc.body["stop_token_ids"] = ids(maxStopTokenIDs + 1)
		code, raw := h.post(tc.path, tc.body)
		var e errorResp
		if code != 400 || json.Unmarshal(raw, &e) != nil || e.Error.Param == nil || *e.Error.Param != "stop_token_ids" {
			t.Fatalf("%s with %d stop_token_ids: %d %s, want 400 naming stop_token_ids", tc.path, maxStopTokenIDs+1, code, raw)
		}
		tc.body["stop_token_ids"] = ids(maxStopTokenIDs)
		if code, raw := h.post(tc.path, tc.body); code != 200 {
			t.Fatalf("%s with %d stop_token_ids: %d %s", tc.path, maxStopTokenIDs, code, raw)
		}
	}
}
