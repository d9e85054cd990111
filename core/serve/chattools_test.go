package serve

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/engine/enginetest"
	"github.com/resin-llm/resin/core/tokenizer"
	"github.com/resin-llm/resin/core/tokenizer/tiny"
)

// scriptRunner is the engine's test runner made to generate a fixed token script (then
// EOS) for every request, so that the server sees a model that calls tools.
type scriptRunner struct {
	*enginetest.Runner
	script []int32
	eos    int32
	mu     sync.Mutex
	done   map[uint64]int // tokens generated per request
}

func (r *scriptRunner) Execute(ctx context.Context, p *engine.BatchPlan) (engine.StepResult, error) {
	res, err := r.Runner.Execute(ctx, p)
	if err != nil {
		return res, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	k := 0
	for i, req := range p.ReqIDs {
		for range res.Accepted[i] {
			n := r.done[req]
			r.done[req]++
			res.Tokens[k] = r.eos
			if n < len(r.script) {
				res.Tokens[k] = r.script[n]
			}
			k++
		}
	}
	return res, nil
}

// newToolHarness serves the tiny tokenizer and template over a runner that generates
// text, with the given parsers.
func newToolHarness(t *testing.T, text, toolParser, reasoningParser string) *harness {
	t.Helper()
	return newHarness(t, harnessOpts{
		wrap: func(inner *enginetest.Runner, tok *tokenizer.Tokenizer, eos int32) engine.Runner {
			script, err := tok.Encode(text, false)
			if err != nil {
				t.Fatal(err)
			}
			return &scriptRunner{Runner: inner, script: script, eos: eos, done: map[uint64]int{}}
		},
		cfg: func(c *Config) { c.ToolCallParser, c.ReasoningParser = toolParser, reasoningParser },
	})
}

const qwenToolOutput = "<think>\nThe user wants the weather; call get_weather.\n</think>\n\n" +
	"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n</tool_call>"

var weatherTool = json.RawMessage(`{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}`)

type toolMessage struct {
	Role             string  `json:"role"`
	Content          *string `json:"content"`
	ReasoningContent *string `json:"reasoning_content"`
	ToolCalls        []struct {
		Index    *int   `json:"index"`
		ID       string `json:"id"`
		Type     string `json:"type"`
		Function struct {
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		} `json:"function"`
	} `json:"tool_calls"`
}

// toolChatResponse is the part of a chat completion the tool tests read.
type toolChatResponse struct {
	Choices []struct {
		Message      toolMessage `json:"message"`
		FinishReason string      `json:"finish_reason"`
	} `json:"choices"`
}

func TestChatToolCalls(t *testing.T) {
	h := newToolHarness(t, qwenToolOutput, "hermes", "qwen3")
	body := map[string]any{"model": "tiny-test", "messages": []map[string]any{{"role": "user", "content": "Weather in Paris?"}},
		"tools": []json.RawMessage{weatherTool}, "max_tokens": 200}
	var resp toolChatResponse
	h.postJSON("/v1/chat/completions", body, 200, &resp)
	c := resp.Choices[0]
	if c.FinishReason != "tool_calls" {
		t.Errorf("finish_reason %q, want tool_calls", c.FinishReason)
	}
	m := c.Message
	if m.ReasoningContent == nil || *m.ReasoningContent != "\nThe user wants the weather; call get_weather.\n" {
		t.Errorf("reasoning_content %v", m.ReasoningContent)
	}
	if m.Content == nil || *m.Content != "\n\n" {
		t.Errorf("content %v, want the text before the call", m.Content)
	}
	if len(m.ToolCalls) != 1 || m.ToolCalls[0].ID == "" || m.ToolCalls[0].Type != "function" ||
		m.ToolCalls[0].Function.Name != "get_weather" || m.ToolCalls[0].Function.Arguments != `{"city": "Paris", "days": 3}` {
		t.Errorf("tool_calls %+v", m.ToolCalls)
	}
}

func TestChatToolCallsStreamed(t *testing.T) {
	h := newToolHarness(t, qwenToolOutput, "hermes", "qwen3")
	body := map[string]any{"model": "tiny-test", "messages": []map[string]any{{"role": "user", "content": "Weather in Paris?"}},
		"tools": []json.RawMessage{weatherTool}, "max_tokens": 200, "stream": true}
	code, raw := h.post("/v1/chat/completions", body)
	if code != 200 {
		t.Fatalf("status %d: %s", code, raw)
	}
	var content, reasoning, name, args, id, finish string
	calls := 0
	for _, ev := range sseEvents(t, raw) {
		if ev == "[DONE]" {
			continue
		}
		var chunk struct {
			Choices []struct {
				Delta        toolMessage `json:"delta"`
				FinishReason *string     `json:"finish_reason"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(ev), &chunk); err != nil {
			t.Fatalf("%v in %s", err, ev)
		}
		for _, c := range chunk.Choices {
			d := c.Delta
			if d.Content != nil {
				if strings.Contains(*d.Content, "<") {
					t.Errorf("content delta %q leaks markup", *d.Content)
				}
				content += *d.Content
			}
			if d.ReasoningContent != nil {
				reasoning += *d.ReasoningContent
			}
			for _, tc := range d.ToolCalls {
				if tc.Index == nil || *tc.Index != 0 {
					t.Errorf("tool call delta without index 0: %s", ev)
				}
				if tc.ID != "" {
					calls++
					id = tc.ID
				}
				name += tc.Function.Name
				args += tc.Function.Arguments
			}
			if c.FinishReason != nil {
				finish = *c.FinishReason
			}
		}
	}
	if reasoning != "\nThe user wants the weather; call get_weather.\n" || content != "\n\n" {
		t.Errorf("reasoning %q content %q", reasoning, content)
	}
	if calls != 1 || id == "" || name != "get_weather" || args != `{"city": "Paris", "days": 3}` {
		t.Errorf("tool call: %d headers, id %q, name %q, arguments %q", calls, id, name, args)
	}
	if finish != "tool_calls" {
		t.Errorf("finish_reason %q, want tool_calls", finish)
	}
}

// TestChatWithoutTools: a request that offers no tools gets the markup as content (the
// reasoning is still separated), finish_reason stop.
func TestChatWithoutTools(t *testing.T) {
	h := newToolHarness(t, qwenToolOutput, "hermes", "qwen3")
	body := map[string]any{"model": "tiny-test", "messages": []map[string]any{{"role": "user", "content": "Hi"}}, "max_tokens": 200}
	var resp toolChatResponse
	h.postJSON("/v1/chat/completions", body, 200, &resp)
	c := resp.Choices[0]
	if c.FinishReason != "stop" || len(c.Message.ToolCalls) != 0 || c.Message.Content == nil || !strings.HasPrefix(*c.Message.Content, "\n\n<tool_call>") {
		t.Errorf("finish %q, message %+v", c.FinishReason, c.Message)
	}
}

func TestUnknownParserRefused(t *testing.T) {
	tok, chat, err := tiny.Load()
	if err != nil {
		t.Fatal(err)
	}
	inner, err := enginetest.New(enginetest.Config{VocabSize: tok.VocabSize()})
	if err != nil {
		t.Fatal(err)
	}
	eng, err := engine.New(inner, engine.Config{Pool: inner.Pool()})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	_, err = New(Config{Engine: eng, Tokenizer: tok, ChatTemplate: chat, Model: "m", ToolCallParser: "pythonic"})
	if err == nil || !strings.Contains(err.Error(), "hermes") || !strings.Contains(err.Error(), "llama3_json") {
		t.Errorf("unknown parser: %v", err)
	}
}

// TestChatToolCallsUseToolTypes: qwen3_coder reads parameter types from the request's
// tool definitions (days is an integer there, city a string).
func TestChatToolCallsUseToolTypes(t *testing.T) {
	out := "<tool_call>\n<function=get_weather>\n<parameter=city>\n42 Paris\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"
	h := newToolHarness(t, out, "qwen3_coder", "")
	body := map[string]any{"model": "tiny-test", "messages": []map[string]any{{"role": "user", "content": "Weather?"}},
		"tools": []json.RawMessage{weatherTool}, "max_tokens": 200}
	var resp toolChatResponse
	h.postJSON("/v1/chat/completions", body, 200, &resp)
	c := resp.Choices[0]
	if c.FinishReason != "tool_calls" || len(c.Message.ToolCalls) != 1 || c.Message.ToolCalls[0].Function.Arguments != `{"city": "42 Paris", "days": 3}` {
		t.Errorf("finish %q, tool_calls %+v", c.FinishReason, c.Message.ToolCalls)
	}
}
