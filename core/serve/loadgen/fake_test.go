package loadgen

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// fakeOpenAI is an OpenAI-compatible server for the tests: it answers completions and
// chat with three text chunks and usage, records the prompts it was sent, and counts
// prompt tokens with one rule for /tokenize and for usage.
type fakeOpenAI struct {
	tokenize bool                            // serve POST /tokenize
	whole    bool                            // answer with one JSON object, not a stream
	cached   func(prompt string) (int, bool) // prompt_tokens_details.cached_tokens, if any

	mu            sync.Mutex
	prompts       []string
	tokenizeCalls atomic.Int64
}

// fakeCount is the fake tokenizer: one token for the start of the text, then one per
// word and one more per four letters of it.
func fakeCount(text string) int {
	n := 1
	for _, w := range strings.Fields(text) {
		n += 1 + len(w)/4
	}
	return n
}

func (f *fakeOpenAI) start(t *testing.T) *httptest.Server {
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return srv
}

// sortedPrompts returns the prompts received so far, sorted (arrival order varies).
func (f *fakeOpenAI) sortedPrompts() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Sorted(slices.Values(f.prompts))
}

func (f *fakeOpenAI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Prompt   string `json:"prompt"`
		Messages []struct {
			Content string `json:"content"`
		} `json:"messages"`
	}
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if r.URL.Path == "/tokenize" {
		if !f.tokenize {
			http.NotFound(w, r)
			return
		}
		f.tokenizeCalls.Add(1)
		n := fakeCount(body.Prompt)
		json.NewEncoder(w).Encode(map[string]any{"tokens": make([]int, n), "count": n})
		return
	}
	prompt := body.Prompt
	if len(body.Messages) > 0 {
		prompt = body.Messages[0].Content
	}
	f.mu.Lock()
	f.prompts = append(f.prompts, prompt)
	f.mu.Unlock()

	details := ""
	if f.cached != nil {
		if n, ok := f.cached(prompt); ok {
			details = fmt.Sprintf(`,"prompt_tokens_details":{"cached_tokens":%d}`, n)
		}
	}
	usage := fmt.Sprintf(`{"prompt_tokens":%d,"completion_tokens":3%s}`, fakeCount(prompt), details)
	if f.whole {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"choices":[{"text":"a b c"}],"usage":%s}`, usage)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	for _, tok := range []string{"a", " b", " c"} {
		fmt.Fprintf(w, "data: {\"choices\":[{\"text\":%q}]}\n\n", tok)
	}
	fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":%s}\n\ndata: [DONE]\n\n", usage)
}

// httptestServer answers every path with the status status(path) gives.
func httptestServer(t *testing.T, status func(path string) int) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(status(r.URL.Path))
	}))
	t.Cleanup(srv.Close)
	return srv
}

func itoa(n int64) string { return fmt.Sprint(n) }
