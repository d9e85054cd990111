package loadgen

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// fakeServer streams `chunks` text chunks and a usage chunk for every request; it has no
// /tokenize.
func fakeServer(t *testing.T, chunks int, hits *atomic.Int64) *httptest.Server {
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/tokenize" {
			http.NotFound(w, r)
			return
		}
		hits.Add(1)
		var body map[string]any
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil || body["stream"] != true {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		chat := r.URL.Path == "/v1/chat/completions"
		for i := 0; i < chunks; i++ {
			if chat {
				fmt.Fprintf(w, "data: {\"choices\":[{\"delta\":{\"content\":\"t%d\"}}]}\n\n", i)
			} else {
				fmt.Fprintf(w, "data: {\"choices\":[{\"text\":\"t%d\"}]}\n\n", i)
			}
			w.(http.Flusher).Flush()
		}
		fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":%d}}\n\ndata: [DONE]\n\n", chunks)
	}))
}

func TestRunCountsTokensAndLatencies(t *testing.T) {
	var hits atomic.Int64
	srv := fakeServer(t, 5, &hits)
	defer srv.Close()
	for _, chat := range []bool{false, true} {
		hits.Store(0)
		var progress Tally
		rep, err := Run(context.Background(), Config{
			BaseURL: srv.URL, Model: "m", Chat: chat, Requests: 12, Concurrency: 3,
			PromptLen: 8, OutputTokens: 5, Progress: func(t Tally) { progress = t },
		})
		if err != nil {
			t.Fatal(err)
		}
		if rep.Completed != 12 || rep.Failed != 0 || rep.Cancelled != 0 || rep.NotSent != 0 || hits.Load() != 12 {
			t.Fatalf("chat=%v: completed %d failed %d cancelled %d not sent %d hits %d: %v",
				chat, rep.Completed, rep.Failed, rep.Cancelled, rep.NotSent, hits.Load(), rep.Errors)
		}
		if rep.OutputTokens != 60 || rep.PromptTokens != 84 || rep.MeanPromptTokens != 7 {
			t.Fatalf("tokens %d/%d (mean prompt %v), want 60 output and 84 prompt", rep.OutputTokens, rep.PromptTokens, rep.MeanPromptTokens)
		}
		if progress != (Tally{Completed: 12, Total: 12}) {
			t.Fatalf("progress ended at %+v", progress)
		}
		if rep.TTFT.P50 <= 0 || rep.E2E.P99 < rep.E2E.P50 || rep.RequestsPerS <= 0 {
			t.Fatalf("implausible report %+v", rep)
		}
		var out strings.Builder
		if err := rep.WriteTable(&out); err != nil || !strings.Contains(out.String(), "TTFT") {
			t.Fatalf("table: %v\n%s", err, out.String())
		}
	}
}

func TestRunPoissonAndFailures(t *testing.T) {
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/tokenize" {
			http.NotFound(w, r)
			return
		}
		hits.Add(1)
		http.Error(w, `{"error":{"message":"queue full"}}`, http.StatusTooManyRequests)
	}))
	defer srv.Close()
	rep, err := Run(context.Background(), Config{
		BaseURL: srv.URL, Requests: 4, Concurrency: 2, RequestRate: 1000, PromptLen: 3, OutputTokens: 2, Seed: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Failed != 4 || rep.Completed != 0 || rep.Cancelled != 0 || len(rep.Errors) == 0 || !strings.Contains(rep.Errors[0], "429") {
		t.Fatalf("report %+v", rep)
	}
}

func TestConfigErrors(t *testing.T) {
	for _, c := range []Config{
		{BaseURL: "ftp://x", Requests: 1, Concurrency: 1, PromptLen: 1, OutputTokens: 1},
		{BaseURL: "http://x", Requests: 0, Concurrency: 1, PromptLen: 1, OutputTokens: 1},
		{BaseURL: "http://x", Requests: 1, Concurrency: 0, PromptLen: 1, OutputTokens: 1},
		{BaseURL: "http://x", Requests: 1, Concurrency: 1, PromptLen: 0, OutputTokens: 1},
		{BaseURL: "http://x", Requests: 1, Concurrency: 1, PromptLen: 1, OutputTokens: 0},
		{BaseURL: "http://x", Requests: 1, Concurrency: 1, PromptLen: 1, OutputTokens: 1, RequestRate: -1},
	} {
		if _, err := Run(context.Background(), c); !errors.Is(err, ErrConfig) {
			t.Errorf("%+v: error %v", c, err)
		}
	}
}

func TestPercentile(t *testing.T) {
	xs := []float64{1, 2, 3, 4, 5}
	if p := percentile(xs, 0.5); p != 3 {
		t.Fatalf("p50 = %v", p)
	}
	if p := percentile(xs, 0.9); p != 4.6 {
		t.Fatalf("p90 = %v", p)
	}
}
