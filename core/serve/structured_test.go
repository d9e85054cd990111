package serve

import (
	"encoding/json"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/engine/enginetest"
	"github.com/resin-llm/resin/core/grammar"
	"github.com/resin-llm/resin/core/tokenizer"
)

var _ engine.Constraint = (*grammar.Matcher)(nil)

// noMasks is the test runner declaring no token masks (as a GPU runner does today).
type noMasks struct{ *enginetest.Runner }

func (n noMasks) Info() engine.RunnerInfo {
	i := n.Runner.Info()
	i.TokenMasks = false
	return i
}

func withoutMasks(r *enginetest.Runner, _ *tokenizer.Tokenizer, _ int32) engine.Runner {
	return noMasks{r}
}

const weatherParams = `{"type": "object", "properties": {
	"location": {"type": "string", "pattern": "^[A-Z][a-z]{1,8}$"},
	"unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
	"days": {"type": "integer", "minimum": 1, "maximum": 14}},
	"required": ["location", "unit"], "additionalProperties": false}`

type weatherArgs struct {
	Location string `json:"location"`
	Unit     string `json:"unit"`
	Days     *int   `json:"days"`
}

// checkWeather parses and validates arguments under weatherParams.
func checkWeather(t *testing.T, text string) {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(text))
	dec.DisallowUnknownFields()
	var a weatherArgs
	if err := dec.Decode(&a); err != nil {
		t.Fatalf("%q does not parse: %v", text, err)
	}
	if !regexp.MustCompile(`^[A-Z][a-z]{1,8}$`).MatchString(a.Location) || a.Unit != "celsius" && a.Unit != "fahrenheit" ||
		a.Days != nil && (*a.Days < 1 || *a.Days > 14) {
		t.Fatalf("%q does not validate", text)
	}
}

type chatAnswer struct {
	Choices []struct {
		Message struct {
			Content   *string `json:"content"`
			ToolCalls []struct {
				ID       string `json:"id"`
				Type     string `json:"type"`
				Function struct {
					Name      string `json:"name"`
					Arguments string `json:"arguments"`
				} `json:"function"`
			} `json:"tool_calls"`
		} `json:"message"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
}

var userMsg = []any{map[string]any{"role": "user", "content": "What is the weather?"}}

var weatherTools = []any{map[string]any{"type": "function", "function": map[string]any{
	"name": "get_weather", "description": "Weather at a place", "parameters": json.RawMessage(weatherParams)}},
	map[string]any{"type": "function", "function": map[string]any{"name": "get_time", "parameters": map[string]any{
		"type": "object", "properties": map[string]any{"tz": map[string]any{"enum": []string{"UTC", "CET"}}}, "required": []string{"tz"}}}}}

// TestResponseFormat: response_format json_schema and json_object answer with JSON that
// parses and validates, for each of n sampled choices.
func TestResponseFormat(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	var out chatAnswer
	h.postJSON("/v1/chat/completions", map[string]any{"messages": userMsg, "n": 4, "temperature": 1, "seed": 3, "max_tokens": 600,
		"response_format": map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "w", "strict": true, "schema": json.RawMessage(weatherParams)}}}, 200, &out)
	if len(out.Choices) != 4 {
		t.Fatalf("%d choices", len(out.Choices))
	}
	for _, c := range out.Choices {
		if c.FinishReason != "stop" || c.Message.Content == nil {
			t.Fatalf("finish %q content %v", c.FinishReason, c.Message.Content)
		}
		checkWeather(t, *c.Message.Content)
	}
	out = chatAnswer{}
	h.postJSON("/v1/chat/completions", map[string]any{"messages": userMsg, "temperature": 1, "seed": 5, "max_tokens": 300,
		"response_format": map[string]any{"type": "json_object"}}, 200, &out)
	var obj map[string]any
	if c := out.Choices[0]; c.FinishReason == "stop" {
		if err := json.Unmarshal([]byte(*c.Message.Content), &obj); err != nil {
			t.Fatalf("json_object answer %q: %v", *c.Message.Content, err)
		}
	} else if !strings.HasPrefix(*c.Message.Content, "{") {
		t.Fatalf("json_object answer %q", *c.Message.Content)
	}
	h.stopAndCheck("response_format")
}

// TestToolChoiceForced: a named tool_choice answers with one call of that tool whose
// arguments validate against its parameters; "required" with calls of offered tools; both
// streamed too.
func TestToolChoiceForced(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	named := map[string]any{"type": "function", "function": map[string]any{"name": "get_weather"}}
	for seed := 0; seed < 3; seed++ {
		var out chatAnswer
		h.postJSON("/v1/chat/completions", map[string]any{"messages": userMsg, "tools": weatherTools, "tool_choice": named,
			"temperature": 1, "seed": seed, "max_tokens": 400}, 200, &out)
		c := out.Choices[0]
		if len(c.Message.ToolCalls) != 1 || c.Message.ToolCalls[0].Function.Name != "get_weather" || c.FinishReason != "stop" || c.Message.ToolCalls[0].ID == "" {
			t.Fatalf("named tool_choice: %+v", c)
		}
		checkWeather(t, c.Message.ToolCalls[0].Function.Arguments)

		out = chatAnswer{}
		h.postJSON("/v1/chat/completions", map[string]any{"messages": userMsg, "tools": weatherTools, "tool_choice": "required",
			"temperature": 1, "seed": seed, "max_tokens": 1900}, 200, &out)
		c = out.Choices[0]
		if len(c.Message.ToolCalls) == 0 || c.FinishReason != "tool_calls" {
			t.Fatalf("required tool_choice: %+v", c)
		}
		for _, call := range c.Message.ToolCalls {
			switch call.Function.Name {
			case "get_weather":
				checkWeather(t, call.Function.Arguments)
			case "get_time":
				var m map[string]any
				if err := json.Unmarshal([]byte(call.Function.Arguments), &m); err != nil {
					t.Fatalf("get_time arguments %q", call.Function.Arguments)
				}
			default:
				t.Fatalf("call of %q", call.Function.Name)
			}
		}
	}
	// Streamed: one delta with the call, then finish.
	code, raw := h.post("/v1/chat/completions", map[string]any{"messages": userMsg, "tools": weatherTools, "tool_choice": named,
		"temperature": 1, "seed": 1, "max_tokens": 400, "stream": true})
	if code != 200 {
		t.Fatalf("stream: %d %s", code, raw)
	}
	var args, finish string
	for _, ev := range sseEvents(t, raw) {
		if ev == "[DONE]" {
			continue
		}
		var ch struct {
			Choices []struct {
				Delta struct {
					ToolCalls []struct {
						Function struct{ Name, Arguments string } `json:"function"`
					} `json:"tool_calls"`
				} `json:"delta"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(ev), &ch); err != nil {
			t.Fatal(err)
		}
		for _, c := range ch.Choices {
			for _, tc := range c.Delta.ToolCalls {
				if tc.Function.Name != "get_weather" {
					t.Fatalf("streamed call of %q", tc.Function.Name)
				}
				args += tc.Function.Arguments
			}
			if c.FinishReason != nil {
				finish = *c.FinishReason
			}
		}
	}
	if finish != "stop" {
		t.Fatalf("streamed finish %q", finish)
	}
	checkWeather(t, args)
	h.stopAndCheck("tool_choice")
}

// TestGuidedFields: vLLM's guided_regex, guided_grammar, guided_json, guided_choice and
// structured_outputs constrain completions.
func TestGuidedFields(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	type cmpl struct {
		Choices []struct {
			Text string `json:"text"`
		} `json:"choices"`
	}
	run := func(extra map[string]any) []string {
		body := map[string]any{"prompt": "Answer:", "temperature": 1, "seed": 9, "n": 3, "max_tokens": 300}
		for k, v := range extra {
			body[k] = v
		}
		var out cmpl
		h.postJSON("/v1/completions", body, 200, &out)
		var texts []string
		for _, c := range out.Choices {
			texts = append(texts, c.Text)
		}
		return texts
	}
	for _, text := range run(map[string]any{"guided_regex": `\d{3}-[a-c]{2,4}`}) {
		if !regexp.MustCompile(`^\d{3}-[a-c]{2,4}$`).MatchString(text) {
			t.Fatalf("guided_regex: %q", text)
		}
	}
	for _, text := range run(map[string]any{"structured_outputs": map[string]any{"regex": `(yes|no)!`}}) {
		if text != "yes!" && text != "no!" {
			t.Fatalf("structured_outputs regex: %q", text)
		}
	}
	for _, text := range run(map[string]any{"guided_grammar": "root ::= \"(\" [0-9]+ (\"+\" [0-9]+)* \")\"\n"}) {
		if !regexp.MustCompile(`^\([0-9]+(\+[0-9]+)*\)$`).MatchString(text) {
			t.Fatalf("guided_grammar: %q", text)
		}
	}
	for _, text := range run(map[string]any{"guided_json": weatherParams}) { // a string holding the schema
		checkWeather(t, text)
	}
	for _, text := range run(map[string]any{"structured_outputs": map[string]any{"json": json.RawMessage(weatherParams)}}) {
		checkWeather(t, text)
	}
	choices := []string{"red", "green", "blue sky"}
	for _, k := range []map[string]any{{"guided_choice": choices}, {"structured_outputs": map[string]any{"choice": choices}}} {
		for _, text := range run(k) {
			if !slices.Contains(choices, text) {
				t.Fatalf("%v: %q", k, text)
			}
		}
	}
	h.stopAndCheck("guided fields")
}

// TestStructuredRefused: what cannot be enforced is refused with a 400 naming the field,
// and a runner without token masks refuses structured output but guided_choice.
func TestStructuredRefused(t *testing.T) {
	nm := newHarness(t, harnessOpts{wrap: withoutMasks})
	code, raw := nm.post("/v1/chat/completions", map[string]any{"messages": userMsg, "response_format": map[string]any{"type": "json_object"}})
	if code != 400 || !strings.Contains(string(raw), "token masks") {
		t.Fatalf("json_object without token masks: %d %s", code, raw)
	}
	h := newHarness(t, harnessOpts{})
	for _, c := range []struct {
		path  string
		body  map[string]any
		param string
		want  string
	}{
		{"/v1/chat/completions", map[string]any{"messages": userMsg, "response_format": map[string]any{"type": "json_schema",
			"json_schema": map[string]any{"name": "x", "schema": map[string]any{"type": "object", "patternProperties": map[string]any{}}}}}, "response_format", "patternProperties"},
		{"/v1/chat/completions", map[string]any{"messages": userMsg, "response_format": map[string]any{"type": "json_object"}, "guided_regex": "a"}, "guided_regex", "both"},
		{"/v1/chat/completions", map[string]any{"messages": userMsg, "tools": weatherTools, "tool_choice": map[string]any{"type": "function", "function": map[string]any{"name": "nope"}}}, "tool_choice", "nope"},
		{"/v1/chat/completions", map[string]any{"messages": userMsg, "tool_choice": "required"}, "tool_choice", "tools"},
		{"/v1/completions", map[string]any{"prompt": "x", "guided_regex": `a\bb`}, "guided_regex", "word boundaries"},
		{"/v1/completions", map[string]any{"prompt": "x", "guided_grammar": "root ::= root \"a\"\n"}, "guided_grammar", "left-recursive"},
		{"/v1/completions", map[string]any{"prompt": "x", "guided_json": map[string]any{"type": "integer", "multipleOf": 3}}, "guided_json", "multipleOf"},
		{"/v1/completions", map[string]any{"prompt": "x", "structured_outputs": map[string]any{"structural_tag": "{}"}}, "structured_outputs", "structural_tag"},
		{"/v1/completions", map[string]any{"prompt": "x", "structured_outputs": map[string]any{"jsn": "{}"}}, "structured_outputs", "jsn"},
	} {
		code, raw := h.post(c.path, c.body)
		var e errorResp
		if err := json.Unmarshal(raw, &e); err != nil || code != 400 || e.Error.Param == nil || *e.Error.Param != c.param || !strings.Contains(e.Error.Message, c.want) {
			t.Errorf("%v: status %d, %s; want 400 naming %s and %q", c.body, code, raw, c.param, c.want)
		}
	}
}

// TestToolChoiceForcedHermes: with the hermes (or llama3_json) tool-call parser a forced
// call is written in the model's own format, and the parser reads it: a named tool_choice
// gives that call, "required" one or more, each with arguments that validate.
func TestToolChoiceForcedHermes(t *testing.T) {
	for _, parser := range []string{"hermes", "llama3_json"} {
		t.Run(parser, func(t *testing.T) { forcedNative(t, parser) })
	}
}

func forcedNative(t *testing.T, parser string) {
	h := newHarness(t, harnessOpts{cfg: func(c *Config) { c.ToolCallParser = parser }})
	named := map[string]any{"type": "function", "function": map[string]any{"name": "get_weather"}}
	for seed := 0; seed < 3; seed++ {
		for _, choice := range []any{named, "required"} {
			var out chatAnswer
			h.postJSON("/v1/chat/completions", map[string]any{"messages": userMsg, "tools": weatherTools, "tool_choice": choice,
				"temperature": 1, "seed": seed, "max_tokens": 1900}, 200, &out)
			c := out.Choices[0]
			if len(c.Message.ToolCalls) == 0 || c.FinishReason != "tool_calls" {
				t.Fatalf("%v: %+v", choice, c)
			}
			if _, isNamed := choice.(map[string]any); isNamed && (len(c.Message.ToolCalls) != 1 || c.Message.ToolCalls[0].Function.Name != "get_weather") {
				t.Fatalf("named: %+v", c.Message.ToolCalls)
			}
			for _, call := range c.Message.ToolCalls {
				switch call.Function.Name {
				case "get_weather":
					checkWeather(t, call.Function.Arguments)
				case "get_time":
				default:
					t.Fatalf("call of %q", call.Function.Name)
				}
			}
		}
	}
	h.stopAndCheck("hermes tool_choice")
}
