package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"
	"unicode"

	"github.com/resin-llm/resin/core/tokenizer/internal/jinja"
)

// ChatTemplate renders a conversation into a prompt with the Jinja chat template of a
// tokenizer_config.json, as transformers' apply_chat_template does.
type ChatTemplate struct {
	source string
	tmpl   *jinja.Template
	tokens map[string]string // bos_token, eos_token, ... as the template sees them
	format ContentFormat
	// toolUse is the model's "tool_use" template, which transformers renders instead
	// when tools are given; nil when there is none.
	toolUse *ChatTemplate
}

// ContentFormat is how a template receives a message content given as a list of parts,
// decided as vLLM's --chat-template-content-format auto does.
type ContentFormat string

const (
	// ContentString joins the text parts with newlines into one string: templates that
	// print message.content would otherwise print the list's Python repr.
	ContentString ContentFormat = "string"
	// ContentOpenAI passes the list of parts ({"type": "text", "text": ...}) through,
	// for templates that loop over a message's content.
	ContentOpenAI ContentFormat = "openai"
)

// loopsOverContent finds `{% for x in message.content %}` or `in message['content']`.
var loopsOverContent = regexp.MustCompile(`\{%-?\s*for\s+\w+\s+in\s+\w+(?:\.content\b|\[\s*['"]content['"]\s*\])`)

// ChatOptions are the variables besides messages that chat templates read.
type ChatOptions struct {
	// AddGenerationPrompt appends the header that opens the assistant's turn.
	AddGenerationPrompt bool
	// ContinueFinalMessage leaves the final message open, the prompt ending with its
	// content (no end-of-turn markup after it), so that the model continues it: a
	// "prefill" of the answer, as transformers' continue_final_message. It excludes
	// AddGenerationPrompt.
	ContinueFinalMessage bool
	// Tools are function descriptions in the OpenAI JSON shape, or nil. Give each as
	// json.RawMessage to keep its key order in `tojson` output, as transformers does.
	Tools []any
	// Extra holds further template variables (for example enable_thinking).
	Extra map[string]any
	// DecodeToolArguments gives the template each assistant tool call's
	// function.arguments as a mapping, as vLLM does before rendering: a JSON string is
	// decoded, anything that is not an object becomes {}; an empty tool_calls list is
	// dropped. OpenAI clients send arguments as strings, tool-calling templates expect
	// mappings (transformers' documentation).
	DecodeToolArguments bool
	// Now is the clock the template's strftime_now reads (nil: time.Now). Set it to
	// render a prompt that names today's date reproducibly.
	Now func() time.Time
}

// NewChatTemplate compiles a Jinja chat template.
func NewChatTemplate(source string) (*ChatTemplate, error) {
	tmpl, err := jinja.Compile(source)
	if err != nil {
		return nil, fmt.Errorf("compile chat template: %w", err)
	}
	format := ContentString
	if loopsOverContent.MatchString(source) {
		format = ContentOpenAI
	}
	return &ChatTemplate{source: source, tmpl: tmpl, tokens: map[string]string{}, format: format}, nil
}

// Source returns the template text.
func (c *ChatTemplate) Source() string { return c.source }

// ContentFormat reports how the template receives content given as a list of parts.
func (c *ChatTemplate) ContentFormat() ContentFormat { return c.format }

// SetSpecialToken sets a variable such as bos_token that the template reads.
func (c *ChatTemplate) SetSpecialToken(name, content string) { c.tokens[name] = content }

// Render formats messages (each a map with "role" and "content", and whatever else the
// template reads, such as "tool_calls") into a prompt string, as transformers'
// apply_chat_template does: tools and documents are none when absent, and a message's
// reasoning_content, thinking or reasoning is also given as reasoning_content and
// thinking. Values may be json.RawMessage, which keeps JSON key order and number
// spelling. Content given as a list of parts follows ContentFormat.
func (c *ChatTemplate) Render(messages []map[string]any, opts ChatOptions) (out string, err error) {
	if opts.ContinueFinalMessage {
		if opts.AddGenerationPrompt {
			return "", errors.New("render chat template: continue_final_message and add_generation_prompt exclude each other")
		}
		final, err := finalText(messages)
		if err != nil {
			return "", err
		}
		opts.ContinueFinalMessage = false
		out, err := c.Render(messages, opts)
		if err != nil {
			return "", err
		}
		return continueFinal(out, final)
	}
	if opts.Tools != nil && c.toolUse != nil {
		return c.toolUse.Render(messages, opts)
	}
	defer func() {
		// A template is data from a model's files: a fault in the engine that it reaches
		// fails the render, not the process.
		if r := recover(); r != nil {
			out, err = "", fmt.Errorf("render chat template: internal error: %v", r)
		}
	}()
	data := make(map[string]jinja.Value, len(c.tokens)+len(opts.Extra)+3)
	for k, v := range c.tokens {
		data[k] = jinja.NewString(v)
	}
	for k, v := range opts.Extra {
		val, err := toValue(v)
		if err != nil {
			return "", fmt.Errorf("render chat template: %s: %w", k, err)
		}
		data[k] = val
	}
	msgs, err := toValue(messages)
	if err != nil {
		return "", fmt.Errorf("render chat template: messages: %w", err)
	}
	data["messages"] = prepareMessages(msgs, c.format, opts.DecodeToolArguments)
	data["add_generation_prompt"] = jinja.NewBool(opts.AddGenerationPrompt)
	if opts.Now != nil {
		data["strftime_now"] = jinja.StrftimeNow(opts.Now)
	}
	for _, k := range []string{"tools", "documents"} {
		if _, ok := data[k]; !ok {
			data[k] = jinja.None()
		}
	}
	if opts.Tools != nil {
		tools, err := toValue(opts.Tools)
		if err != nil {
			return "", fmt.Errorf("render chat template: tools: %w", err)
		}
		data["tools"] = tools
	}
	out, err = c.tmpl.RenderValues(data)
	if err != nil {
		return "", fmt.Errorf("render chat template: %w", err)
	}
	return out, nil
}

// tokenContent reads a special token written as "..." or as {"content": "..."}.
func tokenContent(raw json.RawMessage) (string, bool) {
	if isNull(raw) {
		return "", false
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, true
	}
	var obj struct {
		Content string `json:"content"`
	}
	if err := json.Unmarshal(raw, &obj); err == nil && obj.Content != "" {
		return obj.Content, true
	}
	return "", false
}

// finalText is the text of the last message, the one ContinueFinalMessage leaves open: its
// content, or the last text part of a content given as parts.
func finalText(messages []map[string]any) (string, error) {
	if len(messages) == 0 {
		return "", errors.New("render chat template: continue_final_message needs a final message")
	}
	switch c := messages[len(messages)-1]["content"].(type) {
	case string:
		return c, nil
	case []any:
		for i := len(c) - 1; i >= 0; i-- {
			if part, ok := c[i].(map[string]any); ok {
				if text, ok := part["text"].(string); ok {
					return text, nil
				}
			}
		}
	}
	return "", errors.New("render chat template: continue_final_message: the final message has no text to continue")
}

// continueFinal cuts the rendered prompt just after the final message's content, as
// transformers does: at the last place its trimmed text appears, keeping the message's
// leading and trailing spaces where the template kept them.
func continueFinal(rendered, final string) (string, error) {
	trimmed := strings.TrimSpace(final)
	if trimmed == "" {
		return "", errors.New("render chat template: continue_final_message: the final message is empty")
	}
	at := strings.LastIndex(rendered, trimmed)
	if at < 0 {
		return "", errors.New("render chat template: continue_final_message: the final message does not appear in the rendered prompt")
	}
	if kept := strings.TrimLeftFunc(final, unicode.IsSpace); strings.HasPrefix(rendered[at:], kept) {
		return rendered[:at+len(kept)], nil
	}
	return rendered[:at+len(trimmed)], nil
}
