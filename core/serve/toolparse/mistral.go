package toolparse

import (
	"encoding/json"
	"strings"
)

// mistral is Mistral's tool calling, in both of its forms:
//
//	[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]search[ARGS]{...}
//	[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, ...]
//
// the first from tokenizers of version 11 on (Mistral Small 3.2, Ministral 3, Mistral
// Medium 3.5; a [CALL_ID]id between name and [ARGS] is skipped), the second before. The
// content is the text before the first [TOOL_CALLS]. [TOOL_CALLS] is a special token, so
// the server keeps special tokens in the text when this parser reads it
// (Parser.KeepsSpecialTokens).
type mistral struct {
	first markerSearch
	at    int // index of the first [TOOL_CALLS], -1 before
	calls []mistralCall
	array *mistralArray // the older form, once seen
}

type mistralCall struct {
	start int // index after [TOOL_CALLS]
	args  int // index of the arguments; -1 before the name, -2 before the arguments start
	val   valueScanner
	pos   int // where the arguments' scan continues
	end   int // index after the arguments; -1 before
	call  partialCall
}

// mistralArray is the older form: a JSON array of call objects.
type mistralArray struct {
	objects []llamaObject
}

const (
	mistralCalls  = "[TOOL_CALLS]"
	mistralArgs   = "[ARGS]"
	mistralCallID = "[CALL_ID]"
)

func newMistral([]json.RawMessage) format { return &mistral{at: -1} }

func (f *mistral) scan(text string, final bool) scanned {
	if f.at < 0 {
		at, content := f.first.findOrContent(text, mistralCalls, final)
		if at < 0 {
			return scanned{content: content}
		}
		f.at = at
		f.calls = append(f.calls, mistralCall{start: at + len(mistralCalls), args: -1, end: -1})
	}
	r := scanned{content: text[:f.at]}
	if f.array == nil {
		lead := skipSpace(text, f.calls[0].start)
		if lead >= len(text) {
			return r
		}
		if text[lead] == '[' {
			f.array = &mistralArray{objects: []llamaObject{{at: lead + 1}}}
		}
	}
	if f.array != nil {
		r.calls = f.array.scan(text)
		return r
	}
	for i := 0; i < len(f.calls); i++ {
		c := &f.calls[i]
		if c.end < 0 {
			c.read(text)
		}
		r.calls = append(r.calls, c.call)
		if c.end >= 0 && i == len(f.calls)-1 && strings.HasPrefix(text[skipSpace(text, c.end):], mistralCalls) {
			f.calls = append(f.calls, mistralCall{start: skipSpace(text, c.end) + len(mistralCalls), args: -1, end: -1})
		}
	}
	return r
}

// read continues reading one name[ARGS]{...} call.
func (c *mistralCall) read(text string) {
	if c.args < 0 {
		i := strings.Index(text[c.start:], mistralArgs)
		if i < 0 {
			return
		}
		name := text[c.start : c.start+i]
		if id := strings.Index(name, mistralCallID); id >= 0 {
			name = name[:id]
		}
		c.call.name = strings.TrimSpace(name)
		c.pos = c.start + i + len(mistralArgs)
		c.args = -2 // the name is read; the arguments start at the next non-space
	}
	if c.args == -2 {
		j := skipSpace(text, c.pos)
		if j >= len(text) {
			return
		}
		c.args, c.pos = j, j
	}
	end := c.val.feed(text, c.pos)
	if end < 0 {
		c.pos = len(text)
		if b := text[c.args]; b == '{' || b == '[' {
			c.call.args = text[c.args:]
		}
		return
	}
	c.end = end
	c.call.args, c.call.argsDone = text[c.args:end], true
	c.call.valid = c.call.name != "" && validJSON(c.call.args)
}

// scan reads the array's call objects so far.
func (a *mistralArray) scan(text string) []partialCall {
	var calls []partialCall
	for i := 0; i < len(a.objects); i++ {
		o := &a.objects[i]
		if st := o.scanner.state; st != closed && st != broken {
			o.call = o.scanner.feed(text[o.at:])
		}
		if o.scanner.state == broken && o.call.name == "" {
			break
		}
		calls = append(calls, o.call)
		if o.scanner.state != closed || i < len(a.objects)-1 {
			continue
		}
		j := skipSpace(text, o.at+o.scanner.end)
		if j < len(text) && text[j] == ',' {
			a.objects = append(a.objects, llamaObject{at: j + 1})
		}
	}
	return calls
}
