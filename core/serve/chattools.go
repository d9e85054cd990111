package serve

import (
	"bytes"
	"encoding/json"

	"github.com/resin-llm/resin/core/serve/toolparse"
)

// chatParser applies the server's tool-call and reasoning parsers (Config.ToolCallParser,
// Config.ReasoningParser) to one chat generation. A nil one passes the text through as
// content, so the chat handlers read the same either way.
type chatParser struct {
	stream *toolparse.Stream
}

// newChatParser starts parsing a generation for req, whose rendered prompt is prompt. Tool
// calls are looked for only when the request offers tools and tool_choice is not "none",
// as vLLM does; nil when the server has no parser.
func (s *Server) newChatParser(req *chatRequest, prompt string) *chatParser {
	if !s.parser.ParsesTools() && !s.parser.ParsesReasoning() {
		return nil
	}
	var tools []json.RawMessage
	if offersTools(req) {
		tools = req.Tools
	}
	return &chatParser{stream: s.parser.NewStream(prompt, tools)}
}

// keepSpecialTokens reports whether req's generations must keep special tokens in their
// text because the tool-call markers are special tokens (mistral's [TOOL_CALLS]).
func (s *Server) keepSpecialTokens(req *chatRequest) bool {
	return s.parser.KeepsSpecialTokens() && offersTools(req)
}

// offersTools reports whether tool calls are looked for in req's generations.
func offersTools(req *chatRequest) bool {
	return len(req.Tools) > 0 && string(bytes.TrimSpace(req.ToolChoice)) != `"none"`
}

// fill replaces a whole choice's content with what the parsers read from it: content,
// reasoning_content and tool_calls, and finish_reason "tool_calls" when there are calls.
func (p *chatParser) fill(c *chatChoice) {
	if p == nil {
		return
	}
	var r toolparse.Result
	r.Append(p.stream.Add(c.Message.Content))
	r.Append(p.stream.Flush())
	c.Message.Content = r.Content
	if r.Reasoning != "" {
		c.Message.ReasoningContent = &r.Reasoning
	}
	c.Message.ToolCalls = r.ToolCalls
	if len(r.ToolCalls) > 0 {
		c.FinishReason = "tool_calls"
	}
}

// delta turns a streamed piece of text into a chunk's delta; ok is false when the piece
// adds nothing yet (held back as possible markup).
func (p *chatParser) delta(text string) (d chatDelta, ok bool) {
	if p == nil {
		return chatDelta{Content: &text}, text != ""
	}
	return deltaOf(p.stream.Add(text))
}

// flush ends the stream: the delta held back, if any, and the finish reason to report.
func (p *chatParser) flush(finish string) (*chatDelta, string) {
	if p == nil {
		return nil, finish
	}
	d, ok := deltaOf(p.stream.Flush())
	if p.stream.ToolsCalled() {
		finish = "tool_calls"
	}
	if !ok {
		return nil, finish
	}
	return &d, finish
}

func deltaOf(pd toolparse.Delta) (chatDelta, bool) {
	var d chatDelta
	if pd.Content != "" {
		d.Content = &pd.Content
	}
	if pd.Reasoning != "" {
		d.ReasoningContent = &pd.Reasoning
	}
	d.ToolCalls = pd.ToolCalls
	return d, !pd.Empty()
}
