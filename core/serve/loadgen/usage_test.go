package loadgen

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestCachedTokensFromUsage(t *testing.T) {
	for _, whole := range []bool{false, true} {
		f := &fakeOpenAI{tokenize: true, whole: whole, cached: func(string) (int, bool) { return 16, true }}
		srv := f.start(t)
		rep, err := Run(context.Background(), Config{BaseURL: srv.URL, Requests: 5, Concurrency: 2, PromptLen: 64, OutputTokens: 3, Seed: 1})
		if err != nil {
			t.Fatal(err)
		}
		if rep.Completed != 5 || rep.CachedTokens != 80 || rep.CachedReported != 5 || rep.PromptTokens != 320 {
			t.Fatalf("whole=%v: %d completed, %d cached tokens reported by %d, %d prompt tokens: %v",
				whole, rep.Completed, rep.CachedTokens, rep.CachedReported, rep.PromptTokens, rep.Errors)
		}
		if rep.CachedShare == nil || *rep.CachedShare != 0.25 {
			t.Fatalf("whole=%v: cached share %v, want 0.25", whole, rep.CachedShare)
		}
		if whole && (rep.ITL != Stat{} || rep.TTFT.Mean <= 0) {
			t.Fatalf("a whole answer has no inter-token latency but a first token: %+v %+v", rep.ITL, rep.TTFT)
		}
		var table strings.Builder
		rep.WriteTable(&table)
		if !strings.Contains(table.String(), "80 of 320 prompt tokens (25.0%)") {
			t.Fatalf("whole=%v: table\n%s", whole, table.String())
		}
	}
}

func TestCachedTokensNotReported(t *testing.T) {
	// Reported by some responses only (a server that omits zero): the share covers all.
	var answers atomic.Int64
	f := &fakeOpenAI{tokenize: true, cached: func(string) (int, bool) { return 32, answers.Add(1)%2 == 0 }}
	srv := f.start(t)
	rep, err := Run(context.Background(), Config{BaseURL: srv.URL, Requests: 40, Concurrency: 4, PromptLen: 64, OutputTokens: 3, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	if rep.CachedReported != 20 || rep.CachedShare == nil ||
		*rep.CachedShare != float64(32*rep.CachedReported)/float64(rep.PromptTokens) {
		t.Fatalf("cached %d tokens reported by %d of %d, share %v", rep.CachedTokens, rep.CachedReported, rep.Completed, rep.CachedShare)
	}
	var table strings.Builder
	rep.WriteTable(&table)
	if !strings.Contains(table.String(), "reported by") {
		t.Fatalf("a partial report is not flagged:\n%s", table.String())
	}

	// Reported by none: n/a, not 0%.
	for _, whole := range []bool{false, true} {
		f := &fakeOpenAI{tokenize: true, whole: whole}
		srv := f.start(t)
		rep, err := Run(context.Background(), Config{BaseURL: srv.URL, Requests: 3, Concurrency: 1, PromptLen: 8, OutputTokens: 3, Seed: 1})
		if err != nil {
			t.Fatal(err)
		}
		if rep.CachedShare != nil || rep.CachedReported != 0 {
			t.Fatalf("whole=%v: a share reported by %d without details", whole, rep.CachedReported)
		}
		var table strings.Builder
		rep.WriteTable(&table)
		if !strings.Contains(table.String(), "cached      n/a") {
			t.Fatalf("whole=%v: table\n%s", whole, table.String())
		}
	}
}

func TestUsageParsing(t *testing.T) {
	for _, tc := range []struct {
		data        string
		hasCached   bool
		cached      int
		prompt, gen int
	}{
		{`{"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":4,"prompt_tokens_details":{"cached_tokens":8}}}`, true, 8, 9, 4},
		{`{"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":4,"prompt_tokens_details":{"cached_tokens":0}}}`, true, 0, 9, 4},
		{`{"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":4,"prompt_tokens_details":null}}`, false, 0, 9, 4},
		{`{"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":4}}`, false, 0, 9, 4},
	} {
		var s sample
		var last time.Time
		if _, err := s.event([]byte(tc.data), &last); err != nil {
			t.Fatal(err)
		}
		if s.hasCached != tc.hasCached || s.cachedTokens != tc.cached || s.promptTokens != tc.prompt || s.outputTokens != tc.gen {
			t.Errorf("%s: %+v", tc.data, s)
		}
	}
}
