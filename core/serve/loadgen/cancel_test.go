package loadgen

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

func TestCancelCountsInFlightAsCancelled(t *testing.T) {
	// The first two requests complete; the rest stream one chunk and then hang until the
	// client goes away.
	var n atomic.Int64
	hanging := make(chan struct{}, 16)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/tokenize" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"text\":\"a\"}]}\n\n")
		if n.Add(1) <= 2 {
			fmt.Fprint(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":1}}\n\ndata: [DONE]\n\n")
			return
		}
		w.(http.Flusher).Flush()
		hanging <- struct{}{}
		<-r.Context().Done()
	}))
	defer srv.Close()

	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		for range 3 { // the concurrency: every slot holds a hanging request
			<-hanging
		}
		cancel()
	}()
	var last Tally
	rep, err := Run(ctx, Config{BaseURL: srv.URL, Requests: 10, Concurrency: 3, PromptLen: 4, OutputTokens: 1, Seed: 1,
		Progress: func(t Tally) { last = t }})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("error %v, want context.Canceled", err)
	}
	if rep.Completed != 2 || rep.Cancelled != 3 || rep.Failed != 0 || rep.NotSent != 5 || !rep.Interrupted {
		t.Fatalf("%d completed, %d cancelled, %d failed, %d not sent (interrupted %v): %v",
			rep.Completed, rep.Cancelled, rep.Failed, rep.NotSent, rep.Interrupted, rep.Errors)
	}
	if last != (Tally{Completed: 2, Cancelled: 3, Total: 10}) {
		t.Fatalf("last progress %+v", last)
	}
	var table strings.Builder
	rep.WriteTable(&table)
	if !strings.Contains(table.String(), "2 completed, 0 failed, 3 cancelled, 5 not sent of 10 (interrupted)") {
		t.Fatalf("table:\n%s", table.String())
	}
}

func TestTimeoutIsAFailureNotACancellation(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/tokenize" {
			http.NotFound(w, r)
			return
		}
		<-r.Context().Done()
	}))
	defer srv.Close()
	rep, err := Run(context.Background(), Config{BaseURL: srv.URL, Requests: 2, Concurrency: 2, PromptLen: 4, OutputTokens: 1, Seed: 1, Timeout: 1})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Failed != 2 || rep.Cancelled != 0 || rep.Interrupted {
		t.Fatalf("%d failed, %d cancelled (interrupted %v)", rep.Failed, rep.Cancelled, rep.Interrupted)
	}
}
