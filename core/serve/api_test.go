package serve

import (
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"testing"
)

type completionOut struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Index        int     `json:"index"`
		Text         string  `json:"text"`
		FinishReason *string `json:"finish_reason"`
		Logprobs     *struct {
			Tokens        []string             `json:"tokens"`
			TokenLogprobs []float32            `json:"token_logprobs"`
			TopLogprobs   []map[string]float32 `json:"top_logprobs"`
		} `json:"logprobs"`
	} `json:"choices"`
	Usage *usageJSON `json:"usage"`
}

type chatOut struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Choices []struct {
		Message struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		Delta struct {
			Role    string  `json:"role"`
			Content *string `json:"content"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
		Logprobs     *struct {
			Content []struct {
				Token       string  `json:"token"`
				Logprob     float32 `json:"logprob"`
				Bytes       []int   `json:"bytes"`
				TopLogprobs []struct {
					Token   string  `json:"token"`
					Logprob float32 `json:"logprob"`
				} `json:"top_logprobs"`
			} `json:"content"`
		} `json:"logprobs"`
	} `json:"choices"`
	Usage *usageJSON `json:"usage"`
}

func TestCompletionMatchesRunnerReference(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	prompt := "The quick brown fox"
	ids, _ := h.tok.Encode(prompt, true)
	toks, text := h.reference(ids, 40)
	var out completionOut
	h.postJSON("/v1/completions", map[string]any{"model": "tiny-test", "prompt": prompt, "max_tokens": 40, "temperature": 0}, 200, &out)
	if out.Object != "text_completion" || !strings.HasPrefix(out.ID, "cmpl-") || out.Model != "tiny-test" {
		t.Fatalf("envelope %+v", out)
	}
	c := out.Choices[0]
	if c.Text != text {
		t.Fatalf("text %q, want %q", c.Text, text)
	}
	wantFinish := "length"
	if toks[len(toks)-1] == h.eos && len(toks) < 40 {
		wantFinish = "stop"
	}
	if *c.FinishReason != wantFinish {
		t.Fatalf("finish %q, want %q", *c.FinishReason, wantFinish)
	}
	if out.Usage.PromptTokens != len(ids) || out.Usage.CompletionTokens != len(toks) || out.Usage.TotalTokens != len(ids)+len(toks) {
		t.Fatalf("usage %+v, want %d prompt and %d completion tokens", out.Usage, len(ids), len(toks))
	}

	// The same prompt as token ids gives the same text.
	var byIDs completionOut
	h.postJSON("/v1/completions", map[string]any{"prompt": ids, "max_tokens": 40, "temperature": 0}, 200, &byIDs)
	if byIDs.Choices[0].Text != text {
		t.Fatalf("token-id prompt gave %q, want %q", byIDs.Choices[0].Text, text)
	}
	if byIDs.Model != "tiny-test" {
		t.Fatalf("model %q", byIDs.Model)
	}
}

func TestCompletionStreamingEqualsNonStreaming(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	body := map[string]any{"prompt": "stream me", "max_tokens": 30, "temperature": 0.8, "seed": 7}
	var whole completionOut
	h.postJSON("/v1/completions", body, 200, &whole)
	body["stream"] = true
	body["stream_options"] = map[string]any{"include_usage": true}
	code, raw := h.post("/v1/completions", body)
	if code != 200 {
		t.Fatalf("status %d: %s", code, raw)
	}
	events := sseEvents(t, raw)
	if events[len(events)-1] != "[DONE]" {
		t.Fatalf("stream does not end with [DONE]: %q", events[len(events)-1])
	}
	var text strings.Builder
	var finish string
	var usage *usageJSON
	for _, e := range events[:len(events)-1] {
		var c completionOut
		if err := json.Unmarshal([]byte(e), &c); err != nil {
			t.Fatalf("%v in %s", err, e)
		}
		if c.Usage != nil {
			usage = c.Usage
			if len(c.Choices) != 0 {
				t.Fatalf("usage chunk with choices: %s", e)
			}
			continue
		}
		text.WriteString(c.Choices[0].Text)
		if c.Choices[0].FinishReason != nil {
			finish = *c.Choices[0].FinishReason
		}
	}
	if text.String() != whole.Choices[0].Text || finish != *whole.Choices[0].FinishReason {
		t.Fatalf("streamed %q (%s), non-streamed %q (%s): same seed must give the same text", text.String(), finish, whole.Choices[0].Text, *whole.Choices[0].FinishReason)
	}
	if usage == nil || !reflect.DeepEqual(usage, whole.Usage) {
		t.Fatalf("usage %+v, want %+v", usage, whole.Usage)
	}
}

func TestStopStringsCutTheText(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	ids, _ := h.tok.Encode("stop strings", true)
	_, full := h.reference(ids, 200)
	// Pick a stop string from the middle of the reference text.
	runes := []rune(full)
	if len(runes) < 20 {
		t.Fatalf("reference text too short: %q", full)
	}
	stop := string(runes[len(runes)/2 : len(runes)/2+3])
	want := full[:strings.Index(full, stop)]
	for _, stream := range []bool{false, true} {
		code, raw := h.post("/v1/completions", map[string]any{"prompt": "stop strings", "max_tokens": 200, "temperature": 0, "stop": []string{"\x00never", stop}, "stream": stream})
		if code != 200 {
			t.Fatalf("status %d: %s", code, raw)
		}
		var got, finish string
		if stream {
			for _, e := range sseEvents(t, raw) {
				if e == "[DONE]" {
					continue
				}
				var c completionOut
				_ = json.Unmarshal([]byte(e), &c)
				got += c.Choices[0].Text
				if c.Choices[0].FinishReason != nil {
					finish = *c.Choices[0].FinishReason
				}
			}
		} else {
			var c completionOut
			_ = json.Unmarshal(raw, &c)
			got, finish = c.Choices[0].Text, *c.Choices[0].FinishReason
		}
		if got != want || finish != "stop" {
			t.Fatalf("stream=%v stop %q: got %q (%s), want %q (stop)", stream, stop, got, finish, want)
		}
	}
	waitFor(t, "the stopped requests to leave the engine", func() bool { s := h.eng.Stats(); return s.Running+s.Waiting == 0 })
}

func TestStopTokenIDs(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	ids, _ := h.tok.Encode("ids", true)
	toks, _ := h.reference(ids, 50)
	stopAt := 5
	stopID := toks[stopAt]
	if slices.Index(toks, stopID) < stopAt {
		stopAt = slices.Index(toks, stopID)
	}
	var out completionOut
	h.postJSON("/v1/completions", map[string]any{"prompt": ids, "max_tokens": 50, "temperature": 0, "stop_token_ids": []int32{stopID}}, 200, &out)
	want := h.tok.Decode(toks[:stopAt], true)
	if out.Choices[0].Text != want || *out.Choices[0].FinishReason != "stop" || out.Usage.CompletionTokens != stopAt+1 {
		t.Fatalf("got %q (%s, %d tokens), want %q (stop, %d tokens)", out.Choices[0].Text, *out.Choices[0].FinishReason, out.Usage.CompletionTokens, want, stopAt+1)
	}
}

func TestChatAndStreamingChat(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	msgs := []map[string]any{{"role": "system", "content": "Be brief."}, {"role": "user", "content": []map[string]any{{"type": "text", "text": "Hi there"}}}}
	prompt, err := h.srv.chat.Render([]map[string]any{{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}}, chatOpts())
	if err != nil {
		t.Fatal(err)
	}
	ids, _ := h.tok.Encode(prompt, false)
	_, want := h.reference(ids, 25)
	var out chatOut
	h.postJSON("/v1/chat/completions", map[string]any{"model": "tiny-test", "messages": msgs, "max_completion_tokens": 25, "temperature": 0, "logprobs": true, "top_logprobs": 3}, 200, &out)
	if out.Object != "chat.completion" || out.Choices[0].Message.Role != "assistant" || out.Choices[0].Message.Content != want {
		t.Fatalf("chat %+v, want content %q", out, want)
	}
	lp := out.Choices[0].Logprobs
	if lp == nil || len(lp.Content) != out.Usage.CompletionTokens {
		t.Fatalf("logprobs %+v for %d tokens", lp, out.Usage.CompletionTokens)
	}
	for _, c := range lp.Content {
		if c.Logprob > 0 || len(c.TopLogprobs) != 3 || c.TopLogprobs[0].Logprob < c.Logprob {
			t.Fatalf("implausible logprob entry %+v (greedy picks the top token)", c)
		}
	}
	if out.Usage.PromptTokens != len(ids) {
		t.Fatalf("prompt tokens %d, want %d", out.Usage.PromptTokens, len(ids))
	}

	code, raw := h.post("/v1/chat/completions", map[string]any{"messages": msgs, "max_tokens": 25, "temperature": 0, "stream": true})
	if code != 200 {
		t.Fatalf("status %d: %s", code, raw)
	}
	events := sseEvents(t, raw)
	var text strings.Builder
	var finish string
	for i, e := range events {
		if e == "[DONE]" {
			if i != len(events)-1 {
				t.Fatal("[DONE] before the end")
			}
			continue
		}
		var c chatOut
		if err := json.Unmarshal([]byte(e), &c); err != nil {
			t.Fatal(err)
		}
		if c.Object != "chat.completion.chunk" || c.ID != strings.Split(events[0], `"`)[3] {
			t.Fatalf("chunk %s", e)
		}
		d := c.Choices[0].Delta
		if i == 0 && d.Role != "assistant" {
			t.Fatalf("first chunk must carry the role: %s", e)
		}
		if d.Content != nil {
			text.WriteString(*d.Content)
		}
		if c.Choices[0].FinishReason != nil {
			finish = *c.Choices[0].FinishReason
		}
	}
	if text.String() != want || finish != *out.Choices[0].FinishReason {
		t.Fatalf("streamed %q (%s), want %q (%s)", text.String(), finish, want, *out.Choices[0].FinishReason)
	}
}

func TestCompletionLogprobs(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	var out completionOut
	h.postJSON("/v1/completions", map[string]any{"prompt": "lp", "max_tokens": 6, "temperature": 0, "logprobs": 2, "ignore_eos": true}, 200, &out)
	lp := out.Choices[0].Logprobs
	if lp == nil || len(lp.Tokens) != 6 || len(lp.TokenLogprobs) != 6 || len(lp.TopLogprobs) != 6 {
		t.Fatalf("logprobs %+v", lp)
	}
	if strings.Join(lp.Tokens, "") != out.Choices[0].Text {
		t.Fatalf("tokens %q do not spell the text %q", lp.Tokens, out.Choices[0].Text)
	}
}

func TestErrors(t *testing.T) {
	h := newHarness(t, harnessOpts{runner: smallRunner()})
	long := make([]int, 300)
	for _, c := range []struct {
		name, path string
		body       any
		status     int
		code       string
	}{
		{"bad json", "/v1/completions", []byte(`{"prompt": `), 400, ""},
		{"wrong type", "/v1/completions", []byte(`{"prompt": "x", "max_tokens": "many"}`), 400, ""},
		{"unknown model", "/v1/completions", map[string]any{"model": "gpt-9", "prompt": "x"}, 404, "model_not_found"},
		{"unknown model chat", "/v1/chat/completions", map[string]any{"model": "gpt-9", "messages": []any{map[string]any{"role": "user", "content": "x"}}}, 404, "model_not_found"},
		{"n=0", "/v1/completions", map[string]any{"prompt": "x", "n": 0}, 400, ""},
		{"max_tokens 0", "/v1/completions", map[string]any{"prompt": "x", "max_tokens": 0}, 400, ""},
		{"temperature", "/v1/completions", map[string]any{"prompt": "x", "temperature": 5}, 400, ""},
		{"empty stop", "/v1/completions", map[string]any{"prompt": "x", "stop": ""}, 400, ""},
		{"token outside vocab", "/v1/completions", map[string]any{"prompt": []int{1, 999999}}, 400, ""},
		{"context too long", "/v1/completions", map[string]any{"prompt": long, "max_tokens": 10}, 400, "context_length_exceeded"},
		{"no messages", "/v1/chat/completions", map[string]any{"messages": []any{}}, 400, ""},
		{"bad role", "/v1/chat/completions", map[string]any{"messages": []any{map[string]any{"role": "wizard", "content": "x"}}}, 400, ""},
		{"image part", "/v1/chat/completions", map[string]any{"messages": []any{map[string]any{"role": "user", "content": []any{map[string]any{"type": "image_url"}}}}}, 400, ""},
		{"penalty", "/v1/completions", map[string]any{"prompt": "x", "presence_penalty": 3}, 400, ""},
		{"no route", "/v1/embeddings", map[string]any{"input": "x"}, 404, "not_found"},
	} {
		code, raw := h.post(c.path, c.body)
		var e errorResp
		if err := json.Unmarshal(raw, &e); err != nil || e.Error.Message == "" || e.Error.Type == "" {
			t.Errorf("%s: body %s is not an OpenAI error (%v)", c.name, raw, err)
			continue
		}
		if code != c.status {
			t.Errorf("%s: status %d, want %d: %s", c.name, code, c.status, raw)
		}
		if c.code != "" && (e.Error.Code == nil || *e.Error.Code != c.code) {
			t.Errorf("%s: code %v, want %s", c.name, e.Error.Code, c.code)
		}
	}
	// The server keeps serving after all of that.
	var out completionOut
	h.postJSON("/v1/completions", map[string]any{"prompt": "still alive", "max_tokens": 3}, 200, &out)
}

func TestModelsHealthMetrics(t *testing.T) {
	h := newHarness(t, harnessOpts{cfg: func(c *Config) { c.Aliases = []string{"alias"} }})
	resp, err := http.Get(h.ts.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var list struct {
		Object string      `json:"object"`
		Data   []modelCard `json:"data"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&list)
	resp.Body.Close()
	if list.Object != "list" || len(list.Data) != 1 || list.Data[0].ID != "tiny-test" || list.Data[0].Object != "model" {
		t.Fatalf("models %+v", list)
	}
	for path, want := range map[string]int{"/v1/models/tiny-test": 200, "/v1/models/alias": 200, "/v1/models/nope": 404, "/health": 200} {
		resp, err := http.Get(h.ts.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("GET %s: %d, want %d", path, resp.StatusCode, want)
		}
	}
	h.postJSON("/v1/completions", map[string]any{"model": "alias", "prompt": "m", "max_tokens": 2}, 200, nil)
	resp, err = http.Get(h.ts.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	_, _ = fmt.Fprint(&b, readAll(t, resp))
	for _, name := range []string{"resin_http_requests_total{code=\"200\",model_name=\"tiny-test\",route=\"/v1/completions\"} 1", "resin_"} {
		if !strings.Contains(b.String(), name) {
			t.Fatalf("metrics lack %q:\n%s", name, b.String())
		}
	}
}

func TestCompletionEcho(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	var plain, echoed completionOut
	h.postJSON("/v1/completions", map[string]any{"prompt": "Echo this", "max_tokens": 5, "temperature": 0}, 200, &plain)
	h.postJSON("/v1/completions", map[string]any{"prompt": "Echo this", "max_tokens": 5, "temperature": 0, "echo": true}, 200, &echoed)
	if echoed.Choices[0].Text != "Echo this"+plain.Choices[0].Text {
		t.Fatalf("echo gave %q, want the prompt then %q", echoed.Choices[0].Text, plain.Choices[0].Text)
	}
}

// Every response and stream chunk starts with the envelope OpenAI clients read: id,
// object, created, model and system_fingerprint.
func TestResponseEnvelope(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	check := func(what, object string, raw []byte) {
		t.Helper()
		var env struct {
			ID                string `json:"id"`
			Object            string `json:"object"`
			Created           int64  `json:"created"`
			Model             string `json:"model"`
			SystemFingerprint string `json:"system_fingerprint"`
		}
		if err := json.Unmarshal(raw, &env); err != nil {
			t.Fatalf("%s: %v: %s", what, err, raw)
		}
		if env.ID == "" || env.Object != object || env.Created == 0 || env.Model != "tiny-test" || env.SystemFingerprint != "resin" {
			t.Errorf("%s: envelope %+v, want object %q, model tiny-test, fingerprint resin, an id and a time", what, env, object)
		}
	}
	prompt := map[string]any{"model": "tiny-test", "prompt": "Hello", "max_tokens": 3}
	chat := map[string]any{"model": "tiny-test", "messages": []map[string]string{{"role": "user", "content": "Hello"}}, "max_tokens": 3}
	_, raw := h.post("/v1/completions", prompt)
	check("completion", "text_completion", raw)
	_, raw = h.post("/v1/chat/completions", chat)
	check("chat", "chat.completion", raw)
	for _, c := range []struct {
		path, object string
		body         map[string]any
	}{{"/v1/completions", "text_completion", prompt}, {"/v1/chat/completions", "chat.completion.chunk", chat}} {
		c.body["stream"] = true
		c.body["stream_options"] = map[string]any{"include_usage": true}
		_, raw := h.post(c.path, c.body)
		events := sseEvents(t, raw)
		for _, ev := range events[:len(events)-1] { // the last is [DONE]
			check(c.path+" chunk", c.object, []byte(ev))
		}
	}
}
