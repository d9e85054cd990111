package serve

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

// idArray is a JSON array of n token ids of the tiny vocabulary, 4 bytes each.
func idArray(n int) []byte {
	var b bytes.Buffer
	b.WriteByte('[')
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(100 + i%900))
	}
	b.WriteByte(']')
	return b.Bytes()
}

// allocated is the bytes f allocates.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestPromptFieldShapes: each shape of prompt decodes to its inputs, and a value of none
// of them is refused naming the field.
func TestPromptFieldShapes(t *testing.T) {
	for _, c := range []struct {
		json string
		want string // fmt of the inputs, or the start of the error
	}{
		{`"hi"`, `[{hi []}]`},
		{` ["a", "b"]`, `[{a []} {b []}]`},
		{`[1, 2 ,3]`, `[{ [1 2 3]}]`},
		{"[[1,2],\n [3]]", `[{ [1 2]} { [3]}]`},
		{`[2147483647]`, `[{ [2147483647]}]`},
		{`null`, `[]`},
		{`[]`, "error: The prompt batch is empty."},
		{`[[]]`, "error: The token-id prompt is empty."},
		{`[[1], []]`, "error: The token-id prompt is empty."},
		{`[1, "a"]`, "error: prompt must be"},
		{`[[1], ["a"]]`, "error: prompt must be"},
		{`[[1], 2]`, "error: prompt must be"},
		{`[1, [2]]`, "error: prompt must be"},
		{`["a", 1]`, "error: prompt must be"},
		{`[1.5]`, "error: Token ids must be integers."},
		{`[1e3]`, "error: Token ids must be integers."},
		{`[-1]`, "error: Token id -1 at position 0 is out of range."},
		{`[7, 2147483648]`, "error: Token id at position 1 is out of range."},
		{`[99999999999999999999999]`, "error: Token id at position 0 is out of range."},
		{`{}`, "error: prompt must be"},
		{`12`, "error: prompt must be"},
		{`true`, "error: prompt must be"},
		{`[` + strings.Repeat(`[1],`, maxSequences) + `[1]]`, fmt.Sprintf("error: At most %d prompts", maxSequences)},
		{`[1,2,3,4]`, "error: The token-id prompt has more than 3 tokens"},
		{`[[1],[1,2,3,4]]`, "error: The token-id prompt has more than 3 tokens"},
		{`[[1]], "prompt": [[2]]`, `[{ [2]}]`}, // a repeated key replaces the prompt
	} {
		var req completionRequest
		req.Prompt.maxTokens = 4
		err := decodeBody(strings.NewReader(`{"prompt": `+c.json+`}`), &req)
		got := fmt.Sprint(req.Prompt.inputs)
		if req.Prompt.inputs == nil {
			got = "[]"
		}
		if err != nil {
			got = "error: " + err.Error()
			if ae, ok := err.(*apiError); !ok || ae.param != "prompt" {
				t.Errorf("%s: %v does not name prompt", c.json, err)
			}
		}
		if !strings.HasPrefix(got, c.want) {
			t.Errorf("%.40s: %s, want %s", c.json, got, c.want)
		}
	}
}

// TestHugeTokenPromptDecodedOnce: a million token ids for a 2048-token context are read
// until the limit and refused: the decoder allocates the ids it read, not the array. (It
// was unmarshalled as a string, []string, []int64 and [][]int64 in turn: ~60 MB for a 6 MB
// array, and refused only by the engine.)
func TestHugeTokenPromptDecodedOnce(t *testing.T) {
	raw := idArray(1 << 20)
	var err error
	n := allocated(func() {
		var p promptField
		p.maxTokens = 2048
		err = p.UnmarshalJSON(raw)
	})
	ae, ok := err.(*apiError)
	if !ok || ae.code != "context_length_exceeded" || !strings.Contains(ae.message, "more than 2047 tokens") || !strings.Contains(ae.message, "2048") {
		t.Fatalf("error %v, want context_length_exceeded naming the 2048-token context", err)
	}
	if n > 64<<10 {
		t.Errorf("decoding the %d-byte prompt up to its refusal allocated %d bytes, want the read ids only (8 KB)", len(raw), n)
	}
}

// TestHugeTokenPromptRefused: through the handler the request is refused with
// context_length_exceeded, naming prompt and the context, having allocated a few times
// the body (the decoder's buffer), not tens of times.
func TestHugeTokenPromptRefused(t *testing.T) {
	h := newHarness(t, harnessOpts{noRun: true, noHTTP: true})
	body := []byte(`{"model": "tiny-test", "max_tokens": 1, "prompt": ` + string(idArray(1<<20)) + `}`)
	var rec *httptest.ResponseRecorder
	n := allocated(func() {
		req := httptest.NewRequest(http.MethodPost, "/v1/completions", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		rec = httptest.NewRecorder()
		h.srv.Handler().ServeHTTP(rec, req)
	})
	var e errorResp
	if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || rec.Code != 400 || e.Error.Code == nil || *e.Error.Code != "context_length_exceeded" ||
		e.Error.Param == nil || *e.Error.Param != "prompt" || !strings.Contains(e.Error.Message, strconv.Itoa(h.srv.prompts.maxContext)) {
		t.Fatalf("status %d %s, want 400 context_length_exceeded naming prompt and the %d-token context", rec.Code, rec.Body, h.srv.prompts.maxContext)
	}
	t.Logf("a %d-byte token-id prompt refused after %d bytes allocated", len(body), n)
	if n > 5*uint64(len(body)) {
		t.Errorf("%d bytes allocated for a %d-byte body, want at most 5 times the body (the decoder's buffer)", n, len(body))
	}
}

// BenchmarkHugeTokenPrompt reports the bytes one 4 MB token-id prompt costs until it is
// refused (B/op), through the handler.
func BenchmarkHugeTokenPrompt(b *testing.B) {
	h := newHarness(&testing.T{}, harnessOpts{noRun: true, noHTTP: true})
	defer h.close()
	body := []byte(`{"model": "tiny-test", "max_tokens": 1, "prompt": ` + string(idArray(1<<20)) + `}`)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		req := httptest.NewRequest(http.MethodPost, "/v1/completions", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.srv.Handler().ServeHTTP(rec, req)
		if rec.Code != 400 {
			b.Fatalf("status %d", rec.Code)
		}
	}
}
