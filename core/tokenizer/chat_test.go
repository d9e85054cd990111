package tokenizer

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// TestContentParts: content given as a list of parts reaches a template that prints
// content as the text parts joined with newlines (vLLM's "string" format), and a template
// that loops over content as the list ("openai"); neither sees a Python repr.
func TestContentParts(t *testing.T) {
	parts := []any{map[string]any{"type": "text", "text": "Describe"}, map[string]any{"type": "image_url", "image_url": map[string]any{"url": "u"}},
		map[string]any{"type": "text", "text": "briefly."}}
	raw := json.RawMessage(`[{"type": "text", "text": "Describe"}, {"type": "image_url", "image_url": {"url": "u"}}, {"type": "text", "text": "briefly."}]`)
	cases := []struct {
		template string
		format   ContentFormat
		want     string
	}{
		{`{% for m in messages %}[{{ m.content }}]{% endfor %}`, ContentString, "[Describe\nbriefly.]"},
		{`{% for m in messages %}{% for p in m.content %}<{{ p.type }}>{% endfor %}{% endfor %}`, ContentOpenAI, "<text><image_url><text>"},
		{`{% for m in messages %}{% for p in m['content'] %}{{ p.text }}{% endfor %}{% endfor %}`, ContentOpenAI, "Describebriefly."},
	}
	for _, c := range cases {
		ct, err := NewChatTemplate(c.template)
		if err != nil {
			t.Fatal(err)
		}
		if ct.ContentFormat() != c.format {
			t.Errorf("%s: format %s, want %s", c.template, ct.ContentFormat(), c.format)
		}
		for _, content := range []any{parts, raw} {
			got, err := ct.Render([]map[string]any{{"role": "user", "content": content}}, ChatOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if got != c.want {
				t.Errorf("%s with %T: got %q, want %q", c.template, content, got, c.want)
			}
		}
	}
}

// TestReasoningAliases: as transformers does, a message's reasoning under any of its
// names reaches the template as both reasoning_content and thinking.
func TestReasoningAliases(t *testing.T) {
	ct, err := NewChatTemplate(`{% for m in messages %}{{ m.reasoning_content }}|{{ m.thinking }}|{{ m|tojson }}{% endfor %}`)
	if err != nil {
		t.Fatal(err)
	}
	for _, field := range []string{"reasoning_content", "thinking", "reasoning"} {
		msg := json.RawMessage(`{"role": "assistant", "content": "4", "` + field + `": "2+2"}`)
		var m map[string]json.RawMessage
		if err := json.Unmarshal(msg, &m); err != nil {
			t.Fatal(err)
		}
		got, err := ct.Render([]map[string]any{{"role": m["role"], "content": m["content"], field: m[field]}}, ChatOptions{})
		if err != nil {
			t.Fatal(err)
		}
		want := `2+2|2+2|{"thinking": "2+2", "content": "4", ` + map[string]string{
			"reasoning_content": `"reasoning_content": "2+2", "role": "assistant"}`,
			"thinking":          `"role": "assistant", "reasoning_content": "2+2"}`,
			"reasoning":         `"reasoning": "2+2", "role": "assistant", "reasoning_content": "2+2"}`,
		}[field]
		if got != want {
			t.Errorf("%s:\n got  %s\n want %s", field, got, want)
		}
	}
}

// TestToolsNoneWhenAbsent: transformers passes tools=None and documents=None, so
// `tools is defined` holds and `tools is none` too.
func TestToolsNoneWhenAbsent(t *testing.T) {
	ct, err := NewChatTemplate(`{{ tools is defined }} {{ tools is none }} {{ documents is none }}`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := ct.Render(nil, ChatOptions{})
	if err != nil || got != "True True True" {
		t.Errorf("got %q, %v", got, err)
	}
}

// TestLoadChatTemplateFiles: as transformers loads a model directory, chat_template.jinja
// and additional_chat_templates/ win over the config's entry, and the "tool_use" template
// renders when tools are given.
func TestLoadChatTemplateFiles(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cfg := filepath.Join(dir, "tokenizer_config.json")
	write("tokenizer_config.json", `{"bos_token": "<s>", "chat_template": [{"name": "default", "template": "config {{ bos_token }}"},
		{"name": "tool_use", "template": "config tools {{ tools|length }}"}]}`)
	render := func(tools []any) string {
		t.Helper()
		ct, err := LoadChatTemplate(cfg)
		if err != nil {
			t.Fatal(err)
		}
		out, err := ct.Render(nil, ChatOptions{Tools: tools})
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	tools := []any{json.RawMessage(`{"type": "function", "function": {"name": "f"}}`)}
	if got := render(nil); got != "config <s>" {
		t.Errorf("default from the config: %q", got)
	}
	if got := render(tools); got != "config tools 1" {
		t.Errorf("tool_use from the config: %q", got)
	}
	write("chat_template.jinja", "file {{ bos_token }}")
	if got := render(tools); got != "file <s>" {
		t.Errorf("chat_template.jinja wins over the config (no tool_use file): %q", got)
	}
	write("additional_chat_templates/tool_use.jinja", "file tools")
	if got := render(tools); got != "file tools" {
		t.Errorf("additional_chat_templates/tool_use.jinja with tools: %q", got)
	}
	if err := os.Remove(cfg); err != nil {
		t.Fatal(err)
	}
	if got := render(nil); got != "file " {
		t.Errorf("without a tokenizer_config.json: %q", got)
	}
}
