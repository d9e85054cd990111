package serve

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/engine"
)

// lockedBuffer is a log sink that handler goroutines and the test share.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// smallSendBuffers shrinks the send buffer of each connection it accepts.
type smallSendBuffers struct{ net.Listener }

func (l smallSendBuffers) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		if err := tc.SetWriteBuffer(4096); err != nil {
			c.Close()
			return nil, err
		}
	}
	return c, err
}

// A client that sends a streaming request and then stops reading, its connection left
// open, fills the socket buffers until the server's write blocks. The write must give up
// after WriteStallTimeout, and the engine must abort the request as it does when a
// client disconnects: pages freed, no goroutine left behind.
func TestStalledClientAbortsRequest(t *testing.T) {
	before := runtime.NumGoroutine()
	var logs lockedBuffer
	h := newHarness(t, harnessOpts{runner: slowRunner(time.Millisecond), noHTTP: true, cfg: func(c *Config) {
		c.WriteStallTimeout = 100 * time.Millisecond
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	}})
	// Small socket buffers on both sides make the server's writes block after a few
	// chunks; left to autotuning, loopback buffers grow to megabytes.
	h.ts = httptest.NewUnstartedServer(h.srv.Handler())
	h.ts.Listener = smallSendBuffers{h.ts.Listener}
	h.ts.Start()
	conn, err := net.Dial("tcp", h.ts.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.(*net.TCPConn).SetReadBuffer(1024); err != nil {
		t.Fatal(err)
	}
	// 7000 tokens at 1 ms a step or more outlast the fill and the stall by far; logprobs
	// make each chunk large.
	const maxTokens = 7000
	body, _ := json.Marshal(map[string]any{"prompt": "long story", "max_tokens": maxTokens, "stream": true,
		"ignore_eos": true, "logprobs": 5})
	req := fmt.Sprintf("POST /v1/completions HTTP/1.1\r\nHost: resin\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	if _, err := io.WriteString(conn, req); err != nil {
		t.Fatal(err)
	}
	// The client now never reads, but keeps the connection open.
	waitFor(t, "the request to start", func() bool { return h.eng.Counters().GenerationTokens > 0 })
	waitFor(t, "the request to leave the engine", func() bool { s := h.eng.Stats(); return s.Running+s.Waiting == 0 })
	c := h.eng.Counters()
	if c.Finished[engine.FinishAbort] != 1 {
		t.Fatalf("the request ended with finishes %v, not an abort: the stalled write did not stop it", c.Finished)
	}
	if c.GenerationTokens >= maxTokens {
		t.Fatalf("%d tokens generated for a client that stopped reading", c.GenerationTokens)
	}
	// The server has closed its side: reading what it had buffered ends in EOF (or a
	// reset), not in our read deadline.
	if err := conn.SetReadDeadline(time.Now().Add(20 * time.Second)); err != nil {
		t.Fatal(err)
	}
	_, err = io.Copy(io.Discard, conn)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatal("the server kept the stalled connection open")
	}
	conn.Close()

	h.ts.Close()
	if !strings.Contains(logs.String(), "client stopped reading") {
		t.Errorf("the stall was not logged; log:\n%s", logs.String())
	}
	h.stopAndCheck("the stall")
	h.ts = nil
	h.eng.Close()
	waitFor(t, "goroutines to return to the baseline", func() bool { return runtime.NumGoroutine() <= before+1 })
}

// The stall timeout bounds each write, not the response: a stream whose generation
// lasts longer than the timeout completes while the client reads it, and the next
// request on the same kept-alive connection, sent after the last write's deadline has
// passed, is served too, even when net/http must first write 100 Continue for it.
func TestStallTimeoutIsPerWrite(t *testing.T) {
	const stall = 50 * time.Millisecond
	h := newHarness(t, harnessOpts{runner: slowRunner(time.Millisecond), cfg: func(c *Config) { c.WriteStallTimeout = stall }})
	client := &http.Client{Transport: &http.Transport{ExpectContinueTimeout: 10 * time.Second}}
	defer client.CloseIdleConnections()
	// 200 steps of at least 1 ms each: the stream lasts at least 4 times the timeout.
	const n = 200
	body, _ := json.Marshal(map[string]any{"prompt": "long story", "max_tokens": n, "stream": true, "ignore_eos": true})
	resp, err := client.Post(h.ts.URL+"/v1/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	events := sseEvents(t, []byte(readAll(t, resp)))
	if len(events) < 2 || events[len(events)-1] != "[DONE]" || !strings.Contains(events[len(events)-2], `"finish_reason":"length"`) {
		t.Fatalf("stream did not finish with length and [DONE]: last events %q", events[max(0, len(events)-2):])
	}
	time.Sleep(3 * stall) // let the last write's deadline pass on the idle connection
	req, _ := http.NewRequest(http.MethodPost, h.ts.URL+"/v1/completions", bytes.NewReader([]byte(`{"prompt":"hi","max_tokens":3}`)))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Expect", "100-continue")
	reused := false
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
		GotConn: func(info httptrace.GotConnInfo) { reused = info.Reused },
	}))
	resp, err = client.Do(req)
	if err != nil {
		t.Fatalf("second request on the kept-alive connection: %v", err)
	}
	if out := readAll(t, resp); resp.StatusCode != 200 {
		t.Fatalf("second request: status %d: %s", resp.StatusCode, out)
	}
	if !reused {
		t.Fatal("the second request did not reuse the connection, so it tested nothing")
	}
}
