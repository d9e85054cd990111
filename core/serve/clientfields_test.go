package serve

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/resin-llm/resin/core/engine/enginetest"
	"github.com/resin-llm/resin/core/tokenizer"
)

// syncBuffer is a log destination the handlers' goroutines may share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// take returns what was logged since the last take.
func (s *syncBuffer) take() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.b.String()
	s.b.Reset()
	return out
}

// clientResp is the part of completion and chat answers the field tests read.
type clientResp struct {
	Choices []struct {
		Index   int    `json:"index"`
		Text    string `json:"text"`
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
			Tokens        []string             `json:"tokens"`
			TokenLogprobs []*float32           `json:"token_logprobs"`
			TopLogprobs   []map[string]float32 `json:"top_logprobs"`
			TextOffset    []int                `json:"text_offset"`
			Content       []struct {
				Token       string `json:"token"`
				Bytes       []int  `json:"bytes"`
				TopLogprobs []struct {
					Token string `json:"token"`
				} `json:"top_logprobs"`
			} `json:"content"`
		} `json:"logprobs"`
		PromptLogprobs []map[string]promptLogprob `json:"prompt_logprobs"`
	} `json:"choices"`
	Usage          *usageJSON                 `json:"usage"`
	PromptLogprobs []map[string]promptLogprob `json:"prompt_logprobs"`
}

// answer is a choice's text, whichever route gave it.
func (r clientResp) answer() string {
	if len(r.Choices) == 0 {
		return ""
	}
	return r.Choices[0].Text + r.Choices[0].Message.Content
}

func decodeResp(t *testing.T, raw []byte) clientResp {
	t.Helper()
	var r clientResp
	if err := json.Unmarshal(raw, &r); err != nil {
		t.Fatalf("%v in %s", err, raw)
	}
	return r
}

// streamed decodes an event stream's chunks (not [DONE]).
func streamed(t *testing.T, raw []byte) []clientResp {
	t.Helper()
	var out []clientResp
	for _, ev := range sseEvents(t, raw) {
		if ev != "[DONE]" {
			out = append(out, decodeResp(t, []byte(ev)))
		}
	}
	return out
}

// promptOf is the prompt the server builds for chat messages under opts.
func (h *harness) promptOf(msgs []map[string]any, opts tokenizer.ChatOptions) []int32 {
	h.t.Helper()
	text, err := h.srv.chat.Render(msgs, opts)
	if err != nil {
		h.t.Fatal(err)
	}
	ids, err := h.tok.Encode(text, false)
	if err != nil {
		h.t.Fatal(err)
	}
	return ids
}

// TestClientFields: every field the review found refused, as decided: implemented (with
// its effect checked), accepted and ignored (the answer unchanged, one warning naming
// it), or refused by name. Before, all of them were refused as unknown fields.
func TestClientFields(t *testing.T) {
	var logs syncBuffer
	h := newHarness(t, harnessOpts{cfg: func(c *Config) { c.Logger = slog.New(slog.NewTextHandler(&logs, nil)) }})
	const cmpl, chat = "/v1/completions", "/v1/chat/completions"
	prompt := []int32{5, 6, 7, 8, 9}
	user := []map[string]any{{"role": "user", "content": "hi"}}
	prefill := []map[string]any{{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure:"}}
	bases := map[string]map[string]any{
		cmpl: {"prompt": prompt, "max_tokens": 4, "temperature": 0},
		chat: {"messages": user, "max_tokens": 4, "temperature": 0},
	}
	baseline := map[string]string{}
	for path, body := range bases {
		code, raw := h.post(path, body)
		if code != 200 {
			t.Fatalf("%s: %d %s", path, code, raw)
		}
		r := decodeResp(t, raw)
		baseline[path] = r.answer()
	}
	_, userText := h.reference(h.promptOf(user, tokenizer.ChatOptions{AddGenerationPrompt: true}), 4)
	if baseline[chat] != userText {
		t.Fatalf("chat baseline %q, reference %q", baseline[chat], userText)
	}
	logs.take()

	// continuousUsage checks a stream where every chunk carries the usage so far.
	continuousUsage := func(t *testing.T, h *harness, raw []byte) {
		chunks := streamed(t, raw)
		last := 0
		for i, c := range chunks {
			if c.Usage == nil {
				t.Fatalf("chunk %d has no usage", i)
			}
			if c.Usage.CompletionTokens < last || c.Usage.TotalTokens != c.Usage.PromptTokens+c.Usage.CompletionTokens {
				t.Fatalf("chunk %d: usage %+v after %d tokens", i, c.Usage, last)
			}
			last = c.Usage.CompletionTokens
		}
		if end := chunks[len(chunks)-1]; len(end.Choices) != 0 || end.Usage.CompletionTokens != 4 || end.Usage.PromptTokensDetails == nil {
			t.Fatalf("the stream ends with %+v, want the final usage chunk (4 tokens)", end)
		}
	}
	type fieldCase struct {
		name   string
		path   string
		body   map[string]any
		want   string // "implemented", "ignored" or "refused"
		param  string // refused: the field named
		effect func(t *testing.T, h *harness, raw []byte)
	}
	cases := []fieldCase{
		{name: "continuous_usage_stats", path: chat, want: "implemented", effect: continuousUsage,
			body: map[string]any{"stream": true, "stream_options": map[string]any{"continuous_usage_stats": true}}},
		{name: "continuous_usage_stats", path: cmpl, want: "implemented", effect: continuousUsage,
			body: map[string]any{"stream": true, "stream_options": map[string]any{"include_usage": true, "continuous_usage_stats": true}}},
		{name: "echo (prefill)", path: chat, want: "implemented",
			body: map[string]any{"messages": prefill, "echo": true, "continue_final_message": true},
			effect: func(t *testing.T, h *harness, raw []byte) {
				_, want := h.reference(h.promptOf(prefill, tokenizer.ChatOptions{ContinueFinalMessage: true}), 4)
				r := decodeResp(t, raw)
				if got := r.Choices[0].Message; got.Content != "Sure:"+want || got.Role != "assistant" {
					t.Errorf("message %+v, want the assistant's %q echoed before %q", got, "Sure:", want)
				}
			}},
		{name: "echo (streamed)", path: chat, want: "implemented",
			body: map[string]any{"messages": prefill, "echo": true, "continue_final_message": true, "stream": true},
			effect: func(t *testing.T, h *harness, raw []byte) {
				_, want := h.reference(h.promptOf(prefill, tokenizer.ChatOptions{ContinueFinalMessage: true}), 4)
				var content []string
				for _, c := range streamed(t, raw) {
					if c.Choices[0].Delta.Content != nil && *c.Choices[0].Delta.Content != "" {
						content = append(content, *c.Choices[0].Delta.Content)
					}
				}
				if len(content) == 0 || content[0] != "Sure:" || strings.Join(content, "") != "Sure:"+want {
					t.Errorf("streamed content %q, want %q first, then %q", content, "Sure:", want)
				}
			}},
		{name: "echo (other role)", path: chat, want: "implemented", body: map[string]any{"echo": true},
			effect: func(t *testing.T, h *harness, raw []byte) {
				if r := decodeResp(t, raw); r.answer() != baseline[chat] {
					t.Errorf("%q: the last message is the user's, nothing to echo; want %q", r.answer(), baseline[chat])
				}
			}},
		{name: "add_generation_prompt", path: chat, want: "implemented", body: map[string]any{"add_generation_prompt": false},
			effect: func(t *testing.T, h *harness, raw []byte) {
				_, want := h.reference(h.promptOf(user, tokenizer.ChatOptions{}), 4)
				r := decodeResp(t, raw)
				// Without a generation prompt the answer continues the last turn, in its role (vLLM).
				if got := r.Choices[0].Message; got.Content != want || got.Role != "user" {
					t.Errorf("message %+v, want the user's turn continued: %q", got, want)
				}
			}},
		{name: "continue_final_message", path: chat, want: "implemented", body: map[string]any{"messages": prefill, "continue_final_message": true},
			effect: func(t *testing.T, h *harness, raw []byte) {
				ids := h.promptOf(prefill, tokenizer.ChatOptions{ContinueFinalMessage: true})
				_, want := h.reference(ids, 4)
				r := decodeResp(t, raw)
				if r.answer() != want || r.Usage.PromptTokens != len(ids) {
					t.Errorf("%q (%d prompt tokens), want %q on the open message (%d)", r.answer(), r.Usage.PromptTokens, want, len(ids))
				}
			}},
		{name: "continue_final_message with add_generation_prompt", path: chat, want: "refused", param: "continue_final_message",
			body: map[string]any{"messages": prefill, "continue_final_message": true, "add_generation_prompt": true}},
		{name: "prompt_logprobs", path: cmpl, want: "implemented", body: map[string]any{"prompt_logprobs": 2},
			effect: func(t *testing.T, h *harness, raw []byte) {
				r := decodeResp(t, raw)
				checkPromptLogprobs(t, h, prompt, r.Choices[0].PromptLogprobs, 2)
				if r.Choices[0].Logprobs != nil {
					t.Errorf("logprobs %+v, not asked for", r.Choices[0].Logprobs)
				}
			}},
		{name: "prompt_logprobs with echo", path: cmpl, want: "implemented", body: map[string]any{"prompt_logprobs": 3, "echo": true, "logprobs": 1},
			effect: func(t *testing.T, h *harness, raw []byte) {
				// The engine computes 3 alternatives for both; logprobs shows 1.
				r := decodeResp(t, raw)
				checkPromptLogprobs(t, h, prompt, r.Choices[0].PromptLogprobs, 3)
				lp := r.Choices[0].Logprobs
				if len(lp.TopLogprobs) != len(prompt)+4 || lp.TopLogprobs[0] != nil {
					t.Fatalf("%d top_logprobs entries, want the prompt's and 4 generated, null first", len(lp.TopLogprobs))
				}
				for i, m := range lp.TopLogprobs[1:] {
					if len(m) != 1 {
						t.Fatalf("entry %d lists %d alternatives, want logprobs' 1", i+1, len(m))
					}
				}
			}},
		{name: "prompt_logprobs", path: chat, want: "implemented", body: map[string]any{"prompt_logprobs": 0},
			effect: func(t *testing.T, h *harness, raw []byte) {
				r := decodeResp(t, raw)
				checkPromptLogprobs(t, h, h.promptOf(user, tokenizer.ChatOptions{AddGenerationPrompt: true}), r.PromptLogprobs, 0)
			}},
		{name: "prompt_logprobs with stream", path: cmpl, want: "refused", param: "prompt_logprobs", body: map[string]any{"prompt_logprobs": 1, "stream": true}},
		{name: "add_special_tokens", path: cmpl, want: "implemented", body: map[string]any{"prompt": "hello world", "add_special_tokens": false},
			effect: func(t *testing.T, h *harness, raw []byte) {
				plain, _ := h.tok.Encode("hello world", false)
				withBOS, _ := h.tok.Encode("hello world", true)
				if r := decodeResp(t, raw); r.Usage.PromptTokens != len(plain) || len(withBOS) != len(plain)+1 {
					t.Errorf("%d prompt tokens, want %d (without BOS; %d with)", r.Usage.PromptTokens, len(plain), len(withBOS))
				}
			}},
		{name: "add_special_tokens", path: chat, want: "implemented", body: map[string]any{"add_special_tokens": true},
			effect: func(t *testing.T, h *harness, raw []byte) {
				ids := h.promptOf(user, tokenizer.ChatOptions{AddGenerationPrompt: true})
				if r := decodeResp(t, raw); r.Usage.PromptTokens != len(ids)+1 {
					t.Errorf("%d prompt tokens, want the template's %d and BOS", r.Usage.PromptTokens, len(ids))
				}
			}},
		{name: "return_tokens_as_token_ids", path: cmpl, want: "implemented", body: map[string]any{"logprobs": 1, "return_tokens_as_token_ids": true},
			effect: func(t *testing.T, h *harness, raw []byte) {
				toks, text := h.reference(prompt, 4)
				lp := decodeResp(t, raw).Choices[0].Logprobs
				offset := 0
				for i, tok := range lp.Tokens {
					if tok != fmt.Sprintf("token_id:%d", toks[i]) || lp.TextOffset[i] != offset {
						t.Fatalf("token %d: %q at %d, want token_id:%d at %d", i, tok, lp.TextOffset[i], toks[i], offset)
					}
					for k := range lp.TopLogprobs[i] {
						if !strings.HasPrefix(k, "token_id:") {
							t.Fatalf("top logprob %q is not shown as an id", k)
						}
					}
					offset += len(h.tok.Decode(toks[i:i+1], false))
				}
				if len(lp.Tokens) == 0 || offset > len(text)+8 {
					t.Fatalf("%d tokens", len(lp.Tokens))
				}
			}},
		{name: "return_tokens_as_token_ids", path: chat, want: "implemented", body: map[string]any{"logprobs": true, "top_logprobs": 1, "return_tokens_as_token_ids": true},
			effect: func(t *testing.T, h *harness, raw []byte) {
				toks, _ := h.reference(h.promptOf(user, tokenizer.ChatOptions{AddGenerationPrompt: true}), 4)
				for i, e := range decodeResp(t, raw).Choices[0].Logprobs.Content {
					want := fmt.Sprintf("token_id:%d", toks[i])
					if e.Token != want || len(e.Bytes) != len(want) || len(e.TopLogprobs) != 1 || !strings.HasPrefix(e.TopLogprobs[0].Token, "token_id:") {
						t.Fatalf("entry %d: %+v, want %s", i, e, want)
					}
				}
			}},
		{name: "parallel_tool_calls", path: chat, want: "implemented", body: map[string]any{"parallel_tool_calls": true}},
		// Fields that change nothing this server outputs.
		{name: "store", path: chat, want: "ignored", body: map[string]any{"store": true}},
		{name: "metadata", path: chat, want: "ignored", body: map[string]any{"metadata": map[string]any{"team": "a"}}},
		{name: "metadata", path: cmpl, want: "ignored", body: map[string]any{"metadata": map[string]any{"team": "a"}}},
		{name: "service_tier", path: chat, want: "ignored", body: map[string]any{"service_tier": "auto"}},
		{name: "prompt_cache_key", path: chat, want: "ignored", body: map[string]any{"prompt_cache_key": "k1"}},
		{name: "prompt_cache_retention", path: chat, want: "ignored", body: map[string]any{"prompt_cache_retention": "24h"}},
		{name: "safety_identifier", path: cmpl, want: "ignored", body: map[string]any{"safety_identifier": "u-1"}},
		{name: "reasoning_effort", path: chat, want: "implemented", body: map[string]any{"reasoning_effort": "low"}},
		// What the server does anyway: accepted, nothing to warn about.
		{name: "prediction", path: chat, want: "implemented", body: map[string]any{"prediction": nil}},
		{name: "audio", path: chat, want: "implemented", body: map[string]any{"audio": nil}},
		{name: "modalities", path: chat, want: "implemented", body: map[string]any{"modalities": []string{"text"}}},
		{name: "functions", path: chat, want: "implemented", body: map[string]any{"functions": nil, "function_call": nil}},
		{name: "user", path: chat, want: "implemented", body: map[string]any{"user": "u-1"}},
		// Fields whose meaning would be lost if ignored.
		{name: "prediction", path: chat, want: "refused", param: "prediction", body: map[string]any{"prediction": map[string]any{"type": "content", "content": "x"}}},
		{name: "audio", path: chat, want: "refused", param: "audio", body: map[string]any{"audio": map[string]any{"voice": "alloy", "format": "wav"}}},
		{name: "modalities", path: chat, want: "refused", param: "modalities", body: map[string]any{"modalities": []string{"text", "audio"}}},
		{name: "functions", path: chat, want: "refused", param: "functions", body: map[string]any{"functions": []any{map[string]any{"name": "f"}}}},
		{name: "function_call", path: chat, want: "refused", param: "function_call", body: map[string]any{"function_call": "auto"}},
	}
	for _, c := range cases {
		body := maps.Clone(bases[c.path])
		maps.Copy(body, c.body)
		code, raw := h.post(c.path, body)
		logged := logs.take()
		label := c.path + " " + c.name
		switch c.want {
		case "refused":
			var e errorResp
			if err := json.Unmarshal(raw, &e); err != nil || code != 400 || e.Error.Param == nil || *e.Error.Param != c.param {
				t.Errorf("%s: status %d %s, want 400 naming %s", label, code, raw, c.param)
			}
			continue
		case "ignored":
			if code != 200 {
				t.Errorf("%s: status %d %s, want it accepted", label, code, raw)
				continue
			}
			if got := decodeResp(t, raw).answer(); got != baseline[c.path] {
				t.Errorf("%s: answer %q, want the answer without it, %q", label, got, baseline[c.path])
			}
			if strings.Count(logged, "level=WARN") != 1 || !strings.Contains(logged, c.name) {
				t.Errorf("%s: logged %q, want one warning naming it", label, logged)
			}
		case "implemented":
			if code != 200 {
				t.Errorf("%s: status %d %s, want it served", label, code, raw)
				continue
			}
			if strings.Contains(logged, "level=WARN") {
				t.Errorf("%s: logged %q, want no warning for a field served", label, logged)
			}
			if c.effect != nil {
				t.Run(strings.ReplaceAll(label, " ", "_"), func(t *testing.T) { c.effect(t, h, raw) })
			} else if !strings.Contains(string(raw), "data:") {
				if got := decodeResp(t, raw).answer(); got != baseline[c.path] {
					t.Errorf("%s: answer %q, want %q", label, got, baseline[c.path])
				}
			}
		}
	}
	h.stopAndCheck("client fields")
}

// checkPromptLogprobs checks vLLM's prompt_logprobs for prompt: null first, then each
// later token's logprob as the test runner scores it, with top alternatives.
func checkPromptLogprobs(t *testing.T, h *harness, prompt []int32, got []map[string]promptLogprob, top int) {
	t.Helper()
	want := enginetest.PromptLogprobs(h.tok.VocabSize(), prompt, top)
	if len(got) != len(prompt) || got[0] != nil {
		t.Fatalf("%d entries (first %v) for a prompt of %d, want null first", len(got), got[0], len(prompt))
	}
	for k, w := range want {
		e, ok := got[k+1][strconv.Itoa(int(w.Token))]
		if !ok || e.Logprob != w.Logprob || len(got[k+1]) > top+1 || len(got[k+1]) < max(top, 1) {
			t.Fatalf("position %d: %v, want token %d at %v among %d alternatives", k+1, got[k+1], w.Token, w.Logprob, top)
		}
		if text, _ := h.srv.tokenText(w.Token); e.DecodedToken != text {
			t.Fatalf("position %d: decoded %q, want %q", k+1, e.DecodedToken, text)
		}
		for i, alt := range w.Top {
			if a := got[k+1][strconv.Itoa(int(alt.Token))]; a.Rank == nil || *a.Rank != i+1 {
				t.Fatalf("position %d: alternative %d has rank %v", k+1, alt.Token, a.Rank)
			}
		}
	}
}

// TestParallelToolCallsFalse: with parallel_tool_calls false an answer that calls two
// tools keeps the first, whole and streamed (vLLM drops the others the same way).
func TestParallelToolCallsFalse(t *testing.T) {
	two := "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n" +
		"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call>"
	h := newToolHarness(t, two, "hermes", "")
	for _, parallel := range []bool{true, false} {
		body := map[string]any{"messages": []map[string]any{{"role": "user", "content": "Weather?"}},
			"tools": []json.RawMessage{weatherTool}, "max_tokens": 200, "parallel_tool_calls": parallel}
		want := 2
		if !parallel {
			want = 1
		}
		var resp toolChatResponse
		h.postJSON("/v1/chat/completions", body, 200, &resp)
		c := resp.Choices[0]
		if len(c.Message.ToolCalls) != want || c.Message.ToolCalls[0].Function.Arguments != `{"city": "Paris"}` || c.FinishReason != "tool_calls" {
			t.Errorf("parallel %v: %d calls %+v (finish %s), want %d, Paris first", parallel, len(c.Message.ToolCalls), c.Message.ToolCalls, c.FinishReason, want)
		}
		body["stream"] = true
		code, raw := h.post("/v1/chat/completions", body)
		if code != 200 {
			t.Fatalf("stream: %d %s", code, raw)
		}
		indices := map[int]bool{}
		for _, ev := range sseEvents(t, raw) {
			if ev == "[DONE]" {
				continue
			}
			var chunk struct {
				Choices []struct {
					Delta toolMessage `json:"delta"`
				} `json:"choices"`
			}
			if err := json.Unmarshal([]byte(ev), &chunk); err != nil {
				t.Fatal(err)
			}
			for _, ch := range chunk.Choices {
				for _, tc := range ch.Delta.ToolCalls {
					indices[*tc.Index] = true
				}
			}
		}
		if len(indices) != want {
			t.Errorf("parallel %v: streamed calls %v, want %d", parallel, indices, want)
		}
	}
}

// TestEchoWithoutGeneration: max_tokens 0 with echo (lm-eval's loglikelihood requests)
// returns the prompt and its logprobs and no generated token, whole and streamed. It was
// refused (max_tokens must be at least 1). Without echo max_tokens 0 is still refused.
func TestEchoWithoutGeneration(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	prompt := []int32{5, 6, 7, 8, 9}
	text := h.tok.Decode(prompt, false)
	want := enginetest.PromptLogprobs(h.tok.VocabSize(), prompt, 1)
	body := map[string]any{"prompt": prompt, "echo": true, "logprobs": 1, "max_tokens": 0, "temperature": 0}
	check := func(label, gotText string, lps []*float32, finish string, u *usageJSON) {
		t.Helper()
		if gotText != text || finish != "length" {
			t.Errorf("%s: %q (finish %s), want the prompt %q alone", label, gotText, finish, text)
		}
		if len(lps) != len(prompt) || lps[0] != nil {
			t.Fatalf("%s: %d logprobs, want the prompt's %d, null first", label, len(lps), len(prompt))
		}
		for k, w := range want {
			if *lps[k+1] != w.Logprob {
				t.Errorf("%s: position %d logprob %v, want %v", label, k+1, *lps[k+1], w.Logprob)
			}
		}
		if u != nil && (u.CompletionTokens != 0 || u.PromptTokens != len(prompt)) {
			t.Errorf("%s: usage %+v, want %d prompt tokens and none generated", label, u, len(prompt))
		}
	}
	code, raw := h.post("/v1/completions", body)
	if code != 200 {
		t.Fatalf("status %d %s", code, raw)
	}
	r := decodeResp(t, raw)
	check("whole", r.Choices[0].Text, r.Choices[0].Logprobs.TokenLogprobs, *r.Choices[0].FinishReason, r.Usage)

	body["stream"] = true
	body["stream_options"] = map[string]any{"include_usage": true}
	code, raw = h.post("/v1/completions", body)
	if code != 200 {
		t.Fatalf("stream: status %d %s", code, raw)
	}
	var gotText, finish string
	var lps []*float32
	var usage *usageJSON
	for _, c := range streamed(t, raw) {
		usage = c.Usage
		for _, ch := range c.Choices {
			gotText += ch.Text
			if ch.Logprobs != nil {
				lps = append(lps, ch.Logprobs.TokenLogprobs...)
			}
			if ch.FinishReason != nil {
				finish = *ch.FinishReason
			}
		}
	}
	check("streamed", gotText, lps, finish, usage)

	for _, b := range []map[string]any{{"prompt": prompt, "max_tokens": 0}, {"prompt": prompt, "echo": true, "max_tokens": 0, "min_tokens": 1}} {
		code, raw := h.post("/v1/completions", b)
		if code != 400 {
			t.Errorf("%v: status %d %s, want 400", b, code, raw)
		}
	}
	h.stopAndCheck("echo without generation")
}
