package serve

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/engine/enginetest"
)

// While the server drains, its listener still accepts: /health answers 503 "draining"
// and new API requests 503 over fresh connections, while the running stream goes on to
// its end. Then Serve returns and the address refuses connections.
func TestDrainKeepsAnsweringHealth(t *testing.T) {
	gate := make(chan struct{})
	var steps atomic.Int64
	h := newHarness(t, harnessOpts{noHTTP: true, runner: enginetest.Config{MaxContext: 8192, OnPlan: func(*engine.BatchPlan) {
		if steps.Add(1) > 5 {
			<-gate // hold the request running until the checks are done
		}
	}}})
	addr, shutdown, served := h.serveListener()
	resp, rd := openStream(t, context.Background(), "http://"+addr, 50)
	defer resp.Body.Close()
	shutdown()
	waitFor(t, "draining to begin", h.srv.Draining)

	hr, err := freshClient().Get("http://" + addr + "/health")
	if err != nil {
		t.Fatalf("/health during drain: %v (the listener closed too early)", err)
	}
	if body := readAll(t, hr); hr.StatusCode != 503 || !strings.Contains(body, `"draining"`) {
		t.Fatalf("/health during drain: %d %s, want 503 draining", hr.StatusCode, body)
	}
	pr, err := freshClient().Post("http://"+addr+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"late"}`))
	if err != nil {
		t.Fatal(err)
	}
	if body := readAll(t, pr); pr.StatusCode != 503 {
		t.Fatalf("request during drain: %d %s, want 503", pr.StatusCode, body)
	}
	close(gate)
	var rest bytes.Buffer
	_, _ = rest.ReadFrom(rd)
	if !strings.Contains(rest.String(), `"finish_reason":"length"`) || !strings.HasSuffix(rest.String(), "data: [DONE]\n\n") {
		t.Fatalf("the running stream did not finish: %q", rest.String())
	}
	if err := <-served; err != nil {
		t.Fatalf("Serve: %v", err)
	}
	if c, err := net.DialTimeout("tcp", addr, 5*time.Second); err == nil {
		c.Close()
		t.Fatal("the listener still accepts after Serve returned")
	}
}

// Streams still running at the drain timeout end with an error event and [DONE]: every
// event is whole JSON, none is cut.
func TestDrainTimeoutEndsStreamsWithErrorEvent(t *testing.T) {
	h := newHarness(t, harnessOpts{noHTTP: true, runner: slowRunner(2 * time.Millisecond), cfg: func(c *Config) { c.DrainTimeout = 100 * time.Millisecond }})
	addr, shutdown, served := h.serveListener()
	var streams []*bufio.Reader
	for range 3 {
		resp, rd := openStream(t, context.Background(), "http://"+addr, 5000)
		defer resp.Body.Close()
		streams = append(streams, rd)
	}
	shutdown()
	if err := <-served; err == nil || !strings.Contains(err.Error(), "drain did not finish") {
		t.Fatalf("Serve returned %v, want a drain timeout", err)
	}
	for i, rd := range streams {
		// The rest of the stream after the event openStream read (from its reader, which
		// may hold more than that event).
		var rest bytes.Buffer
		_, _ = rest.ReadFrom(rd)
		events := sseEvents(t, rest.Bytes())
		if len(events) < 2 || events[len(events)-1] != "[DONE]" {
			t.Fatalf("stream %d did not end with [DONE]: %q", i, events[max(0, len(events)-2):])
		}
		for _, e := range events[:len(events)-1] {
			if !json.Valid([]byte(e)) {
				t.Fatalf("stream %d: event cut mid-JSON: %q", i, e)
			}
		}
		var last errorResp
		if err := json.Unmarshal([]byte(events[len(events)-2]), &last); err != nil || last.Error.Code == nil || *last.Error.Code != "draining" {
			t.Fatalf("stream %d: last event %q, want an error with code draining", i, events[len(events)-2])
		}
		if strings.Contains(last.Error.Message, "engine:") {
			t.Errorf("error event leaks internals: %s", last.Error.Message)
		}
	}
}

// A kept-alive connection opened before the drain is answered too: /health over it gets
// 503 "draining", and the answer closes the connection.
func TestDrainAnswersKeptAliveConnections(t *testing.T) {
	gate := make(chan struct{})
	release := sync.OnceFunc(func() { close(gate) })
	var steps atomic.Int64
	h := newHarness(t, harnessOpts{noHTTP: true, runner: enginetest.Config{MaxContext: 8192, OnPlan: func(*engine.BatchPlan) {
		if steps.Add(1) > 5 {
			<-gate // hold the request running, and the drain in its first stage
		}
	}}})
	t.Cleanup(release)
	addr, shutdown, served := h.serveListener()
	c, rd := keepAlive(t, addr)
	resp, _ := openStream(t, context.Background(), "http://"+addr, 50)
	defer resp.Body.Close()
	shutdown()
	waitFor(t, "draining to begin", h.srv.Draining)

	if _, err := io.WriteString(c, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	hr, err := http.ReadResponse(rd, nil)
	if err != nil {
		t.Fatalf("/health on a kept-alive connection during drain: %v", err)
	}
	if body := readAll(t, hr); hr.StatusCode != 503 || !strings.Contains(body, `"draining"`) || !hr.Close {
		t.Fatalf("/health on a kept-alive connection during drain: %d close=%v %s, want 503 draining closing the connection", hr.StatusCode, hr.Close, body)
	}
	if _, err := rd.ReadByte(); err != io.EOF {
		t.Fatalf("after the draining answer: read %v, want EOF", err)
	}
	release()
	if err := <-served; err != nil {
		t.Fatalf("Serve: %v", err)
	}
}
