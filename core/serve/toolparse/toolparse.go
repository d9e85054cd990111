package toolparse

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// ToolCall is one entry of an OpenAI message's tool_calls.
type ToolCall struct {
	ID       string   `json:"id"`
	Type     string   `json:"type"`
	Function Function `json:"function"`
}

// Function is a tool call's function name and JSON arguments.
type Function struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// ToolCallDelta is one entry of a streamed chunk's delta.tool_calls: the first for a call
// carries its id, type and name, the following ones pieces of its arguments.
type ToolCallDelta struct {
	Index    int           `json:"index"`
	ID       string        `json:"id,omitempty"`
	Type     string        `json:"type,omitempty"`
	Function FunctionDelta `json:"function"`
}

// FunctionDelta is the function part of a ToolCallDelta.
type FunctionDelta struct {
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments"`
}

// Delta is what one piece of generated text adds to the message.
type Delta struct {
	Content   string
	Reasoning string
	ToolCalls []ToolCallDelta
}

// Empty reports whether d adds nothing.
func (d Delta) Empty() bool {
	return d.Content == "" && d.Reasoning == "" && len(d.ToolCalls) == 0
}

// Result is a whole parsed generation.
type Result struct {
	Content   string
	Reasoning string
	ToolCalls []ToolCall
}

// Append adds a streamed delta to r.
func (r *Result) Append(d Delta) {
	r.Content += d.Content
	r.Reasoning += d.Reasoning
	for _, c := range d.ToolCalls {
		for len(r.ToolCalls) <= c.Index {
			r.ToolCalls = append(r.ToolCalls, ToolCall{Type: "function"})
		}
		t := &r.ToolCalls[c.Index]
		if c.ID != "" {
			t.ID = c.ID
		}
		t.Function.Name += c.Function.Name
		t.Function.Arguments += c.Function.Arguments
	}
}

// toolFormats are the tool-call parsers by their vLLM names.
var toolFormats = map[string]func(tools []json.RawMessage) format{
	"hermes":       newHermes,
	"llama3_json":  newLlama3JSON,
	"deepseek_v3":  newDeepseek(false),
	"deepseek_v31": newDeepseek(true),
	"deepseek_v4":  newDSML,
	"mistral":      newMistral,
	"qwen3_coder":  newQwen3Coder,
}

// reasoningFormats are the reasoning parsers by their vLLM names.
var reasoningFormats = map[string]reasoningFormat{
	"qwen3":       {startsThinking: false},
	"deepseek_r1": {startsThinking: true},
	"deepseek_v4": {startsThinking: false}, // its template opens <think> in the prompt in thinking mode
}

// ToolParsers lists the tool-call parser names New accepts.
func ToolParsers() []string { return slices.Sorted(maps.Keys(toolFormats)) }

// ReasoningParsers lists the reasoning parser names New accepts.
func ReasoningParsers() []string { return slices.Sorted(maps.Keys(reasoningFormats)) }

// Parser reads tool calls and reasoning out of generations.
type Parser struct {
	tools     func(tools []json.RawMessage) format // nil: no tool parsing
	toolName  string
	reasoning *reasoningFormat // nil: no reasoning parsing
	// NewID makes tool call ids (default "chatcmpl-tool-" and 32 random hex digits, as
	// vLLM's).
	NewID func() string
}

// New returns the parser for a tool-call format and a reasoning format, each by name;
// "" leaves that part out. An unknown name is an error that lists the known ones.
func New(toolParser, reasoningParser string) (*Parser, error) {
	p := &Parser{NewID: randomID}
	if toolParser != "" {
		f, ok := toolFormats[toolParser]
		if !ok {
			return nil, fmt.Errorf("unknown tool-call parser %q (known: %s)", toolParser, strings.Join(ToolParsers(), ", "))
		}
		p.tools, p.toolName = f, toolParser
	}
	if reasoningParser != "" {
		f, ok := reasoningFormats[reasoningParser]
		if !ok {
			return nil, fmt.Errorf("unknown reasoning parser %q (known: %s)", reasoningParser, strings.Join(ReasoningParsers(), ", "))
		}
		p.reasoning = &f
	}
	return p, nil
}

// ToolFormat is the name of p's tool-call format ("" without one).
func (p *Parser) ToolFormat() string {
	if p == nil {
		return ""
	}
	return p.toolName
}

// ParsesTools reports whether p has a tool-call format.
func (p *Parser) ParsesTools() bool { return p != nil && p.tools != nil }

// KeepsSpecialTokens reports whether the tool-call format's markers are special tokens
// (mistral's [TOOL_CALLS]), which the detokenizer must then keep in the text when tools
// are offered (vLLM's parsers set skip_special_tokens=False for that).
func (p *Parser) KeepsSpecialTokens() bool {
	return p.ParsesTools() && p.toolName == "mistral"
}

// ParsesReasoning reports whether p has a reasoning format.
func (p *Parser) ParsesReasoning() bool { return p != nil && p.reasoning != nil }

// Parse reads a whole generation. prompt is the rendered prompt (a reasoning parser
// looks at whether it opens <think>); tools are the tool definitions the request offers
// in the OpenAI shape (tool calls are looked for only when there are some, as vLLM does;
// qwen3_coder reads the parameters' types from them).
func (p *Parser) Parse(prompt, text string, tools []json.RawMessage) Result {
	s := p.NewStream(prompt, tools)
	var r Result
	r.Append(s.Add(text))
	r.Append(s.Flush())
	return r
}

// NewStream starts parsing one generation delta by delta.
func (p *Parser) NewStream(prompt string, tools []json.RawMessage) *Stream {
	s := &Stream{}
	if p.reasoning != nil {
		s.reasoning = p.reasoning.start(prompt)
	}
	if len(tools) > 0 && p.tools != nil {
		newID := p.NewID
		if newID == nil {
			newID = randomID
		}
		s.tools = &toolStream{format: p.tools(tools), newID: newID}
	}
	return s
}

// Stream parses one generation as it arrives.
type Stream struct {
	reasoning *reasoningStream
	tools     *toolStream
}

// Add reads the next piece of generated text.
func (s *Stream) Add(text string) Delta { return s.step(text, false) }

// Flush ends the generation and returns what was held back.
func (s *Stream) Flush() Delta { return s.step("", true) }

func (s *Stream) step(text string, final bool) Delta {
	var d Delta
	content := text
	if s.reasoning != nil {
		d.Reasoning, content = s.reasoning.add(text, final)
	}
	if s.tools == nil {
		d.Content = content
		return d
	}
	d.Content, d.ToolCalls = s.tools.add(content, final)
	return d
}

// ToolsCalled reports whether the stream has emitted a tool call.
func (s *Stream) ToolsCalled() bool { return s.tools != nil && s.tools.called > 0 }

func randomID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return "chatcmpl-tool-" + hex.EncodeToString(b[:])
}

// holdBack returns how many bytes at the end of s could begin marker: they are held back
// until the next text says whether the marker follows.
func holdBack(s, marker string) int {
	for n := min(len(marker)-1, len(s)); n > 0; n-- {
		if strings.HasSuffix(s, marker[:n]) {
			return n
		}
	}
	return 0
}
