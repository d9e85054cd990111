package toolparse

import "strings"

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

func skipSpace(s string, i int) int {
	for i < len(s) && (s[i] == ' ' || s[i] == '\n' || s[i] == '\t' || s[i] == '\r') {
		i++
	}
	return i
}
