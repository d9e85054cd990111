package serve

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/engine/enginetest"
	"github.com/resin-llm/resin/core/tokenizer"
)

// respObject is the part of a response object the tests read.
type respObject struct {
	ID                string `json:"id"`
	Object            string `json:"object"`
	Status            string `json:"status"`
	IncompleteDetails *struct {
		Reason string `json:"reason"`
	} `json:"incomplete_details"`
	Output []struct {
		Type    string `json:"type"`
		ID      string `json:"id"`
		Role    string `json:"role"`
		Status  string `json:"status"`
		Name    string `json:"name"`
		CallID  string `json:"call_id"`
		Args    string `json:"arguments"`
		Content []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"content"`
	} `json:"output"`
	Usage struct {
		InputTokens  int `json:"input_tokens"`
		OutputTokens int `json:"output_tokens"`
		TotalTokens  int `json:"total_tokens"`
	} `json:"usage"`
}

// /v1/responses answers what the equivalent chat completion answers: instructions as the
// system message and input items as the turns, max_output_tokens as max_tokens (a cut
// answer is "incomplete" with reason max_output_tokens), the same text and usage.
func TestResponsesMatchChat(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	var chat chatAnswer
	var chatUsage struct {
		Usage usageJSON `json:"usage"`
	}
	msgs := []any{map[string]any{"role": "system", "content": "Be brief."}, map[string]any{"role": "user", "content": "Hello there"},
		map[string]any{"role": "assistant", "content": "Hi."}, map[string]any{"role": "user", "content": "And now?"}}
	req := map[string]any{"messages": msgs, "max_tokens": 6, "temperature": 0.8, "seed": 7}
	h.postJSON("/v1/chat/completions", req, 200, &chat)
	_, raw := h.post("/v1/chat/completions", req)
	_ = json.Unmarshal(raw, &chatUsage)

	var r respObject
	h.postJSON("/v1/responses", map[string]any{"instructions": "Be brief.", "max_output_tokens": 6, "temperature": 0.8, "seed": 7,
		"input": []any{
			map[string]any{"role": "user", "content": "Hello there"},
			map[string]any{"type": "message", "role": "assistant", "content": []any{map[string]any{"type": "output_text", "text": "Hi."}}},
			map[string]any{"role": "user", "content": []any{map[string]any{"type": "input_text", "text": "And "}, map[string]any{"type": "input_text", "text": "now?"}}},
		}}, 200, &r)
	if r.Object != "response" || !strings.HasPrefix(r.ID, "resp_") || len(r.Output) != 1 || r.Output[0].Type != "message" ||
		r.Output[0].Role != "assistant" || len(r.Output[0].Content) != 1 || r.Output[0].Content[0].Type != "output_text" {
		t.Fatalf("response shape: %+v", r)
	}
	if got, want := r.Output[0].Content[0].Text, *chat.Choices[0].Message.Content; got != want {
		t.Errorf("text %q, chat gave %q", got, want)
	}
	if r.Usage.InputTokens != chatUsage.Usage.PromptTokens || r.Usage.OutputTokens != chatUsage.Usage.CompletionTokens || r.Usage.TotalTokens != chatUsage.Usage.TotalTokens {
		t.Errorf("usage %+v, chat's %+v", r.Usage, chatUsage.Usage)
	}
	if chat.Choices[0].FinishReason == "length" && (r.Status != "incomplete" || r.IncompleteDetails == nil || r.IncompleteDetails.Reason != "max_output_tokens") {
		t.Errorf("cut answer: status %q, details %+v", r.Status, r.IncompleteDetails)
	}
	// A string input is one user turn.
	var s respObject
	h.postJSON("/v1/responses", map[string]any{"input": "What is the weather?", "max_output_tokens": 4, "temperature": 0}, 200, &s)
	h.postJSON("/v1/chat/completions", map[string]any{"messages": userMsg, "max_tokens": 4, "temperature": 0}, 200, &chat)
	if s.Output[0].Content[0].Text != *chat.Choices[0].Message.Content {
		t.Errorf("string input: %q, chat %q", s.Output[0].Content[0].Text, *chat.Choices[0].Message.Content)
	}
	h.stopAndCheck("responses")
}

// A forced function tool answers with a function_call item whose arguments validate;
// tools are the Responses API's flat {type, name, parameters}.
func TestResponsesFunctionCall(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	tools := []any{map[string]any{"type": "function", "name": "get_weather", "description": "Weather at a place", "parameters": json.RawMessage(weatherParams)}}
	var r respObject
	h.postJSON("/v1/responses", map[string]any{"input": "What is the weather?", "tools": tools, "temperature": 1, "seed": 3,
		"tool_choice": map[string]any{"type": "function", "name": "get_weather"}, "max_output_tokens": 400}, 200, &r)
	if len(r.Output) != 1 || r.Output[0].Type != "function_call" || r.Output[0].Name != "get_weather" || r.Output[0].CallID == "" || r.Status != "completed" {
		t.Fatalf("forced call: %+v", r)
	}
	checkWeather(t, r.Output[0].Args)
	// The call and its output sent back as items reach the template as the assistant's call
	// and a tool turn.
	code, raw := h.post("/v1/responses", map[string]any{"tools": tools, "max_output_tokens": 3, "input": []any{
		map[string]any{"role": "user", "content": "What is the weather?"},
		map[string]any{"type": "function_call", "call_id": r.Output[0].CallID, "name": "get_weather", "arguments": r.Output[0].Args},
		map[string]any{"type": "function_call_output", "call_id": r.Output[0].CallID, "output": "Sunny"},
	}})
	if code != 200 {
		t.Errorf("tool round trip: %d %s", code, raw)
	}
	h.stopAndCheck("responses tools")
}

// Streamed, the events are the Responses API's, in order, with increasing sequence
// numbers; the deltas add up to the text the unstreamed answer gives, and
// response.completed carries the whole response with its usage.
func TestResponsesStream(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	body := map[string]any{"input": "Tell me a story", "max_output_tokens": 12, "temperature": 0.7, "seed": 11}
	var plain respObject
	h.postJSON("/v1/responses", body, 200, &plain)
	body["stream"] = true
	code, raw := h.post("/v1/responses", body)
	if code != 200 {
		t.Fatalf("stream: %d %s", code, raw)
	}
	var types []string
	var text strings.Builder
	var done respObject
	var doneItem string
	for i, ev := range sseEvents(t, raw) {
		var e struct {
			Type     string          `json:"type"`
			Seq      int             `json:"sequence_number"`
			Delta    string          `json:"delta"`
			Response json.RawMessage `json:"response"`
			Item     struct{ Status string }
		}
		if err := json.Unmarshal([]byte(ev), &e); err != nil {
			t.Fatalf("event %d %q: %v", i, ev, err)
		}
		if e.Seq != i {
			t.Errorf("event %d has sequence_number %d", i, e.Seq)
		}
		if len(types) == 0 || types[len(types)-1] != e.Type {
			types = append(types, e.Type)
		}
		switch e.Type {
		case "response.output_text.delta":
			text.WriteString(e.Delta)
		case "response.output_item.done":
			doneItem = e.Item.Status
		case "response.completed":
			if err := json.Unmarshal(e.Response, &done); err != nil {
				t.Fatal(err)
			}
		}
	}
	want := []string{"response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
		"response.output_text.delta", "response.output_text.done", "response.content_part.done", "response.output_item.done", "response.completed"}
	if strings.Join(types, " ") != strings.Join(want, " ") {
		t.Errorf("events\n %v\nwant\n %v", types, want)
	}
	if text.String() != plain.Output[0].Content[0].Text || done.Output[0].Content[0].Text != text.String() {
		t.Errorf("streamed %q, completed %q, unstreamed %q", text.String(), done.Output[0].Content[0].Text, plain.Output[0].Content[0].Text)
	}
	if done.Usage != plain.Usage || done.Status != plain.Status || done.Status != "incomplete" {
		t.Errorf("completed usage %+v status %q, unstreamed %+v %q; want incomplete (cut at max_output_tokens)", done.Usage, done.Status, plain.Usage, plain.Status)
	}
	// The message cut at the limit is incomplete too, streamed or not.
	if done.Output[0].Status != "incomplete" || plain.Output[0].Status != "incomplete" || doneItem != "incomplete" {
		t.Errorf("message status: completed %q, unstreamed %q, output_item.done %q; want incomplete", done.Output[0].Status, plain.Output[0].Status, doneItem)
	}
	h.stopAndCheck("responses stream")
}

// What the route cannot serve is a 400 naming the Responses field, not the chat field it
// maps to.
func TestResponsesRefused(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	for _, c := range []struct {
		body  map[string]any
		param string
	}{
		{map[string]any{"input": "hi", "previous_response_id": "resp_1"}, "previous_response_id"},
		{map[string]any{"input": "hi", "background": true}, "background"},
		{map[string]any{}, "input"},
		{map[string]any{"input": 3}, "input"},
		{map[string]any{"input": "hi", "max_output_tokens": -2}, "max_output_tokens"},
		{map[string]any{"input": "hi", "tools": []any{map[string]any{"type": "web_search"}}}, "tools[0].type"},
		{map[string]any{"input": []any{map[string]any{"role": "user", "content": []any{map[string]any{"type": "input_image", "image_url": "x"}}}}}, "input[0].content[0].type"},
		{map[string]any{"input": []any{map[string]any{"role": "robot", "content": "x"}}}, "input[0].role"},
		{map[string]any{"input": "hi", "text": map[string]any{"format": map[string]any{"type": "yaml"}}}, "text.format.type"},
		{map[string]any{"input": "hi", "frobnicate": 1}, "frobnicate"},
	} {
		code, raw := h.post("/v1/responses", c.body)
		var e errorResp
		if err := json.Unmarshal(raw, &e); code != 400 || err != nil || e.Error.Param == nil || *e.Error.Param != c.param {
			t.Errorf("%v: %d %s, want 400 naming %s", c.body, code, raw, c.param)
		}
	}
	h.stopAndCheck("responses refused")
}

// Input items are checked as OpenAI checks them: a function_call needs its call_id, name
// and arguments, a function_call_output the call_id of a function_call before it (no
// response is stored to find it in) and its output, and a field of the wrong type is a
// 400 naming it. Before, each was read as "" and the model saw a call with no id or no
// arguments, or a tool result answering no call.
func TestResponsesInputItemsChecked(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	call := map[string]any{"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
	for _, c := range []struct {
		input []any
		param string
	}{
		{[]any{map[string]any{"type": "function_call", "name": "f", "arguments": "{}"}}, "input[0].call_id"},
		{[]any{map[string]any{"type": "function_call", "call_id": "c1", "arguments": "{}"}}, "input[0].name"},
		{[]any{map[string]any{"type": "function_call", "call_id": "c1", "name": "f"}}, "input[0].arguments"},
		{[]any{map[string]any{"type": "function_call", "call_id": "c1", "name": "f", "arguments": map[string]any{"x": 1}}}, "input[0].arguments"},
		{[]any{call, map[string]any{"type": "function_call_output", "output": "3"}}, "input[1].call_id"},
		{[]any{call, map[string]any{"type": "function_call_output", "call_id": "c2", "output": "3"}}, "input[1].call_id"},
		{[]any{call, map[string]any{"type": "function_call_output", "call_id": "c1"}}, "input[1].output"},
		{[]any{map[string]any{"role": 5, "content": "x"}}, "input[0].role"},
		{[]any{map[string]any{"type": 5, "role": "user", "content": "x"}}, "input[0].type"},
		{[]any{nil}, "input[0]"},
	} {
		code, raw := h.post("/v1/responses", map[string]any{"input": c.input, "max_output_tokens": 2})
		var e errorResp
		if err := json.Unmarshal(raw, &e); code != 400 || err != nil || e.Error.Param == nil || *e.Error.Param != c.param {
			t.Errorf("%v: %d %s, want 400 naming %s", c.input, code, raw, c.param)
		}
	}
	// The well-formed turn is served.
	code, raw := h.post("/v1/responses", map[string]any{"max_output_tokens": 2, "input": []any{map[string]any{"role": "user", "content": "Weather?"},
		call, map[string]any{"type": "function_call_output", "call_id": "c1", "output": "sunny"}}})
	if code != 200 {
		t.Errorf("a call and its output: %d %s", code, raw)
	}
	h.stopAndCheck("responses input items")
}

// The usage block has every field the openai SDK's ResponseUsage requires, among them
// input_tokens_details.cache_write_tokens (openai-python 3.57 validates it as required).
func TestResponsesUsageShape(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	var r struct {
		Usage map[string]json.RawMessage `json:"usage"`
	}
	h.postJSON("/v1/responses", map[string]any{"input": "hi", "max_output_tokens": 2}, 200, &r)
	var in map[string]*int
	_ = json.Unmarshal(r.Usage["input_tokens_details"], &in)
	var out map[string]*int
	_ = json.Unmarshal(r.Usage["output_tokens_details"], &out)
	for _, k := range []string{"input_tokens", "output_tokens", "total_tokens"} {
		if _, ok := r.Usage[k]; !ok {
			t.Errorf("usage has no %s: %v", k, r.Usage)
		}
	}
	if in["cached_tokens"] == nil || in["cache_write_tokens"] == nil || out["reasoning_tokens"] == nil {
		t.Errorf("usage details: input %s, output %s", r.Usage["input_tokens_details"], r.Usage["output_tokens_details"])
	}
	h.stopAndCheck("responses usage")
}

// An error the chat route raises names the Responses fields the client sent, whatever its
// param: a prompt too long for max_output_tokens does not name max_tokens, and a tool with
// no name is tools[0].name, not the chat tool's tools[0].function.name.
func TestResponsesErrorsNameResponsesFields(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	for _, c := range []struct {
		body        map[string]any
		param, word string
	}{
		{map[string]any{"input": "hi", "max_output_tokens": 100000000}, "prompt", "max_output_tokens"},
		{map[string]any{"input": "hi", "tools": []any{map[string]any{"type": "function"}}}, "tools[0].name", "tools[0]"},
		{map[string]any{"input": []any{map[string]any{"role": "user", "content": strings.Repeat("a", 100000)}}}, "input", "The input's content"},
	} {
		code, raw := h.post("/v1/responses", c.body)
		var e errorResp
		if err := json.Unmarshal(raw, &e); code != 400 || err != nil || e.Error.Param == nil || *e.Error.Param != c.param ||
			!strings.Contains(e.Error.Message, c.word) || strings.Contains(e.Error.Message, "max_tokens") || strings.Contains(e.Error.Message, ".function.") {
			t.Errorf("%v: %d %s, want 400 naming %s (%s) and no chat field", c.body, code, raw, c.param, c.word)
		}
	}
	h.stopAndCheck("responses error names")
}

// Fields real SDKs send are served as OpenAI serves them: metadata and user are echoed in
// the response (they were {} and null whatever was sent), stream_options'
// include_obfuscation (openai-python's stream_options) and prompt_cache_retention are
// accepted (both were 400), and metadata that is not an object of strings is a 400.
func TestResponsesClientFields(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	var r struct {
		Metadata map[string]string `json:"metadata"`
		User     *string           `json:"user"`
	}
	h.postJSON("/v1/responses", map[string]any{"input": "hi", "max_output_tokens": 2, "metadata": map[string]any{"team": "a"}, "user": "u-1",
		"store": true, "prompt_cache_retention": "24h"}, 200, &r)
	if r.Metadata["team"] != "a" || r.User == nil || *r.User != "u-1" {
		t.Errorf("echoed metadata %v, user %v", r.Metadata, r.User)
	}
	code, raw := h.post("/v1/responses", map[string]any{"input": "hi", "max_output_tokens": 2, "stream": true, "stream_options": map[string]any{"include_obfuscation": false}})
	if code != 200 || !strings.Contains(string(raw), "response.completed") {
		t.Errorf("stream_options include_obfuscation: %d %.300s", code, raw)
	}
	for _, c := range []struct {
		body  map[string]any
		param string
	}{
		{map[string]any{"input": "hi", "metadata": "x"}, "metadata"},
		{map[string]any{"input": "hi", "metadata": map[string]any{"n": 1}}, "metadata"},
		{map[string]any{"input": "hi", "stream": true, "stream_options": map[string]any{"include_usage": true}}, "stream_options.include_usage"},
	} {
		code, raw := h.post("/v1/responses", c.body)
		var e errorResp
		if err := json.Unmarshal(raw, &e); code != 400 || err != nil || e.Error.Param == nil || *e.Error.Param != c.param {
			t.Errorf("%v: %d %s, want 400 naming %s", c.body, code, raw, c.param)
		}
	}
	h.stopAndCheck("responses client fields")
}

// Logprobs asked for (include message.output_text.logprobs, top_logprobs) are in the
// output_text part, as the chat route computes them, and streamed with the text deltas;
// they were always [] though the route said it served them.
func TestResponsesLogprobs(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	body := map[string]any{"input": "hi", "max_output_tokens": 3, "temperature": 0, "include": []string{"message.output_text.logprobs"}, "top_logprobs": 2}
	var r struct {
		Output []struct {
			Content []struct {
				Logprobs []chatLogprob `json:"logprobs"`
			} `json:"content"`
		} `json:"output"`
	}
	h.postJSON("/v1/responses", body, 200, &r)
	if len(r.Output) != 1 || len(r.Output[0].Content) != 1 || len(r.Output[0].Content[0].Logprobs) != 3 || len(r.Output[0].Content[0].Logprobs[0].TopLogprobs) != 2 {
		t.Fatalf("output logprobs: %+v", r.Output)
	}
	body["stream"] = true
	_, raw := h.post("/v1/responses", body)
	var streamed int
	for _, line := range strings.Split(string(raw), "\n") {
		var ev struct {
			Type     string        `json:"type"`
			Logprobs []chatLogprob `json:"logprobs"`
		}
		if json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &ev) == nil && ev.Type == "response.output_text.delta" {
			streamed += len(ev.Logprobs)
		}
	}
	if streamed != 3 {
		t.Errorf("streamed %d logprobs with the deltas, want 3:\n%s", streamed, raw)
	}
	h.stopAndCheck("responses logprobs")
}

// A stream whose generation fails ends with the error event and response.failed whose
// error has a code the Responses API defines ("server_error"; openai-python's
// ResponseError takes only its list) and whose items are "incomplete": it carried the
// chat error's code, null, and items "completed".
func TestResponsesStreamFailedCode(t *testing.T) {
	var dr *dyingRunner
	h := newHarness(t, harnessOpts{runner: slowRunner(time.Millisecond), wrap: func(r *enginetest.Runner, _ *tokenizer.Tokenizer, _ int32) engine.Runner {
		dr = &dyingRunner{Runner: r}
		return dr
	}})
	body, _ := json.Marshal(map[string]any{"input": "hi", "max_output_tokens": 1000, "temperature": 0, "stream": true})
	resp, err := http.Post(h.ts.URL+"/v1/responses", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var raw strings.Builder
	failed := false
	for sc := bufio.NewScanner(resp.Body); sc.Scan(); {
		line := sc.Text()
		raw.WriteString(line + "\n")
		if strings.Contains(line, `"response.output_text.delta"`) {
			dr.once.Store(true) // the generation fails after its text began
			dr.die.Store(true)
		}
		var ev struct {
			Type     string `json:"type"`
			Response struct {
				Status string `json:"status"`
				Error  *struct {
					Code    *string `json:"code"`
					Message string  `json:"message"`
				} `json:"error"`
				Output []struct {
					Status string `json:"status"`
				} `json:"output"`
			} `json:"response"`
		}
		if json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &ev) != nil || ev.Type != "response.failed" {
			continue
		}
		failed = true
		if e := ev.Response.Error; ev.Response.Status != "failed" || e == nil || e.Code == nil || *e.Code != "server_error" || e.Message == "" ||
			len(ev.Response.Output) == 0 || ev.Response.Output[0].Status != "incomplete" {
			t.Errorf("response.failed: %s", line)
		}
	}
	if !failed {
		t.Errorf("no response.failed in:\n%s", raw.String())
	}
	h.stopAndCheck("responses failed")
}

// The white space a template puts between the reasoning and a tool call is no message
// item: the answer is the reasoning and the call, unstreamed and streamed (where the
// message item opened at the first "\n\n" and was never taken back). Text that is only
// white space with no call is still the message.
func TestResponsesNoBlankMessageBesideCalls(t *testing.T) {
	h := newToolHarness(t, qwenToolOutput, "hermes", "qwen3")
	tools := []any{map[string]any{"type": "function", "name": "get_weather", "parameters": map[string]any{"type": "object"}}}
	body := map[string]any{"input": "Weather?", "max_output_tokens": 200, "tools": tools}
	var r respObject
	h.postJSON("/v1/responses", body, 200, &r)
	if len(r.Output) != 2 || r.Output[0].Type != "reasoning" || r.Output[1].Type != "function_call" {
		t.Errorf("unstreamed output: %+v", r.Output)
	}
	body["stream"] = true
	_, raw := h.post("/v1/responses", body)
	var added []string
	var final respObject
	for _, line := range strings.Split(string(raw), "\n") {
		var ev struct {
			Type     string                `json:"type"`
			Item     struct{ Type string } `json:"item"`
			Response json.RawMessage       `json:"response"`
		}
		if json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &ev) != nil {
			continue
		}
		switch ev.Type {
		case "response.output_item.added":
			added = append(added, ev.Item.Type)
		case "response.completed":
			_ = json.Unmarshal(ev.Response, &final)
		}
	}
	if strings.Join(added, ",") != "reasoning,function_call" || len(final.Output) != 2 {
		t.Errorf("streamed items %v, final %+v", added, final.Output)
	}
	h.stopAndCheck("responses blank message")

	blank := newToolHarness(t, "\n\n", "hermes", "")
	var b respObject
	blank.postJSON("/v1/responses", map[string]any{"input": "hi", "max_output_tokens": 5, "stream": false}, 200, &b)
	if len(b.Output) != 1 || b.Output[0].Type != "message" {
		t.Errorf("white space alone: %+v", b.Output)
	}
	_, raw = blank.post("/v1/responses", map[string]any{"input": "hi", "max_output_tokens": 5, "stream": true})
	if !strings.Contains(string(raw), `"delta":"\n\n"`) || !strings.Contains(string(raw), "response.output_text.done") {
		t.Errorf("white space alone, streamed:\n%s", raw)
	}
	blank.stopAndCheck("responses white space")
}
