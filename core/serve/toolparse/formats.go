package toolparse

import "strings"

// hermes is <tool_call>{"name": ..., "arguments": {...}}</tool_call>, one block a call;
// the content is the text before the first block, text between and after blocks is
// dropped (vLLM's hermes parser).
type hermes struct{}

const (
	hermesStart = "<tool_call>"
	hermesEnd   = "</tool_call>"
)

func (hermes) scan(text string, final bool) scanned {
	first := strings.Index(text, hermesStart)
	if first < 0 {
		if final {
			return scanned{content: text}
		}
		return scanned{content: text[:len(text)-holdBack(text, hermesStart)]}
	}
	r := scanned{content: text[:first]}
	rest := text[first:]
	for {
		i := strings.Index(rest, hermesStart)
		if i < 0 {
			break
		}
		body := rest[i+len(hermesStart):]
		end := strings.Index(body, hermesEnd)
		if end >= 0 {
			body = body[:end]
		}
		c, _ := jsonCall(body)
		r.calls = append(r.calls, c)
		if end < 0 {
			break
		}
		rest = rest[i+len(hermesStart)+end+len(hermesEnd):]
	}
	return r
}

// llama3JSON is Llama 3.1's JSON tool calling: the whole output is
// {"name": ..., "parameters": {...}}, maybe after <|python_tag|>, several calls
// separated by ';'. Any other output is content.
type llama3JSON struct{}

const pythonTag = "<|python_tag|>"

func (llama3JSON) scan(text string, final bool) scanned {
	s := text[skipSpace(text, 0):]
	switch {
	case strings.HasPrefix(s, pythonTag):
		s = s[len(pythonTag):]
	case strings.HasPrefix(s, "{"):
	case !final && (s == "" || strings.HasPrefix(pythonTag, s)):
		return scanned{} // cannot tell yet
	default:
		return scanned{content: text}
	}
	var r scanned
	for {
		s = s[skipSpace(s, 0):]
		if s == "" || s[0] != '{' {
			return r
		}
		c, end := jsonCall(s)
		r.calls = append(r.calls, c)
		if end < 0 {
			return r
		}
		s = s[end:]
		s = s[skipSpace(s, 0):]
		if !strings.HasPrefix(s, ";") {
			return r
		}
		s = s[1:]
	}
}

// deepseek is DeepSeek's tool-call block. V3 (and R1):
//
//	<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME
//	```json
//	ARGS
//	```<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>
//
// V3.1: <｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>. The content is the
// text before the block.
type deepseek struct{ v31 bool }

const (
	dsCallsBegin = "<｜tool▁calls▁begin｜>"
	dsCallBegin  = "<｜tool▁call▁begin｜>"
	dsSep        = "<｜tool▁sep｜>"
	dsCallEnd    = "<｜tool▁call▁end｜>"
	dsArgsOpen   = "```json\n"
	dsArgsClose  = "\n```"
)

func (f deepseek) scan(text string, final bool) scanned {
	first := strings.Index(text, dsCallsBegin)
	if first < 0 {
		if final {
			return scanned{content: text}
		}
		return scanned{content: text[:len(text)-holdBack(text, dsCallsBegin)]}
	}
	r := scanned{content: text[:first]}
	rest := text[first+len(dsCallsBegin):]
	for {
		i := strings.Index(rest, dsCallBegin)
		if i < 0 {
			return r
		}
		after := rest[i+len(dsCallBegin):]
		end := strings.Index(after, dsCallEnd)
		if end < 0 {
			r.calls = append(r.calls, f.call(after, false))
			return r
		}
		r.calls = append(r.calls, f.call(after[:end], true))
		rest = after[end+len(dsCallEnd):]
	}
}

// call reads one call's body (between call begin and call end; closed says the end was
// seen).
func (f deepseek) call(body string, closed bool) partialCall {
	var c partialCall
	sep := strings.Index(body, dsSep)
	if sep < 0 {
		return c
	}
	head, tail := body[:sep], body[sep+len(dsSep):]
	if f.v31 {
		c.name = strings.TrimSpace(head)
		if !closed {
			// The arguments run to the call end marker; hold back a partial one.
			c.args = tail[:len(tail)-holdBack(tail, dsCallEnd)]
			return c
		}
		c.args, c.argsDone = tail, true
		c.valid = c.name != ""
		return c
	}
	nl := strings.IndexByte(tail, '\n')
	if nl < 0 {
		return c
	}
	c.name = strings.TrimSpace(tail[:nl])
	after := tail[nl+1:]
	if !strings.HasPrefix(after, dsArgsOpen) {
		return c
	}
	args := after[len(dsArgsOpen):]
	if j := strings.Index(args, dsArgsClose); j >= 0 {
		c.args, c.argsDone = args[:j], true
		c.valid = closed && c.name != ""
		return c
	}
	c.args = args[:len(args)-holdBack(args, dsArgsClose)]
	return c
}
