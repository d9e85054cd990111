package serve

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/engine/enginetest"
	"github.com/resin-llm/resin/core/tokenizer/tiny"
)

// slowRunner makes every engine step take a little while, so that requests are still
// running when the test acts on them.
func slowRunner(d time.Duration) enginetest.Config {
	return enginetest.Config{MaxContext: 8192, OnPlan: func(*engine.BatchPlan) { time.Sleep(d) }}
}

// openStream starts a streaming completion and returns the response once the first
// content chunk has arrived.
func openStream(t *testing.T, ctx context.Context, url string, maxTokens int) (*http.Response, *bufio.Reader) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"prompt": "long story", "max_tokens": maxTokens, "stream": true, "ignore_eos": true})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	rd := bufio.NewReader(resp.Body)
	for {
		line, err := rd.ReadString('\n')
		if err != nil {
			t.Fatalf("stream ended early: %v", err)
		}
		if strings.HasPrefix(line, "data: {") {
			return resp, rd
		}
	}
}

func TestClientDisconnectAbortsRequest(t *testing.T) {
	before := runtime.NumGoroutine()
	h := newHarness(t, harnessOpts{runner: slowRunner(time.Millisecond)})
	for _, stream := range []bool{true, false} {
		ctx, cancel := context.WithCancel(context.Background())
		if stream {
			resp, _ := openStream(t, ctx, h.ts.URL, 5000)
			cancel()
			resp.Body.Close()
		} else {
			body, _ := json.Marshal(map[string]any{"prompt": "long", "max_tokens": 5000, "ignore_eos": true})
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, h.ts.URL+"/v1/completions", bytes.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			errc := make(chan error, 1)
			go func() {
				resp, err := http.DefaultClient.Do(req)
				if err == nil {
					resp.Body.Close()
				}
				errc <- err
			}()
			waitFor(t, "the request to run", func() bool { return h.eng.Stats().Running == 1 })
			cancel()
			if err := <-errc; !errors.Is(err, context.Canceled) {
				t.Fatalf("client error %v", err)
			}
		}
		waitFor(t, "the engine to drop the request", func() bool { s := h.eng.Stats(); return s.Running+s.Waiting == 0 })
	}
	_, fed := h.runner.Steps()
	if fed > 4000 {
		t.Fatalf("the runner was fed %d tokens: the requests ran on after the clients left", fed)
	}
	h.ts.Close()
	h.stopAndCheck("the aborts")
	h.ts = nil
	h.eng.Close()
	http.DefaultClient.CloseIdleConnections()
	waitFor(t, "goroutines to return to the baseline", func() bool { return runtime.NumGoroutine() <= before+1 })
}

func TestGracefulShutdownDrains(t *testing.T) {
	h := newHarness(t, harnessOpts{runner: slowRunner(500 * time.Microsecond), noHTTP: true})
	addr, shutdown, served := h.serveListener()
	url := "http://" + addr

	resp, rd := openStream(t, context.Background(), url, 300)
	defer resp.Body.Close()
	shutdown()
	waitFor(t, "draining to begin", h.srv.Draining)

	// New requests are refused with 503 while the running one goes on.
	rec := httptest.NewRecorder()
	late := httptest.NewRequest(http.MethodPost, "/v1/completions", strings.NewReader(`{"prompt":"late"}`))
	late.Header.Set("Content-Type", "application/json")
	h.srv.Handler().ServeHTTP(rec, late)
	if rec.Code != http.StatusServiceUnavailable {
		t.Fatalf("request during drain: %d %s", rec.Code, rec.Body)
	}
	rec = httptest.NewRecorder()
	h.srv.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/health", nil))
	if rec.Code != http.StatusServiceUnavailable {
		t.Fatalf("health during drain: %d", rec.Code)
	}

	// The running request completes in full.
	finish := ""
	for {
		line, err := rd.ReadString('\n')
		if err != nil {
			break
		}
		if i := strings.Index(line, `"finish_reason":"`); i >= 0 {
			finish = line[i+17 : i+17+strings.IndexByte(line[i+17:], '"')]
		}
	}
	if finish != "length" {
		t.Fatalf("in-flight request ended with finish %q, want length", finish)
	}
	if err := <-served; err != nil {
		t.Fatalf("Serve: %v", err)
	}
}

func TestDrainTimeoutAborts(t *testing.T) {
	h := newHarness(t, harnessOpts{runner: slowRunner(2 * time.Millisecond), noHTTP: true, cfg: func(c *Config) { c.DrainTimeout = 50 * time.Millisecond }})
	addr, shutdown, served := h.serveListener()
	resp, rd := openStream(t, context.Background(), "http://"+addr, 5000)
	defer resp.Body.Close()
	shutdown()
	if err := <-served; err == nil || !strings.Contains(err.Error(), "drain did not finish") {
		t.Fatalf("Serve returned %v, want a drain timeout", err)
	}
	var rest bytes.Buffer
	_, _ = rest.ReadFrom(rd)
	if strings.Contains(rest.String(), `"finish_reason":"length"`) {
		t.Fatal("the request completed although the drain timed out")
	}
	if s := h.eng.Stats(); s.Running+s.Waiting != 0 {
		t.Fatalf("engine still holds %+v", s)
	}
}

func TestQueueFullIs429(t *testing.T) {
	h := newHarness(t, harnessOpts{noRun: true, eng: engine.Config{MaxQueue: 1}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		body := strings.NewReader(`{"prompt":"first","max_tokens":2}`)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, h.ts.URL+"/v1/completions", body)
		req.Header.Set("Content-Type", "application/json")
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	waitFor(t, "the first request to queue", func() bool { return h.eng.Stats().Waiting == 1 })
	code, raw := h.post("/v1/completions", map[string]any{"prompt": "second", "max_tokens": 2})
	var e errorResp
	_ = json.Unmarshal(raw, &e)
	if code != http.StatusTooManyRequests || e.Error.Code == nil || *e.Error.Code != "queue_full" {
		t.Fatalf("status %d %s, want 429 queue_full", code, raw)
	}
	cancel()
	wg.Wait()
	waitFor(t, "the queued request to be aborted", func() bool { return h.eng.Stats().Waiting == 0 })
}

func TestBodyLimit(t *testing.T) {
	h := newHarness(t, harnessOpts{cfg: func(c *Config) { c.MaxBodyBytes = 1024 }})
	big := map[string]any{"prompt": strings.Repeat("x", 2000), "max_tokens": 1}
	code, raw := h.post("/v1/completions", big)
	if code != http.StatusRequestEntityTooLarge || !strings.Contains(string(raw), "request_too_large") {
		t.Fatalf("status %d %s, want 413", code, raw)
	}
	// Without a Content-Length (chunked), the limit still holds while reading.
	pr, pw := ioPipe()
	go func() {
		_, _ = pw.Write([]byte(`{"prompt":"` + strings.Repeat("y", 4000) + `"}`))
		pw.Close()
	}()
	req, _ := http.NewRequest(http.MethodPost, h.ts.URL+"/v1/completions", pr)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("chunked body: status %d, want 413", resp.StatusCode)
	}
	h.postJSON("/v1/completions", map[string]any{"prompt": "small", "max_tokens": 1}, 200, nil)
}

func TestAPIKey(t *testing.T) {
	h := newHarness(t, harnessOpts{cfg: func(c *Config) { c.APIKey = "sekret" }})
	body := map[string]any{"prompt": "k", "max_tokens": 1}
	for _, c := range []struct {
		header []string
		want   int
	}{
		{nil, 401},
		{[]string{"Authorization", "Bearer wrong"}, 401},
		{[]string{"Authorization", "Basic c2VrcmV0"}, 401},
		{[]string{"Authorization", "Bearer sekret"}, 200},
	} {
		code, raw := h.post("/v1/completions", body, c.header...)
		if code != c.want {
			t.Errorf("header %v: status %d, want %d: %s", c.header, code, c.want, raw)
		}
		if code == 401 && !strings.Contains(string(raw), "invalid_api_key") {
			t.Errorf("401 body %s", raw)
		}
	}
	resp, err := http.Get(h.ts.URL + "/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("/health needs no key: %d", resp.StatusCode)
	}
}

func TestRunnerFailureIsReported(t *testing.T) {
	failFrom := func(n uint64) enginetest.Config {
		return enginetest.Config{Fail: func(step uint64) bool { return step >= n }}
	}
	h := newHarness(t, harnessOpts{runner: failFrom(1)})
	code, raw := h.post("/v1/completions", map[string]any{"prompt": "boom", "max_tokens": 10, "ignore_eos": true})
	var e errorResp
	if err := json.Unmarshal(raw, &e); err != nil || code != http.StatusInternalServerError || e.Error.Type != "server_error" {
		t.Fatalf("status %d %s, want a 500 server_error", code, raw)
	}

	// A failure after tokens were streamed arrives as an error event, then [DONE]. The
	// failing step waits until the client has seen its first chunk.
	gate := make(chan struct{})
	h = newHarness(t, harnessOpts{runner: enginetest.Config{Fail: func(step uint64) bool {
		if step < 4 {
			return false
		}
		<-gate
		return true
	}}})
	body, _ := json.Marshal(map[string]any{"messages": []any{map[string]any{"role": "user", "content": "boom"}}, "max_tokens": 10, "stream": true, "ignore_eos": true})
	resp, err := http.Post(h.ts.URL+"/v1/chat/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("streaming status %d", resp.StatusCode)
	}
	rd := bufio.NewReader(resp.Body)
	if _, err := rd.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	close(gate)
	var rest bytes.Buffer
	_, _ = rest.ReadFrom(rd)
	events := sseEvents(t, rest.Bytes())
	if len(events) < 2 || events[len(events)-1] != "[DONE]" || !strings.Contains(events[len(events)-2], `"server_error"`) {
		t.Fatalf("stream did not end with an error event and [DONE]: %q", events)
	}
	if s := h.eng.Stats(); s.Running+s.Waiting != 0 {
		t.Fatalf("failed requests still in the engine: %+v", s)
	}
}

// A tokenizer larger than the model's vocabulary is refused saying what to do (give the
// model's own tokenizer, --tokenizer), not only the two sizes: resin serve of random
// weights with a vocabulary under the built-in tokenizer's 1025 failed naming neither.
func TestNewRefusesForeignTokenizer(t *testing.T) {
	tok, _, err := tiny.Load()
	if err != nil {
		t.Fatal(err)
	}
	runner, err := enginetest.New(enginetest.Config{VocabSize: 512, MaxContext: 64})
	if err != nil {
		t.Fatal(err)
	}
	eng, err := engine.New(runner, engine.Config{Pool: runner.Pool()})
	if err != nil {
		t.Fatal(err)
	}
	_, err = New(Config{Engine: eng, Tokenizer: tok, Model: "m"})
	if err == nil || !strings.Contains(err.Error(), "512") || !strings.Contains(err.Error(), "--tokenizer") {
		t.Fatalf("New with a 1025-token tokenizer over 512 logits: %v", err)
	}
}
