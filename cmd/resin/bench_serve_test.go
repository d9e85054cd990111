package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// fakeEndpoint answers completions with two chunks and usage reporting 8 cached prompt
// tokens; requests after the first `complete` hang until the client goes away, and each
// hanging one is announced on hanging. It has no /tokenize.
func fakeEndpoint(t *testing.T, complete int64, hanging chan<- struct{}) *httptest.Server {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/completions" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"choices\":[{\"text\":\" b\"}]}\n\n")
		if n.Add(1) > complete {
			w.(http.Flusher).Flush()
			hanging <- struct{}{}
			<-r.Context().Done()
			return
		}
		fmt.Fprint(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":32,\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":8}}}\n\ndata: [DONE]\n\n")
	}))
	t.Cleanup(srv.Close)
	return srv
}

func TestBenchServeJSON(t *testing.T) {
	srv := fakeEndpoint(t, 1<<30, nil)
	cmd := newBenchServeCmd()
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs([]string{"--url", srv.URL, "-n", "20", "-c", "4", "--prompt-len", "16", "--output-len", "2", "--json"})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	var rep map[string]any
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("output is not one JSON object: %v\n%s", err, out.String())
	}
	if rep["completed"] != 20.0 || rep["cached_share"] != 0.25 || rep["seed"] == 0.0 || rep["seed_drawn"] != true ||
		rep["prompt_counted_by"] != "words (approximation)" {
		t.Fatalf("report %v", rep)
	}
	// Not a terminal: a warning naming the fallback, then plain progress lines, one at each
	// tenth of the requests (a slow machine may add lines every 5 s between them).
	lines := strings.Split(strings.TrimSpace(errOut.String()), "\n")
	last := lines[len(lines)-1]
	if !strings.HasPrefix(lines[0], "warning: prompt length counted in words") ||
		last != strings.TrimSpace(last) || !strings.HasPrefix(last, "progress: 20/20 requests (100%)") {
		t.Fatalf("stderr:\n%s", errOut.String())
	}
	for n := 2; n <= 20; n += 2 {
		if !strings.Contains(errOut.String(), fmt.Sprintf("progress: %d/20 requests", n)) {
			t.Fatalf("no progress line at %d/20:\n%s", n, errOut.String())
		}
	}
}

func TestBenchServeInterruptExits130(t *testing.T) {
	var code int
	saved := exit
	exit = func(c int) { code = c }
	defer func() { exit = saved }()
	hanging := make(chan struct{}, 8)
	srv := fakeEndpoint(t, 3, hanging)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		for range 2 {
			<-hanging
		}
		cancel() // what the first SIGINT does to the command's context
	}()
	cmd := newBenchServeCmd()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&bytes.Buffer{})
	cmd.SetArgs([]string{"--url", srv.URL, "-n", "50", "-c", "2", "--prompt-len", "8", "--output-len", "2", "--seed", "7"})
	if err := cmd.ExecuteContext(ctx); err != nil {
		t.Fatal(err)
	}
	if code != exitInterrupted {
		t.Fatalf("exit status %d, want %d", code, exitInterrupted)
	}
	for _, want := range []string{"3 completed, 0 failed, 2 cancelled, 45 not sent of 50 (interrupted)", "seed        7\n", "24 of 96 prompt tokens (25.0%)"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
}

func TestBenchServeCountsWithTokenizer(t *testing.T) {
	srv := fakeEndpoint(t, 1<<30, nil)
	cmd := newBenchServeCmd()
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs([]string{"--url", srv.URL, "-n", "4", "-c", "2", "--prompt-len", "40", "--output-len", "2", "--json", "--no-progress",
		"--tokenizer", "../../core/tokenizer/tiny/tokenizer.json"})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	var rep map[string]any
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("output is not one JSON object: %v\n%s", err, out.String())
	}
	if rep["prompt_counted_by"] != "local tokenizer" || rep["prompt_built_tokens_mean"] != 40.0 || errOut.Len() != 0 {
		t.Fatalf("report %v, stderr %q", rep, errOut.String())
	}
}
