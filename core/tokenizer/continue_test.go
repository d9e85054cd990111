package tokenizer

import (
	"strings"
	"testing"
)

// TestContinueFinalMessage: the prompt ends with the final message's content, its
// end-of-turn markup cut, as transformers' continue_final_message renders it; with
// add_generation_prompt too, or nothing to continue, Render refuses.
func TestContinueFinalMessage(t *testing.T) {
	const chatml = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content | trim }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
	const keeps = `{% for m in messages %}[{{ m.role }}]{{ m.content }}[end]{% endfor %}`
	for _, c := range []struct {
		name, tmpl string
		final      any
		want       string
	}{
		{"trimmed by the template", chatml, "The answer is ", "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nThe answer is"},
		{"spaces kept", keeps, " The answer is ", "[user]hi[end][assistant] The answer is "},
		{"parts", keeps, []any{map[string]any{"type": "text", "text": "A"}, map[string]any{"type": "text", "text": "B"}}, ""},
	} {
		ct, err := NewChatTemplate(c.tmpl)
		if err != nil {
			t.Fatal(err)
		}
		msgs := []map[string]any{{"role": "user", "content": "hi"}, {"role": "assistant", "content": c.final}}
		got, err := ct.Render(msgs, ChatOptions{ContinueFinalMessage: true})
		if c.want == "" {
			// Parts the template prints as a list: the last part's text is looked for.
			if err != nil || !strings.HasSuffix(got, "B") {
				t.Errorf("%s: %q, %v; want the prompt to end with the last part's text", c.name, got, err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%s: %q, %v; want %q", c.name, got, err, c.want)
		}
	}
	ct, err := NewChatTemplate(chatml)
	if err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]struct {
		msgs []map[string]any
		opts ChatOptions
		want string
	}{
		"with add_generation_prompt": {[]map[string]any{{"role": "assistant", "content": "x"}}, ChatOptions{ContinueFinalMessage: true, AddGenerationPrompt: true}, "exclude each other"},
		"empty final message":        {[]map[string]any{{"role": "assistant", "content": " "}}, ChatOptions{ContinueFinalMessage: true}, "empty"},
		"no messages":                {nil, ChatOptions{ContinueFinalMessage: true}, "final message"},
	} {
		if _, err := ct.Render(c.msgs, c.opts); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one saying %q", name, err, c.want)
		}
	}
	hidden, err := NewChatTemplate(`{% for m in messages %}{% if m.role == 'user' %}{{ m.content }}{% endif %}{% endfor %}`)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := hidden.Render([]map[string]any{{"role": "user", "content": "hi"}, {"role": "assistant", "content": "prefill"}}, ChatOptions{ContinueFinalMessage: true}); err == nil || !strings.Contains(err.Error(), "does not appear") {
		t.Errorf("a template that drops the final message: %v, want an error", err)
	}
}
