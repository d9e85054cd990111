package toolparse

import "encoding/json"

// valueScanner finds the end of one JSON value in text that arrives piece by piece: it
// keeps its place, so each byte is read once. It checks nesting and strings, not the whole
// grammar.
type valueScanner struct {
	depth int
	inStr bool
	esc   bool
}

// feed reads s[from:] and returns the index after the value, or -1 when s ends first
// (call again with the longer s and the index it reached, len(s)).
func (v *valueScanner) feed(s string, from int) int {
	for j := from; j < len(s); j++ {
		c := s[j]
		if v.inStr {
			switch {
			case v.esc:
				v.esc = false
			case c == '\\':
				v.esc = true
			case c == '"':
				v.inStr = false
				if v.depth == 0 {
					return j + 1
				}
			}
			continue
		}
		switch c {
		case '"':
			v.inStr = true
		case '{', '[':
			v.depth++
		case '}', ']':
			v.depth--
			if v.depth == 0 {
				return j + 1
			}
			if v.depth < 0 { // a scalar ended by its container
				return j
			}
		case ',', ' ', '\n', '\t', '\r':
			if v.depth == 0 { // a scalar ends (a value never starts with these)
				return j
			}
		}
	}
	return -1
}

// callState is where a callScanner is in the object.
type callState int

const (
	wantObject callState = iota // before '{'
	wantKey                     // before a key, ',' or '}'
	inKey                       // reading a key string
	wantColon                   // after a key
	wantValue                   // before a value
	inValue                     // reading a value
	closed                      // after '}'
	broken                      // not a call object
)

// callScanner reads a tool call written as a JSON object {"name": ..., "arguments": ...}
// (or "parameters") from text that grows piece by piece, reading each byte once.
type callScanner struct {
	state    callState
	pos      int // next byte to read
	start    int // start of the key or value being read
	key      string
	val      valueScanner
	call     partialCall
	argsSeen bool
	end      int // index after the object once closed
}

// feed reads the text so far (each call with the same text extended) and returns the
// call as far as it goes.
func (c *callScanner) feed(s string) partialCall {
	if len(s) < c.pos { // the text got shorter (a marker cut it): read it again
		*c = callScanner{}
	}
	for c.pos <= len(s) && c.state != closed && c.state != broken {
		switch c.state {
		case wantObject, wantKey, wantColon, wantValue:
			c.pos = skipSpace(s, c.pos)
			if c.pos >= len(s) {
				return c.partial(s)
			}
			c.step(s)
		case inKey, inValue:
			end := c.val.feed(s, c.pos)
			if end < 0 {
				c.pos = len(s)
				return c.partial(s)
			}
			c.pos = end
			c.finishToken(s[c.start:end])
		}
	}
	return c.partial(s)
}

// step reads one structural byte at c.pos.
func (c *callScanner) step(s string) {
	b := s[c.pos]
	switch c.state {
	case wantObject:
		if b != '{' {
			c.state = broken
			return
		}
		c.state = wantKey
	case wantKey:
		switch b {
		case '}':
			c.state, c.end = closed, c.pos+1
			c.call.valid = c.call.name != "" && (c.call.argsDone || !c.argsSeen)
			if !c.argsSeen {
				c.call.argsDone = true
			}
		case ',':
		case '"':
			c.state, c.start, c.val = inKey, c.pos, valueScanner{}
			return // the key's scanner reads its opening quote
		default:
			c.state = broken
			return
		}
	case wantColon:
		if b != ':' {
			c.state = broken
			return
		}
		c.state = wantValue
	case wantValue:
		if b == ',' || b == '}' || b == ']' || b == ':' {
			c.state = broken // a missing value
			return
		}
		c.state, c.start, c.val = inValue, c.pos, valueScanner{}
		return
	}
	c.pos++
}

// finishToken handles a complete key or value.
func (c *callScanner) finishToken(tok string) {
	if tok == "" {
		c.state = broken
		return
	}
	if c.state == inKey {
		if json.Unmarshal([]byte(tok), &c.key) != nil {
			c.state = broken
			return
		}
		c.state = wantColon
		return
	}
	c.state = wantKey
	switch c.key {
	case "name":
		var name string
		if json.Unmarshal([]byte(tok), &name) != nil {
			c.state = broken
		} else if c.call.name == "" { // the first name counts: a stream announced it
			c.call.name = name
		}
	case "arguments", "parameters":
		if c.argsSeen {
			return // the first arguments count: a stream sent them
		}
		c.argsSeen = true
		if tok[0] == '"' { // arguments given as a JSON string: its text
			var text string
			if json.Unmarshal([]byte(tok), &text) != nil {
				c.state = broken
				return
			}
			c.call.args, c.call.argsDone = text, true
			return
		}
		c.call.args, c.call.argsDone = tok, json.Valid([]byte(tok))
	}
}

// partial is the call so far: an object or array argument value streams as it grows
// (other values only once complete).
func (c *callScanner) partial(s string) partialCall {
	call := c.call
	if c.state == inValue && !c.argsSeen && (c.key == "arguments" || c.key == "parameters") && (s[c.start] == '{' || s[c.start] == '[') {
		call.args = s[c.start:min(c.pos, len(s))]
	}
	return call
}

func validJSON(s string) bool { return json.Valid([]byte(s)) }
