package serve

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/tokenizer"
)

func TestChatMessagesKeepJSONOrderForTemplates(t *testing.T) {
	var req chatRequest
	body := `{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
		{"role":"assistant","content":null,"tool_calls":[{"type":"function","function":{"name":"f","arguments":{"z":1,"a":2}}}]}],
		"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{}}}}]}`
	if err := json.Unmarshal([]byte(body), &req); err != nil {
		t.Fatal(err)
	}
	msgs, err := chatMessages(req.Messages)
	if err != nil {
		t.Fatal(err)
	}
	tmpl, err := tokenizer.NewChatTemplate(`{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% if m.tool_calls %}{{ m.tool_calls[0].function.arguments | tojson }}{% endif %}{% endfor %}{{ tools[0] | tojson }}`)
	if err != nil {
		t.Fatal(err)
	}
	var tools []any
	for _, x := range req.Tools {
		tools = append(tools, x)
	}
	out, err := tmpl.Render(msgs, tokenizer.ChatOptions{Tools: tools})
	if err != nil {
		t.Fatal(err)
	}
	want := `[user:a
b][assistant:]{"z": 1, "a": 2}{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}`
	if out != want {
		t.Fatalf("rendered\n%s\nwant\n%s", out, want)
	}
}

// TestDeveloperRoleIsSystem: a "developer" message (what OpenAI's newer clients send for
// the system prompt) renders as the system message unless the chat template names the
// role. Before, the tiny (ChatML) template got a "developer" turn, which its models never
// saw, and added its default system prompt beside it.
func TestDeveloperRoleIsSystem(t *testing.T) {
	rendered := func(h *harness, role string) string {
		t.Helper()
		var out struct {
			Tokens []int32 `json:"tokens"`
		}
		h.postJSON("/tokenize", map[string]any{"messages": []any{
			map[string]any{"role": role, "content": "Answer in French."}, map[string]any{"role": "user", "content": "hi"}}}, 200, &out)
		return h.tok.Decode(out.Tokens, false)
	}
	h := newHarness(t, harnessOpts{})
	dev, sys := rendered(h, "developer"), rendered(h, "system")
	if dev != sys || strings.Contains(dev, "developer") {
		t.Fatalf("developer message rendered\n%q\nwant it as the system message\n%q", dev, sys)
	}
	var chat struct {
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
		} `json:"usage"`
	}
	h.postJSON("/v1/chat/completions", map[string]any{"messages": []any{map[string]any{"role": "developer", "content": "Answer in French."},
		map[string]any{"role": "user", "content": "hi"}}, "max_tokens": 1}, 200, &chat)
	if n, err := h.tok.Encode(sys, false); err != nil || chat.Usage.PromptTokens != len(n) {
		t.Fatalf("chat prompt of a developer message: %d tokens, want the system message's %d (%v)", chat.Usage.PromptTokens, len(n), err)
	}

	tmpl, err := tokenizer.NewChatTemplate(`{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}{# roles: system, developer, user #}`)
	if err != nil {
		t.Fatal(err)
	}
	h = newHarness(t, harnessOpts{cfg: func(c *Config) { c.ChatTemplate = tmpl }})
	if got := rendered(h, "developer"); got != "<developer>Answer in French.<user>hi" {
		t.Fatalf("a template that names the developer role rendered %q", got)
	}
}

// TestReasoningEffortReachesTemplate: reasoning_effort becomes the chat template's
// reasoning_effort and enable_thinking (false for "none"), as vLLM passes it, unless
// chat_template_kwargs sets them; a value outside OpenAI's and vLLM's is 400 naming the
// field. Before, it was accepted and ignored: DeepSeek V4's and GLM 5's templates, which
// read it, thought at their default effort whatever the client asked.
func TestReasoningEffortReachesTemplate(t *testing.T) {
	tmpl, err := tokenizer.NewChatTemplate(`{% for m in messages %}{{ m.content }}{% endfor %}<{{ reasoning_effort }}/{{ enable_thinking }}>`)
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, harnessOpts{cfg: func(c *Config) { c.ChatTemplate = tmpl }})
	// prompt rebuilds the rendered prompt from its prompt logprobs (every token but the
	// first, which has none).
	prompt := func(extra map[string]any) string {
		t.Helper()
		body := map[string]any{"messages": []any{map[string]any{"role": "user", "content": "hi there"}}, "max_tokens": 1, "prompt_logprobs": 0}
		for k, v := range extra {
			body[k] = v
		}
		var out struct {
			PromptLogprobs []map[string]struct {
				DecodedToken string `json:"decoded_token"`
			} `json:"prompt_logprobs"`
		}
		h.postJSON("/v1/chat/completions", body, 200, &out)
		var b strings.Builder
		for _, m := range out.PromptLogprobs {
			for _, e := range m {
				b.WriteString(e.DecodedToken)
			}
		}
		return b.String()
	}
	for _, c := range []struct {
		extra map[string]any
		want  string
	}{
		{nil, "</>"},
		{map[string]any{"reasoning_effort": "high"}, "<high/True>"},
		{map[string]any{"reasoning_effort": "none"}, "<none/False>"},
		{map[string]any{"reasoning_effort": "low", "chat_template_kwargs": map[string]any{"enable_thinking": false}}, "<low/False>"},
	} {
		if got := prompt(c.extra); !strings.HasSuffix(got, c.want) {
			t.Errorf("%v: the prompt ends %q, want %q", c.extra, got, c.want)
		}
	}
	code, raw := h.post("/v1/chat/completions", map[string]any{"messages": []any{map[string]any{"role": "user", "content": "hi"}}, "reasoning_effort": "extreme", "max_tokens": 1})
	var e errorResp
	if code != 400 || json.Unmarshal(raw, &e) != nil || e.Error.Param == nil || *e.Error.Param != "reasoning_effort" {
		t.Fatalf("reasoning_effort extreme: %d %s, want 400 naming reasoning_effort", code, raw)
	}
}
