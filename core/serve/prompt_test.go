package serve

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/engine/enginetest"
)

// countTokenized wraps the server's tokenizer to count the bytes it is given.
func countTokenized(s *Server) *atomic.Int64 {
	var seen atomic.Int64
	encode := s.encode
	s.encode = func(text string, addSpecial bool) ([]int32, error) {
		seen.Add(int64(len(text)))
		return encode(text, addSpecial)
	}
	return &seen
}

func words(n int) string {
	var b strings.Builder
	for b.Len() < n {
		b.WriteString("hello world, ")
	}
	return b.String()[:n]
}

func contextError(t *testing.T, code int, raw []byte, param string) errorResp {
	t.Helper()
	var e errorResp
	if err := json.Unmarshal(raw, &e); err != nil || code != 400 || e.Error.Code == nil || *e.Error.Code != "context_length_exceeded" {
		t.Fatalf("status %d %s, want 400 context_length_exceeded", code, raw)
	}
	if e.Error.Param == nil || *e.Error.Param != param {
		t.Errorf("param %v, want %q: %s", e.Error.Param, param, raw)
	}
	for _, leak := range []string{"req-", "engine:", "request \""} {
		if strings.Contains(e.Error.Message, leak) {
			t.Errorf("message leaks %q: %s", leak, e.Error.Message)
		}
	}
	return e
}

// An 8 MB prompt is refused by its size: the tokenizer never sees a byte of it.
func TestOversizePromptRefusedUnread(t *testing.T) {
	h := newHarness(t, harnessOpts{cfg: func(c *Config) { c.MaxBodyBytes = 16 << 20 }})
	seen := countTokenized(h.srv)
	big := words(8 << 20)
	code, raw := h.post("/v1/completions", map[string]any{"prompt": big, "max_tokens": 1})
	contextError(t, code, raw, "prompt")
	code, raw = h.post("/v1/chat/completions", map[string]any{"messages": []any{map[string]any{"role": "user", "content": big}}, "max_tokens": 1})
	if e := contextError(t, code, raw, "messages"); !strings.Contains(e.Error.Message, "unrendered") {
		t.Errorf("chat: %q: want the refusal before the template renders the messages", e.Error.Message)
	}
	if n := seen.Load(); n != 0 {
		t.Fatalf("the tokenizer saw %d bytes of prompts refused by size", n)
	}
}

// A prompt within the byte bound but with too many tokens is counted a chunk at a time
// and refused once the count passes the context, its bytes never tokenized in full.
func TestLongPromptRefusedAfterOneChunk(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	seen := countTokenized(h.srv)
	l := h.srv.prompts
	long := words(l.maxBytes - 100)
	code, raw := h.post("/v1/completions", map[string]any{"prompt": long, "max_tokens": 1})
	e := contextError(t, code, raw, "prompt")
	if !strings.Contains(e.Error.Message, fmt.Sprintf("more than %d tokens", l.maxContext)) {
		t.Errorf("message %q does not give the limit", e.Error.Message)
	}
	if n := seen.Load(); n > int64(l.chunk) || n == 0 {
		t.Fatalf("the tokenizer saw %d of the prompt's %d bytes, want one chunk (%d)", n, len(long), l.chunk)
	}
	seen.Store(0)
	code, raw = h.post("/v1/chat/completions", map[string]any{"messages": []any{map[string]any{"role": "user", "content": long}}, "max_tokens": 1})
	contextError(t, code, raw, "messages")
	if n := seen.Load(); n > int64(l.chunk) {
		t.Fatalf("chat: the tokenizer saw %d bytes, want one chunk (%d)", n, l.chunk)
	}
}

// A prompt longer than a chunk that fits is counted, then tokenized whole: the engine
// gets exactly the tokenizer's ids.
func TestCountedPromptThatFitsIsExact(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	h.srv.prompts.chunk = 300
	seen := countTokenized(h.srv)
	prompt := words(3000)
	want, _ := h.tok.Encode(prompt, true)
	var out completionOut
	h.postJSON("/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 1}, 200, &out)
	if out.Usage.PromptTokens != len(want) {
		t.Fatalf("prompt tokens %d, want %d", out.Usage.PromptTokens, len(want))
	}
	if n := seen.Load(); n != 2*int64(len(prompt)) {
		t.Fatalf("tokenized %d bytes, want the prompt counted and then encoded (%d)", n, 2*len(prompt))
	}
}

// Chunks end where the whole text's tokens split too, so counting by chunks gives the
// whole text's count.
func TestChunkCountMatchesWholeText(t *testing.T) {
	h := newHarness(t, harnessOpts{noRun: true, noHTTP: true})
	rng := rand.New(rand.NewPCG(1, 2))
	vocab := []string{"the", "cat", "sat", "on", "mat", "élan", "naïve", "x1", "42", "co-op", "it's", "日本語", "\n", "  ", ", ", ". "}
	var b strings.Builder
	for b.Len() < 20000 {
		b.WriteString(vocab[rng.IntN(len(vocab))])
		if rng.IntN(3) > 0 {
			b.WriteByte(' ')
		}
	}
	text := b.String()
	whole, _ := h.tok.Encode(text, false)
	for _, chunk := range []int{257, 1000, 4096} {
		l := h.srv.prompts
		l.chunk = chunk
		count := 0
		for start := 0; start < len(text); {
			end := l.chunkEnd(text, start)
			if end <= start || end < len(text) && !isRuneStart(text[end]) {
				t.Fatalf("chunk %d: bad end %d after %d", chunk, end, start)
			}
			ids, _ := h.tok.Encode(text[start:end], false)
			count += len(ids)
			start = end
		}
		if count != len(whole) {
			t.Errorf("chunks of %d bytes count %d tokens, the whole text %d", chunk, count, len(whole))
		}
	}
}

func isRuneStart(c byte) bool { return c&0xC0 != 0x80 }

// A context-length error found by the engine (prompt plus max_tokens) names the route's
// prompt field and no internals.
func TestContextErrorNamesItsField(t *testing.T) {
	h := newHarness(t, harnessOpts{runner: smallRunner()})
	code, raw := h.post("/v1/completions", map[string]any{"prompt": "hello", "max_tokens": 1000})
	e := contextError(t, code, raw, "prompt")
	if !strings.Contains(e.Error.Message, "max tokens") {
		t.Errorf("message %q lacks the engine's figures", e.Error.Message)
	}
	code, raw = h.post("/v1/chat/completions", map[string]any{"messages": []any{map[string]any{"role": "user", "content": "hello"}}, "max_tokens": 1000})
	contextError(t, code, raw, "messages")
}

// oversizeRound sends n concurrent oversize prompts straight to the handler and checks
// every one is refused with context_length_exceeded.
func oversizeRound(tb testing.TB, s *Server, body []byte, n int) {
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			req := httptest.NewRequest(http.MethodPost, "/v1/completions", bytes.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			rec := httptest.NewRecorder()
			s.Handler().ServeHTTP(rec, req)
			if rec.Code != 400 || !strings.Contains(rec.Body.String(), "context_length_exceeded") {
				tb.Errorf("status %d %.200s, want 400 context_length_exceeded", rec.Code, rec.Body)
			}
		})
	}
	wg.Wait()
}

// memPeak samples the heap in use and the process's RSS while f runs and reports the
// peaks above the levels before it, and the bytes f allocated.
func memPeak(f func()) (heapMB, rssMB, allocMB float64) {
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	rss0 := rssBytes()
	var peakHeap, peakRSS atomic.Uint64
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		var ms runtime.MemStats
		for {
			runtime.ReadMemStats(&ms)
			if ms.HeapInuse > peakHeap.Load() {
				peakHeap.Store(ms.HeapInuse)
			}
			if r := rssBytes(); r > peakRSS.Load() {
				peakRSS.Store(r)
			}
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	f()
	close(stop)
	<-done
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	mb := func(b uint64, base uint64) float64 { return float64(max(b, base)-base) / (1 << 20) }
	return mb(peakHeap.Load(), before.HeapInuse), mb(peakRSS.Load(), rss0), mb(after.TotalAlloc, before.TotalAlloc)
}

// rssBytes reads the process's resident set size (0 where /proc is missing).
func rssBytes() uint64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0
	}
	pages, _ := strconv.ParseUint(f[1], 10, 64)
	return pages * uint64(os.Getpagesize())
}

// Eight concurrent 8 MB prompts to a long-context model (32k asked, 16k once the engine
// caps it to the test pool) are refused by size, and eight prompts just under the byte
// bound after one chunk each; the log gives the memory they took. (Before: one 8.3 MB prompt was tokenized whole, ~380 MB and 3.5 s, and
// eight peaked at 3.6 GB RSS.)
func TestOversizePromptsMemory(t *testing.T) {
	h := newHarness(t, harnessOpts{runner: enginetest.Config{MaxContext: 32768}, cfg: func(c *Config) { c.MaxBodyBytes = 16 << 20 }})
	seen := countTokenized(h.srv)
	l := h.srv.prompts
	for _, c := range []struct {
		name  string
		bytes int
	}{{"8 MB", 8 << 20}, {"just under the byte bound", l.maxBytes - 100}} {
		body, _ := json.Marshal(map[string]any{"prompt": words(c.bytes), "max_tokens": 1})
		seen.Store(0)
		heap, rss, alloc := memPeak(func() { oversizeRound(t, h.srv, body, 8) })
		t.Logf("8 concurrent %s prompts (%d bytes each, context %d tokens): peak heap +%.1f MB, peak RSS +%.1f MB, %.1f MB allocated, %d bytes tokenized",
			c.name, c.bytes, l.maxContext, heap, rss, alloc, seen.Load())
		if n := seen.Load(); n > int64(8*l.chunk) {
			t.Errorf("%s: the tokenizer saw %d bytes, more than one chunk (%d) per prompt", c.name, n, l.chunk)
		}
	}
}

// BenchmarkOversizePrompts reports the memory of 8 concurrent 8 MB prompts refused by
// size, and of 8 just under the byte bound refused after one chunk (16k context).
func BenchmarkOversizePrompts(b *testing.B) {
	h := newHarness(&testing.T{}, harnessOpts{noRun: true, noHTTP: true, runner: enginetest.Config{MaxContext: 32768},
		cfg: func(c *Config) { c.MaxBodyBytes = 16 << 20 }})
	defer h.close()
	for _, c := range []struct {
		name  string
		bytes int
	}{{"8MB", 8 << 20}, {"near-bound", h.srv.prompts.maxBytes - 100}} {
		body, _ := json.Marshal(map[string]any{"prompt": words(c.bytes), "max_tokens": 1})
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			var heap, rss float64
			for b.Loop() {
				hp, rp, _ := memPeak(func() { oversizeRound(b, h.srv, body, 8) })
				heap, rss = max(heap, hp), max(rss, rp)
			}
			b.ReportMetric(heap, "peak-heap-MB")
			b.ReportMetric(rss, "peak-RSS-MB")
		})
	}
}
