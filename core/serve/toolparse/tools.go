package toolparse

import (
	"encoding/json"
	"strings"
)

// format reads tool calls out of the content of a generation.
type format interface {
	// scan reads all the content generated so far; final says no more will come. What it
	// returns for a text must be a prefix of what it returns for any longer text: content
	// and each call's arguments only grow.
	scan(text string, final bool) scanned
}

// scanned is what a format found in the text so far.
type scanned struct {
	content string
	calls   []partialCall
}

// partialCall is a tool call as far as it is generated.
type partialCall struct {
	name     string // "" until the name is complete
	args     string // the arguments' JSON text so far
	argsDone bool   // the arguments are complete
	valid    bool   // the whole call is complete and well formed
}

// toolStream turns successive scans into deltas.
type toolStream struct {
	format  format
	newID   func() string
	text    strings.Builder
	content int   // bytes of content emitted
	args    []int // bytes of each call's arguments emitted
	called  int   // calls whose header was emitted
}

func (t *toolStream) add(text string, final bool) (string, []ToolCallDelta) {
	t.text.WriteString(text)
	all := t.text.String()
	r := t.format.scan(all, final)
	if final && !anyValid(r.calls) && t.called == 0 {
		// Nothing in the markup was a call: it is content, as vLLM's parsers return it.
		r = scanned{content: all}
	}
	var content string
	if len(r.content) > t.content {
		content = r.content[t.content:]
		t.content = len(r.content)
	}
	var deltas []ToolCallDelta
	for i, c := range r.calls {
		if i >= t.called {
			if c.name == "" || i > t.called {
				break
			}
			deltas = append(deltas, ToolCallDelta{Index: i, ID: t.newID(), Type: "function", Function: FunctionDelta{Name: c.name}})
			t.called++
			t.args = append(t.args, 0)
		}
		args := c.args
		if final && args == "" {
			args = "{}"
		}
		if len(args) > t.args[i] {
			piece := args[t.args[i]:]
			t.args[i] = len(args)
			if n := len(deltas); n > 0 && deltas[n-1].Index == i {
				deltas[n-1].Function.Arguments += piece
			} else {
				deltas = append(deltas, ToolCallDelta{Index: i, Function: FunctionDelta{Arguments: piece}})
			}
		}
	}
	return content, deltas
}

func anyValid(calls []partialCall) bool {
	for _, c := range calls {
		if c.valid {
			return true
		}
	}
	return false
}

// jsonCall reads a call written as a JSON object {"name": ..., "arguments": ...} (or
// "parameters") from the start of s, which may stop anywhere. end is the index after the
// object, or -1 while it is incomplete.
func jsonCall(s string) (c partialCall, end int) {
	i := skipSpace(s, 0)
	if i >= len(s) || s[i] != '{' {
		return c, -1
	}
	i++
	argsSeen := false
	for {
		i = skipSpace(s, i)
		if i >= len(s) {
			return c, -1
		}
		if s[i] == '}' {
			c.valid = c.name != "" && (c.argsDone || !argsSeen)
			if !argsSeen {
				c.argsDone = true
			}
			return c, i + 1
		}
		if s[i] == ',' {
			i++
			continue
		}
		keyEnd := scanValue(s, i)
		if keyEnd < 0 || s[i] != '"' {
			return c, -1
		}
		var key string
		if json.Unmarshal([]byte(s[i:keyEnd]), &key) != nil {
			return c, -1
		}
		i = skipSpace(s, keyEnd)
		if i >= len(s) || s[i] != ':' {
			return c, -1
		}
		i = skipSpace(s, i+1)
		if i >= len(s) {
			return c, -1
		}
		valEnd := scanValue(s, i)
		switch key {
		case "name":
			if valEnd < 0 || json.Unmarshal([]byte(s[i:valEnd]), &c.name) != nil {
				c.name = ""
				return c, -1
			}
		case "arguments", "parameters":
			argsSeen = true
			if s[i] == '"' { // arguments given as a JSON string: its text, once complete
				var text string
				if valEnd < 0 || json.Unmarshal([]byte(s[i:valEnd]), &text) != nil {
					return c, -1
				}
				c.args, c.argsDone = text, true
				break
			}
			if valEnd < 0 {
				c.args = s[i:]
				return c, -1
			}
			c.args, c.argsDone = s[i:valEnd], json.Valid([]byte(s[i:valEnd]))
		}
		if valEnd < 0 {
			return c, -1
		}
		i = valEnd
	}
}

func skipSpace(s string, i int) int {
	for i < len(s) && (s[i] == ' ' || s[i] == '\n' || s[i] == '\t' || s[i] == '\r') {
		i++
	}
	return i
}

// scanValue returns the index after the JSON value starting at s[i], or -1 when s ends
// before it does. It checks nesting and strings, not the whole grammar.
func scanValue(s string, i int) int {
	depth := 0
	for j := i; j < len(s); j++ {
		switch c := s[j]; c {
		case '"':
			j++
			for j < len(s) && s[j] != '"' {
				if s[j] == '\\' {
					j++
				}
				j++
			}
			if j >= len(s) {
				return -1
			}
			if depth == 0 {
				return j + 1
			}
		case '{', '[':
			depth++
		case '}', ']':
			depth--
			if depth == 0 {
				return j + 1
			}
			if depth < 0 {
				return j
			}
		case ',', ' ', '\n', '\t', '\r':
			if depth == 0 {
				return j
			}
		default:
			// scalars: numbers, true, false, null end at a delimiter
		}
	}
	return -1
}
