package serve

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/engine/enginetest"
)

// keepAlive opens a connection, sends one GET /health on it and leaves it idle, kept
// alive, after reading the answer. It returns the connection's reader.
func keepAlive(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c := dialRaw(t, addr)
	if _, err := io.WriteString(c, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	rd := bufio.NewReader(c)
	resp, err := http.ReadResponse(rd, nil)
	if err != nil {
		t.Fatal(err)
	}
	if readAll(t, resp); resp.StatusCode != 200 || resp.Close {
		t.Fatalf("kept-alive /health: status %d, close %v", resp.StatusCode, resp.Close)
	}
	return c, rd
}

// timedClient fails a request that gets no answer (a regression) instead of hanging
// the test.
func timedClient() *http.Client {
	return &http.Client{Transport: &http.Transport{}, Timeout: 20 * time.Second}
}

// At the connection cap, with every connection idle between requests, a new client (a
// health probe, a metrics scrape) is served: the connection idle longest is closed to
// make room, the others stay open.
func TestConnectionCapClosesIdleLongest(t *testing.T) {
	const capN = 4
	h := newHarness(t, harnessOpts{noHTTP: true, cfg: func(c *Config) { c.MaxConnections = capN }})
	addr := serveReal(t, h)
	waitFor(t, "Serve to start", func() bool { return h.srv.conns.Load() != nil })
	cc := h.srv.conns.Load()
	var readers []*bufio.Reader
	for range capN {
		_, rd := keepAlive(t, addr)
		readers = append(readers, rd)
	}
	waitFor(t, "every connection to be idle", func() bool { return cc.Idle() == capN })

	for _, path := range []string{"/health", "/metrics"} {
		resp, err := timedClient().Get("http://" + addr + path)
		if err != nil {
			t.Fatalf("%s at the cap with idle connections: %v", path, err)
		}
		if body := readAll(t, resp); resp.StatusCode != 200 {
			t.Fatalf("%s at the cap: %d %s, want 200", path, resp.StatusCode, body)
		}
	}
	// The two requests above took the places of the two connections idle longest.
	for i, rd := range readers[:2] {
		if _, err := rd.ReadByte(); err == nil {
			t.Fatalf("connection %d, idle longest, is still open", i)
		}
	}
	if got := cc.evicted.Load(); got != 2 {
		t.Fatalf("%d connections closed as idle, want 2", got)
	}
	resp, err := timedClient().Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	// The scrape itself took the place of a third.
	if m := readAll(t, resp); !strings.Contains(m, `resin_http_connections_closed_idle_total{model_name="tiny-test"} 3`) {
		t.Fatalf("/metrics does not count the 3 connections closed as idle:\n%s", m)
	}
	if n := cc.Open(); n > capN {
		t.Fatalf("%d connections open, above the cap of %d", n, capN)
	}
}

// At the cap with every connection serving a request, a new connection gets 503 at
// once, not a wait for one to end.
func TestConnectionCapBusyIs503(t *testing.T) {
	const capN = 2
	gate := make(chan struct{})
	h := newHarness(t, harnessOpts{noHTTP: true, cfg: func(c *Config) { c.MaxConnections = capN },
		runner: enginetest.Config{MaxContext: 8192, OnPlan: func(*engine.BatchPlan) { <-gate }}})
	release := sync.OnceFunc(func() { close(gate) })
	t.Cleanup(release) // before the harness's cleanup, which waits for the engine
	addr := serveReal(t, h)
	waitFor(t, "Serve to start", func() bool { return h.srv.conns.Load() != nil })
	cc := h.srv.conns.Load()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errs := make(chan error, capN)
	for range capN {
		go func() {
			body := strings.NewReader(`{"prompt":"hold","max_tokens":2}`)
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/v1/completions", body)
			req.Header.Set("Content-Type", "application/json")
			resp, err := freshClient().Do(req)
			if err == nil {
				resp.Body.Close()
			}
			errs <- err
		}()
	}
	// Their requests cannot finish while the gate holds the engine's first step.
	waitFor(t, "both requests to hold a place", func() bool { return cc.Open() == capN })

	resp, err := timedClient().Get("http://" + addr + "/health")
	if err != nil {
		t.Fatalf("/health at the cap, every connection busy: %v", err)
	}
	body := readAll(t, resp)
	var e errorResp
	if resp.StatusCode != http.StatusServiceUnavailable || json.Unmarshal([]byte(body), &e) != nil || e.Error.Code == nil ||
		*e.Error.Code != "too_many_connections" || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("/health at the cap, every connection busy: %d %v %s, want 503 too_many_connections with Retry-After", resp.StatusCode, resp.Header, body)
	}
	if got := cc.refused.Load(); got != 1 {
		t.Fatalf("%d connections refused, want 1", got)
	}
	release()
	for range capN {
		if err := <-errs; err != nil {
			t.Fatalf("a request holding a place failed: %v", err)
		}
	}
	// Once the requests are done their connections are idle: a new client is served.
	resp, err = timedClient().Get("http://" + addr + "/health")
	if err != nil {
		t.Fatal(err)
	}
	if body := readAll(t, resp); resp.StatusCode != 200 {
		t.Fatalf("/health after the busy requests: %d %s", resp.StatusCode, body)
	}
}
