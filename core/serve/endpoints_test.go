package serve

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
)

func TestVersion(t *testing.T) {
	h := newHarness(t, harnessOpts{cfg: func(c *Config) { c.Version = "v1.2.3"; c.APIKey = "k" }})
	resp, err := http.Get(h.ts.URL + "/version")
	if err != nil {
		t.Fatal(err)
	}
	var v map[string]string
	if err := json.Unmarshal([]byte(readAll(t, resp)), &v); err != nil || resp.StatusCode != 200 {
		t.Fatalf("status %d, %v", resp.StatusCode, err)
	}
	if v["version"] != "v1.2.3" || v["model"] != "tiny-test" {
		t.Fatalf("/version %v", v)
	}
}

// /tokenize and /detokenize take vLLM's request shapes and answer with its response
// shapes.
func TestTokenizeDetokenize(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	type tokenized struct {
		Count       int       `json:"count"`
		MaxModelLen int       `json:"max_model_len"`
		Tokens      []int32   `json:"tokens"`
		TokenStrs   *[]string `json:"token_strs"`
	}
	var out tokenized
	h.postJSON("/tokenize", map[string]any{"model": "tiny-test", "prompt": "Hello there"}, 200, &out)
	want, _ := h.tok.Encode("Hello there", true)
	if !slices.Equal(out.Tokens, want) || out.Count != len(want) || out.MaxModelLen != h.eng.Info().MaxContext || out.TokenStrs != nil {
		t.Fatalf("tokenize prompt: %+v, want tokens %v and max_model_len %d", out, want, h.eng.Info().MaxContext)
	}
	h.postJSON("/tokenize", map[string]any{"prompt": "Hello there", "add_special_tokens": false, "return_token_strs": true}, 200, &out)
	want, _ = h.tok.Encode("Hello there", false)
	if !slices.Equal(out.Tokens, want) || out.TokenStrs == nil || len(*out.TokenStrs) != len(want) {
		t.Fatalf("tokenize without special tokens, with strings: %+v, want %v", out, want)
	}
	for i, id := range want {
		if s, _ := h.tok.Token(id); (*out.TokenStrs)[i] != s {
			t.Errorf("token_strs[%d] = %q, want the vocabulary's %q", i, (*out.TokenStrs)[i], s)
		}
	}

	msgs := []map[string]any{{"role": "user", "content": "Hi"}}
	h.postJSON("/tokenize", map[string]any{"messages": msgs}, 200, &out)
	cm, _ := chatMessages([]map[string]json.RawMessage{{"role": json.RawMessage(`"user"`), "content": json.RawMessage(`"Hi"`)}})
	rendered, err := h.srv.chat.Render(cm, chatOpts())
	if err != nil {
		t.Fatal(err)
	}
	want, _ = h.tok.Encode(rendered, false)
	if !slices.Equal(out.Tokens, want) {
		t.Fatalf("tokenize messages: %v, want %v", out.Tokens, want)
	}

	var text struct {
		Prompt string `json:"prompt"`
	}
	h.postJSON("/detokenize", map[string]any{"model": "tiny-test", "tokens": want}, 200, &text)
	if text.Prompt != rendered {
		t.Fatalf("detokenize: %q, want %q", text.Prompt, rendered)
	}

	for body, param := range map[string]string{
		`{"tokens":[-1]}`:                "tokens",
		`{"tokens":[99999999]}`:          "tokens",
		`{}`:                             "tokens",
		`{"model":"other","tokens":[1]}`: "model",
		`{"prompt":"a","messages":[]}`:   "messages",
		`{"prompt":3}`:                   "prompt",
		`{"prompt":"x","messages":null,"model":1}`: "model",
	} {
		path := "/detokenize"
		if strings.Contains(body, "prompt") {
			path = "/tokenize"
		}
		code, raw := h.post(path, []byte(body))
		var e errorResp
		_ = json.Unmarshal(raw, &e)
		if code/100 != 4 || e.Error.Param == nil || *e.Error.Param != param {
			t.Errorf("%s %s: %d %s, want a 4xx naming %q", path, body, code, raw, param)
		}
	}
}

// /tokenize counts what it tokenizes against the same byte bound as generation.
func TestTokenizeOversize(t *testing.T) {
	h := newHarness(t, harnessOpts{cfg: func(c *Config) { c.MaxBodyBytes = 16 << 20 }})
	seen := countTokenized(h.srv)
	code, raw := h.post("/tokenize", map[string]any{"prompt": words(h.srv.prompts.maxBytes + 1)})
	contextError(t, code, raw, "prompt")
	if seen.Load() != 0 {
		t.Fatalf("tokenized %d bytes of a prompt over the byte bound", seen.Load())
	}
	// Within the bound, a prompt longer than the context is counted, as vLLM does.
	var out struct {
		Count       int `json:"count"`
		MaxModelLen int `json:"max_model_len"`
	}
	h.postJSON("/tokenize", map[string]any{"prompt": words(h.srv.prompts.maxBytes / 2)}, 200, &out)
	if out.Count <= out.MaxModelLen {
		t.Fatalf("count %d within max_model_len %d: the test prompt is too short", out.Count, out.MaxModelLen)
	}
}

func TestTokenizeNeedsKey(t *testing.T) {
	h := newHarness(t, harnessOpts{cfg: func(c *Config) { c.APIKey = "k" }})
	if code, raw := h.post("/tokenize", map[string]any{"prompt": "x"}); code != 401 {
		t.Fatalf("tokenize without key: %d %s", code, raw)
	}
	if code, raw := h.post("/tokenize", map[string]any{"prompt": "x"}, "Authorization", "Bearer k"); code != 200 {
		t.Fatalf("tokenize with key: %d %s", code, raw)
	}
}

func TestPprofOptIn(t *testing.T) {
	for _, on := range []bool{false, true} {
		h := newHarness(t, harnessOpts{cfg: func(c *Config) { c.EnablePprof = on; c.APIKey = "k" }})
		get := func(key string) int {
			req, _ := http.NewRequest(http.MethodGet, h.ts.URL+"/debug/pprof/goroutine?debug=1", nil)
			if key != "" {
				req.Header.Set("Authorization", "Bearer "+key)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			readAll(t, resp)
			return resp.StatusCode
		}
		if on {
			if code := get("k"); code != 200 {
				t.Errorf("pprof on: %d, want 200", code)
			}
			if code := get(""); code != 401 {
				t.Errorf("pprof on without the key: %d, want 401", code)
			}
		} else if code := get("k"); code != 404 {
			t.Errorf("pprof off: %d, want 404", code)
		}
	}
}

// /metrics carries the model_name label on resin_ metrics, and the process and Go
// metrics.
func TestMetricsForDashboards(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	h.postJSON("/v1/completions", map[string]any{"prompt": "m", "max_tokens": 3}, 200, nil)
	resp, err := http.Get(h.ts.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body := readAll(t, resp)
	for _, want := range []string{
		`resin_e2e_request_latency_seconds_count{model_name="tiny-test"} 1`,
		`resin_time_to_first_token_seconds_bucket{model_name="tiny-test",le="3600"}`,
		`resin_request_queue_time_seconds_count{model_name="tiny-test"} 1`,
		`resin_request_prefill_time_seconds_count{model_name="tiny-test"} 1`,
		`resin_request_decode_time_seconds_count{model_name="tiny-test"} 1`,
		`resin_request_inference_time_seconds_count{model_name="tiny-test"} 1`,
		`resin_request_prompt_tokens_count{model_name="tiny-test"} 1`,
		`resin_request_generation_tokens_sum{model_name="tiny-test"} 3`,
		`resin_requests_running{model_name="tiny-test"}`,
		`resin_http_requests_total{code="200",model_name="tiny-test",route="/v1/completions"} 1`,
		"process_resident_memory_bytes ",
		"process_open_fds ",
		"go_goroutines ",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	for _, line := range strings.Split(body, "\n") {
		if strings.HasPrefix(line, "resin_") && !strings.Contains(line, `model_name="tiny-test"`) {
			t.Errorf("resin_ metric without model_name: %s", line)
			break
		}
	}
}
