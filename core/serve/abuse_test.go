package serve

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

// Numbers at the edges of what JSON can carry get a clear answer, not a wrapped value.
func TestHugeNumbers(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	code, raw := h.post("/v1/completions", []byte(`{"prompt":"hi","max_tokens":9223372036854775807}`))
	var e errorResp
	if err := json.Unmarshal(raw, &e); err != nil || code != 400 || e.Error.Code == nil || *e.Error.Code != "context_length_exceeded" {
		t.Errorf("max_tokens MaxInt64: status %d %s, want 400 context_length_exceeded", code, raw)
	}
	// top_k beyond int32 keeps the whole vocabulary (as vLLM treats any k >= vocab).
	var out completionOut
	h.postJSON("/v1/completions", []byte(`{"prompt":"hi","max_tokens":3,"top_k":2147483648}`), 200, &out)
	if f := out.Choices[0].FinishReason; f == nil || *f != "length" || out.Usage.CompletionTokens != 3 {
		t.Errorf("top_k 2^31: %+v", out)
	}
}

// A field of the wrong type is named as the client wrote it.
func TestTypeErrorNamesTheField(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	for body, want := range map[string]string{
		`{"prompt":"x","max_tokens":"many"}`:                  "max_tokens",
		`{"prompt":"x","temperature":"hot"}`:                  "temperature",
		`{"prompt":"x","stream_options":{"include_usage":3}}`: "stream_options.include_usage",
		`{"prompt":"x","logprobs":"yes"}`:                     "logprobs",
	} {
		_, raw := h.post("/v1/completions", []byte(body))
		var e errorResp
		if err := json.Unmarshal(raw, &e); err != nil || e.Error.Param == nil || *e.Error.Param != want {
			t.Errorf("%s: %s, want param %q", body, raw, want)
		}
	}
}

// A stop string ends the request early, but the usage still reports the prompt tokens
// served from the prefix cache, as it does without a stop string.
func TestStopStringUsageKeepsCachedTokens(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	ids := make([]int32, 40)
	for i := range ids {
		ids[i] = int32(100 + i)
	}
	_, full := h.reference(ids, 60)
	runes := []rune(full)
	stop := string(runes[len(runes)/2 : len(runes)/2+2])
	body := map[string]any{"prompt": ids, "max_tokens": 60, "temperature": 0}
	var plain completionOut
	h.postJSON("/v1/completions", body, 200, &plain) // fills the prefix cache
	h.postJSON("/v1/completions", body, 200, &plain)
	if plain.Usage.PromptTokensDetails == nil || plain.Usage.PromptTokensDetails.CachedTokens == 0 {
		t.Fatalf("no cached tokens reported for a repeated prompt: %+v", plain.Usage)
	}
	body["stop"] = stop
	var stopped completionOut
	h.postJSON("/v1/completions", body, 200, &stopped)
	if f := stopped.Choices[0].FinishReason; f == nil || *f != "stop" {
		t.Fatalf("stop %q did not stop: %+v", stop, stopped)
	}
	if stopped.Usage.PromptTokensDetails == nil || *stopped.Usage.PromptTokensDetails != *plain.Usage.PromptTokensDetails {
		t.Errorf("usage with a stop string %+v, without %+v: cached tokens differ", stopped.Usage, plain.Usage)
	}
}

// A stop string ends the request in the engine as a stop (engine.Stop), never an abort,
// so the engine's finish-reason metrics do not count it as one. (The engine may also
// have finished the request by length before the service saw the stop string.)
func TestStopStringCountsAsStop(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	ids := []int32{100, 101, 102, 103, 104, 105}
	_, full := h.reference(ids, 40)
	runes := []rune(full)
	body := map[string]any{"prompt": ids, "max_tokens": 40, "temperature": 0, "stop": string(runes[len(runes)/2 : len(runes)/2+2])}
	var out completionOut
	h.postJSON("/v1/completions", body, 200, &out)
	if f := out.Choices[0].FinishReason; f == nil || *f != "stop" {
		t.Fatalf("finish %v, want stop", f)
	}
	resp, err := http.Get(h.ts.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	got := grepLines(string(b), "resin_requests_finished_total{")
	stopped := strings.Contains(got, `reason="stop"} 1`) || strings.Contains(got, `reason="length"} 1`)
	if !strings.Contains(got, `reason="abort"} 0`) || !stopped {
		t.Errorf("finish metrics, want one stop or length and no abort:\n%s", got)
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
