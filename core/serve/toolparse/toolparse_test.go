package toolparse

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
)

// call is a wanted tool call (ids are checked separately).
type call struct{ name, args string }

// generation is a realistic model output, written from the formats' documentation and
// vLLM's parser tests, with what the OpenAI message must carry.
type generation struct {
	name, tools, reasoning string
	prompt                 string // the end of the rendered prompt
	text                   string
	content, thinking      string
	calls                  []call
}

var generations = []generation{
	{
		name: "qwen3 thinking then two calls", tools: "hermes", reasoning: "qwen3",
		prompt: "<|im_start|>user\nWeather in Paris and Berlin?<|im_end|>\n<|im_start|>assistant\n",
		text: "<think>\nThe user wants the weather in two cities. I should call get_weather twice.\n</think>\n\n" +
			"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>\n" +
			"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Berlin\", \"unit\": \"celsius\"}}\n</tool_call>",
		thinking: "\nThe user wants the weather in two cities. I should call get_weather twice.\n",
		content:  "\n\n",
		calls:    []call{{"get_weather", `{"city": "Paris", "unit": "celsius"}`}, {"get_weather", `{"city": "Berlin", "unit": "celsius"}`}},
	},
	{
		name: "hermes content then call with nested arguments", tools: "hermes",
		text: "Let me search for that.\n<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"<b>news</b> \\\"today\\\" }{\", " +
			"\"filters\": {\"max_id\": 12345678901234567890123, \"score\": 1.0, \"tags\": [\"a\", \"b\"]}}}\n</tool_call>",
		content: "Let me search for that.\n",
		calls:   []call{{"search", `{"query": "<b>news</b> \"today\" }{", "filters": {"max_id": 12345678901234567890123, "score": 1.0, "tags": ["a", "b"]}}`}},
	},
	{
		name: "hermes arguments before name", tools: "hermes",
		text:  "<tool_call>\n{\"arguments\": {\"tz\": \"UTC\"}, \"name\": \"get_time\"}\n</tool_call>",
		calls: []call{{"get_time", `{"tz": "UTC"}`}},
	},
	{
		name: "hermes plain answer with angle brackets", tools: "hermes",
		text:    "Use a < b, and <tool> tags are fine; so is <tool_", // ends like a marker's start
		content: "Use a < b, and <tool> tags are fine; so is <tool_",
	},
	{
		name: "hermes call cut at end of generation", tools: "hermes",
		text:  "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}",
		calls: []call{{"get_time", `{}`}},
	},
	{
		name: "hermes call without arguments", tools: "hermes",
		text:  "<tool_call>\n{\"name\": \"list_files\"}\n</tool_call>",
		calls: []call{{"list_files", `{}`}},
	},
	{
		name: "hermes arguments as a JSON string", tools: "hermes",
		text:  "<tool_call>\n{\"name\": \"f\", \"arguments\": \"{\\\"x\\\": 1}\"}\n</tool_call>",
		calls: []call{{"f", `{"x": 1}`}},
	},
	{
		name: "hermes markup that is not a call stays content", tools: "hermes",
		text:    "Here: <tool_call>\nnot json at all\n</tool_call>",
		content: "Here: <tool_call>\nnot json at all\n</tool_call>",
	},
	{
		name: "qwen3 answer without thinking", tools: "hermes", reasoning: "qwen3",
		prompt:  "<|im_start|>assistant\n<think>\n\n</think>\n\n",
		text:    "The answer is 4.",
		content: "The answer is 4.",
	},
	{
		name: "qwen3 prompt opens think", reasoning: "qwen3",
		prompt:   "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n<think>\n",
		text:     "Two plus two.\n</think>\n\nThe answer is 4.",
		thinking: "Two plus two.\n",
		content:  "\n\nThe answer is 4.",
	},
	{
		name: "deepseek_r1 reasoning without opening tag", reasoning: "deepseek_r1",
		prompt:   "<｜User｜>2+2?<｜Assistant｜><think>\n",
		text:     "Okay, 2+2 is 4, easy.\n</think>\n\nThe answer is **4**.",
		thinking: "Okay, 2+2 is 4, easy.\n",
		content:  "\n\nThe answer is **4**.",
	},
	{
		name: "deepseek_r1 cut while thinking", reasoning: "deepseek_r1",
		text:     "<think>\nLet me think about </thi",
		thinking: "\nLet me think about </thi",
	},
	{
		name: "llama3 single call", tools: "llama3_json",
		text:  `{"name": "get_weather", "parameters": {"city": "San Francisco", "unit": "fahrenheit"}}`,
		calls: []call{{"get_weather", `{"city": "San Francisco", "unit": "fahrenheit"}`}},
	},
	{
		name: "llama3 python_tag and two calls", tools: "llama3_json",
		text:  `<|python_tag|>{"name": "a", "parameters": {"x": 1}}; {"name": "b", "arguments": {"y": [1, 2], "s": "semi;colon"}}`,
		calls: []call{{"a", `{"x": 1}`}, {"b", `{"y": [1, 2], "s": "semi;colon"}`}},
	},
	{
		name: "llama3 plain answer", tools: "llama3_json",
		text:    "The capital of France is Paris.",
		content: "The capital of France is Paris.",
	},
	{
		name: "llama3 JSON answer that is not a call", tools: "llama3_json",
		text:    `{"answer": 42}`,
		content: `{"answer": 42}`,
	},
	{
		name: "deepseek_v3 two calls", tools: "deepseek_v3",
		text: "I'll check both.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜>\n" +
			"<｜tool▁call▁begin｜>function<｜tool▁sep｜>search\n```json\n{\"query\": \"news\", \"n\": 1E5}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
		content: "I'll check both.",
		calls:   []call{{"get_weather", `{"city": "Paris"}`}, {"search", `{"query": "news", "n": 1E5}`}},
	},
	{
		name: "deepseek_r1 reasoning then deepseek_v3 call", tools: "deepseek_v3", reasoning: "deepseek_r1",
		text:     "The user needs the time.\n</think>\n\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
		thinking: "The user needs the time.\n",
		content:  "\n\n",
		calls:    []call{{"get_time", `{}`}},
	},
	{
		name: "deepseek_v4 DSML calls after thinking", tools: "deepseek_v4", reasoning: "deepseek_v4",
		prompt: "<｜User｜>Weather in Paris for 3 days, and search <news>?<｜Assistant｜><think>",
		text: "The user wants two things.</think>Checking.\n\n<｜DSML｜tool_calls>\n" +
			"<｜DSML｜invoke name=\"get_weather\">\n" +
			"<｜DSML｜parameter name=\"city\" string=\"true\">Paris \"FR\"\n</｜DSML｜parameter>\n" +
			"<｜DSML｜parameter name=\"days\" string=\"false\">3</｜DSML｜parameter>\n" +
			"<｜DSML｜parameter name=\"unit\" string=\"true\">celsius</｜DSML｜parameter>\n" +
			"</｜DSML｜invoke>\n" +
			"<｜DSML｜invoke name=\"search\">\n" +
			"<｜DSML｜parameter name=\"filters\" string=\"false\">{\"score\": 1.0, \"n\": 1E5}</｜DSML｜parameter>\n" +
			"<｜DSML｜parameter name=\"query\" string=\"false\">not json</｜DSML｜parameter>\n" +
			"</｜DSML｜invoke>\n" +
			"<｜DSML｜invoke name=\"list_files\">\n</｜DSML｜invoke>\n" +
			"</｜DSML｜tool_calls>",
		thinking: "The user wants two things.",
		content:  "Checking.\n\n",
		calls: []call{{"get_weather", `{"city": "Paris \"FR\"\n", "days": 3, "unit": "celsius"}`},
			{"search", `{"filters": {"score": 1.0, "n": 1E5}, "query": "not json"}`}, {"list_files", `{}`}},
	},
	{
		name: "deepseek_v4 non-thinking answer", tools: "deepseek_v4", reasoning: "deepseek_v4",
		prompt:  "<｜User｜>Hi<｜Assistant｜></think>",
		text:    "Hello! <｜DSML｜ is how I call tools.",
		content: "Hello! <｜DSML｜ is how I call tools.",
	},
	{
		name: "mistral calls (tokenizer v11 form)", tools: "mistral",
		text:  `[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "days": 3, "unit": "celsius"}[TOOL_CALLS]search[ARGS]{"query": "news", "filters": {"score": 1.0}}`,
		calls: []call{{"get_weather", `{"city": "Paris", "days": 3, "unit": "celsius"}`}, {"search", `{"query": "news", "filters": {"score": 1.0}}`}},
	},
	{
		name: "mistral content then a call with an id", tools: "mistral",
		text:    `Let me check [the] weather.[TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{"city": "Oslo"}`,
		content: "Let me check [the] weather.",
		calls:   []call{{"get_weather", `{"city": "Oslo"}`}},
	},
	{
		name: "mistral calls (older array form)", tools: "mistral",
		text:  `[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", "arguments": {}}]`,
		calls: []call{{"get_weather", `{"city": "Paris"}`}, {"get_time", `{}`}},
	},
	{
		name: "mistral plain answer", tools: "mistral",
		text:    "Brackets [like this] are fine, even [TOOL",
		content: "Brackets [like this] are fine, even [TOOL",
	},
	{
		name: "qwen3_coder two calls (Qwen3.5 template's form)", tools: "qwen3_coder",
		text: "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n" +
			"<parameter=unit>\ncelsius\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=search>\n" +
			"<parameter=query>\nnews\n</parameter>\n<parameter=filters>\n{\"score\": 1.0}\n</parameter>\n</function>\n</tool_call>",
		calls: []call{{"get_weather", `{"city": "Paris", "days": 3, "unit": "celsius"}`}, {"search", `{"query": "news", "filters": {"score": 1.0}}`}},
	},
	{
		name: "qwen3_coder types from the tool definitions", tools: "qwen3_coder", reasoning: "qwen3",
		prompt: "<|im_start|>assistant\n<think>\n",
		text: "Use the schema.\n</think>\n\nSure.\n<tool_call>\n<function=get_weather>\n" +
			"<parameter=city>\nSão \"Paulo\"\nline 2\n</parameter>\n<parameter=zip>\n02134\n</parameter>\n" +
			"<parameter=ratio>\n2.0\n</parameter>\n<parameter=days>\nthree\n</parameter>\n<parameter=metric>\nTrue\n</parameter>\n" +
			"<parameter=opts>\n{\"a\": [1, 2]}\n</parameter>\n<parameter=extra>\n42\n</parameter>\n<parameter=unit>\nnull\n</parameter>\n" +
			"</function>\n</tool_call>",
		thinking: "Use the schema.\n",
		content:  "\n\nSure.\n",
		calls: []call{{"get_weather", `{"city": "São \"Paulo\"\nline 2", "zip": "02134", "ratio": 2, "days": "three", "metric": true, ` +
			`"opts": {"a": [1, 2]}, "extra": "42", "unit": null}`}},
	},
	{
		name: "deepseek_v31 from vLLM's test", tools: "deepseek_v31",
		text: "normal text<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>foo<｜tool▁sep｜>{\"x\":1}<｜tool▁call▁end｜>" +
			"<｜tool▁call▁begin｜>bar<｜tool▁sep｜>{\"y\":2}<｜tool▁call▁end｜><｜tool▁calls▁end｜> some suffix text",
		content: "normal text",
		calls:   []call{{"foo", `{"x":1}`}, {"bar", `{"y":2}`}},
	},
}

func newParser(t *testing.T, g generation) *Parser {
	t.Helper()
	p, err := New(g.tools, g.reasoning)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	p.NewID = func() string { n++; return fmt.Sprintf("call_%d", n) }
	return p
}

func (g generation) check(t *testing.T, how string, r Result) {
	t.Helper()
	if r.Content != g.content {
		t.Errorf("%s: content %q, want %q", how, r.Content, g.content)
	}
	if r.Reasoning != g.thinking {
		t.Errorf("%s: reasoning %q, want %q", how, r.Reasoning, g.thinking)
	}
	var got []call
	for i, c := range r.ToolCalls {
		got = append(got, call{c.Function.Name, c.Function.Arguments})
		if c.Type != "function" || c.ID != fmt.Sprintf("call_%d", i+1) {
			t.Errorf("%s: call %d has id %q type %q", how, i, c.ID, c.Type)
		}
		if !json.Valid([]byte(c.Function.Arguments)) {
			t.Errorf("%s: call %d arguments are not JSON: %s", how, i, c.Function.Arguments)
		}
	}
	if !reflect.DeepEqual(got, g.calls) {
		t.Errorf("%s: calls\n got  %q\n want %q", how, got, g.calls)
	}
}

func TestParseGenerations(t *testing.T) {
	for _, g := range generations {
		t.Run(g.name, func(t *testing.T) {
			g.check(t, "parse", newParser(t, g).Parse(g.prompt, g.text, testTools))
		})
	}
}

// TestStreamMatchesParse feeds each generation one character at a time and in random
// pieces: the deltas join to Parse's result, and no content delta carries markup.
func TestStreamMatchesParse(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, g := range generations {
		t.Run(g.name, func(t *testing.T) {
			splits := map[string][]string{"by character": strings.Split(g.text, "")}
			for k := range 3 {
				var pieces []string
				for rest := []rune(g.text); len(rest) > 0; {
					n := min(len(rest), 1+rng.IntN(6))
					pieces = append(pieces, string(rest[:n]))
					rest = rest[n:]
				}
				splits[fmt.Sprintf("random pieces %d", k)] = pieces
			}
			for how, pieces := range splits {
				s := newParser(t, g).NewStream(g.prompt, testTools)
				var r Result
				for _, p := range pieces {
					d := s.Add(p)
					for _, m := range []string{"<tool_call>", "<think>", "</think>", "<｜tool", "<|python_tag|>"} {
						if strings.Contains(d.Content, m) && !strings.Contains(g.content, m) {
							t.Errorf("%s: content delta %q leaks %s", how, d.Content, m)
						}
					}
					r.Append(d)
				}
				r.Append(s.Flush())
				g.check(t, how, r)
			}
		})
	}
}

// TestStreamDeltas pins the shape of the deltas: the name once with id and type, then
// argument pieces, content never holding markup.
func TestStreamDeltas(t *testing.T) {
	p, err := New("hermes", "")
	if err != nil {
		t.Fatal(err)
	}
	p.NewID = func() string { return "call_x" }
	s := p.NewStream("", testTools)
	var deltas []Delta
	for _, piece := range []string{"Sure.", "\n<tool", "_call>\n{\"name\": \"get_", "weather\", \"arguments\": {\"city\"", ": \"Oslo\"}}\n</tool_call>"} {
		deltas = append(deltas, s.Add(piece))
	}
	deltas = append(deltas, s.Flush())
	want := []Delta{
		{Content: "Sure."},
		{Content: "\n"},
		{},
		{ToolCalls: []ToolCallDelta{{Index: 0, ID: "call_x", Type: "function", Function: FunctionDelta{Name: "get_weather", Arguments: `{"city"`}}}},
		{ToolCalls: []ToolCallDelta{{Index: 0, Function: FunctionDelta{Arguments: `: "Oslo"}`}}}},
		{},
	}
	if !reflect.DeepEqual(deltas, want) {
		t.Errorf("deltas\n got  %+v\n want %+v", deltas, want)
	}
	if !s.ToolsCalled() {
		t.Error("ToolsCalled is false")
	}
}

func TestNoToolsInRequest(t *testing.T) {
	p, _ := New("hermes", "")
	r := p.Parse("", "<tool_call>\n{\"name\": \"f\"}\n</tool_call>", nil)
	if len(r.ToolCalls) != 0 || r.Content != "<tool_call>\n{\"name\": \"f\"}\n</tool_call>" {
		t.Errorf("without tools in the request the text is content: %+v", r)
	}
}

func TestUnknownParser(t *testing.T) {
	if _, err := New("pythonic", ""); err == nil || !strings.Contains(err.Error(), "deepseek_v3, deepseek_v31, deepseek_v4, hermes, llama3_json, mistral, qwen3_coder") {
		t.Errorf("unknown tool parser: %v", err)
	}
	if _, err := New("", "glm45"); err == nil || !strings.Contains(err.Error(), "deepseek_r1, deepseek_v4, qwen3") {
		t.Errorf("unknown reasoning parser: %v", err)
	}
}

// TestStreamMatchesParseOnPrefixes cuts every generation at every character (as
// max_tokens or a stop would) and checks that streaming it character by character still
// gives what Parse gives, also for the unfinished markup at the cut.
func TestStreamMatchesParseOnPrefixes(t *testing.T) {
	for _, g := range generations {
		runes := []rune(g.text)
		for n := range len(runes) + 1 {
			text := string(runes[:n])
			want := newParser(t, g).Parse(g.prompt, text, testTools)
			s := newParser(t, g).NewStream(g.prompt, testTools)
			var got Result
			for _, r := range runes[:n] {
				got.Append(s.Add(string(r)))
			}
			got.Append(s.Flush())
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("%s cut at %d (%q):\n streamed %+v\n parsed   %+v", g.name, n, text, got, want)
			}
		}
	}
}

func TestKeepsSpecialTokens(t *testing.T) {
	for name, want := range map[string]bool{"mistral": true, "hermes": false, "deepseek_v3": false, "": false} {
		p, err := New(name, "qwen3")
		if err != nil {
			t.Fatal(err)
		}
		if p.KeepsSpecialTokens() != want {
			t.Errorf("%q: KeepsSpecialTokens %v", name, !want)
		}
	}
}

// testTools are the tool definitions the golden generations are made against.
var testTools = []json.RawMessage{
	json.RawMessage(`{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
		"city": {"type": "string"}, "days": {"type": "integer"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
		"ratio": {"type": "number"}, "metric": {"type": "boolean"}, "zip": {"type": "string"}, "opts": {"type": "object"}}}}}`),
	json.RawMessage(`{"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "filters": {"type": "object"}}}}}`),
}
