package toolparse

import (
	"encoding/json"
	"strings"
	"unicode/utf8"
)

// dsml is DeepSeek-V4's tool-call block (its chat template documents it):
//
//	<｜DSML｜tool_calls>
//	<｜DSML｜invoke name="get_weather">
//	<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>
//	<｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>
//	</｜DSML｜invoke>
//	</｜DSML｜tool_calls>
//
// The arguments are built as a JSON object: string="true" values as JSON strings (they
// stream as they are generated), others as their JSON text once complete (as a string
// when it is not JSON). The content is the text before the block.
type dsml struct {
	first   markerSearch
	at      int // index of the block, -1 before
	next    markerSearch
	invokes []dsmlCall
}

const (
	dsmlCalls     = "<｜DSML｜tool_calls>"
	dsmlInvoke    = "<｜DSML｜invoke name=\""
	dsmlInvokeEnd = "</｜DSML｜invoke>"
	dsmlParam     = "<｜DSML｜parameter name=\""
	dsmlParamEnd  = "</｜DSML｜parameter>"
)

// dsmlCall is one call as far as it is read.
type dsmlCall struct {
	start int // index of the name
	pos   int // where reading continues; -1 until the name is read
	argsObject
	closed bool
	broken bool
	end    int // index after </｜DSML｜invoke>
	// the parameter being read
	param    string
	isString bool
	value    int // index of its value; -1 when none is being read
	valueEnd markerSearch
	call     partialCall
}

func newDSML([]json.RawMessage) format { return &dsml{at: -1} }

func (f *dsml) scan(text string, final bool) scanned {
	if f.at < 0 {
		at, content := f.first.findOrContent(text, dsmlCalls, final)
		if at < 0 {
			return scanned{content: content}
		}
		f.at = at
		f.next = markerSearch{from: at + len(dsmlCalls)}
	}
	r := scanned{content: text[:f.at]}
	for {
		if n := len(f.invokes); n == 0 || f.invokes[n-1].closed {
			at, _ := f.next.find(text, dsmlInvoke)
			if at < 0 {
				break
			}
			f.invokes = append(f.invokes, dsmlCall{start: at + len(dsmlInvoke), pos: -1, value: -1})
		}
		v := &f.invokes[len(f.invokes)-1]
		if !v.broken {
			v.read(text)
		}
		if !v.closed {
			break
		}
		f.next = markerSearch{from: v.end}
	}
	for i := range f.invokes {
		r.calls = append(r.calls, f.invokes[i].call)
	}
	return r
}

// read continues reading the invoke in text.
func (v *dsmlCall) read(text string) {
	if v.pos < 0 {
		end := strings.Index(text[v.start:], "\">")
		if end < 0 {
			return
		}
		v.call.name = text[v.start : v.start+end]
		v.pos = v.start + end + 2
		v.args.WriteByte('{')
	}
	partial := ""
	for !v.closed && !v.broken {
		if v.value >= 0 { // inside a parameter's value
			at, held := v.valueEnd.find(text, dsmlParamEnd)
			if at < 0 {
				if v.isString {
					partial = v.streamString(text[v.value : len(text)-held])
				}
				break
			}
			v.addParam(text[v.value:at])
			v.pos, v.value = at+len(dsmlParamEnd), -1
			continue
		}
		rest := text[skipSpace(text, v.pos):]
		switch {
		case strings.HasPrefix(rest, dsmlInvokeEnd):
			v.closed = true
			v.end = len(text) - len(rest) + len(dsmlInvokeEnd)
		case strings.HasPrefix(rest, dsmlParam):
			head := len(text) - len(rest) + len(dsmlParam)
			end := strings.Index(text[head:], "\">")
			if end < 0 {
				v.call.args = v.args.String()
				return
			}
			name, attrs, ok := strings.Cut(text[head:head+end], "\"")
			if !ok {
				v.broken = true
				break
			}
			v.param, v.isString = name, strings.Contains(attrs, `string="true`)
			v.value = head + end + 2
			v.valueEnd = markerSearch{from: v.value}
			if v.isString {
				v.openParam(v.param)
				v.args.WriteByte('"')
			}
		case strings.HasPrefix(dsmlInvokeEnd, rest) || strings.HasPrefix(dsmlParam, rest):
			v.call.args = v.args.String() // a marker is arriving
			return
		default:
			v.broken = true
		}
	}
	v.call.args = v.args.String() + partial
	if v.closed {
		v.call.args += "}"
		v.call.argsDone = true
		v.call.valid = v.call.name != ""
	}
}

// addParam writes a complete parameter value.
func (v *dsmlCall) addParam(value string) {
	if v.isString {
		v.endString(value)
		return
	}
	v.openParam(v.param)
	if raw := strings.TrimSpace(value); json.Valid([]byte(raw)) {
		v.args.WriteString(raw)
		return
	}
	v.args.WriteByte('"')
	v.args.WriteString(jsonStringBody(value))
	v.args.WriteByte('"')
}

// argsObject is a call's arguments, a JSON object, as far as they are written.
type argsObject struct {
	args   strings.Builder
	params int
	// escaped is how many bytes of the string value being streamed are written.
	escaped int
}

// openParam writes the separator and the key of the next parameter.
func (o *argsObject) openParam(key string) {
	if o.params > 0 {
		o.args.WriteString(", ")
	}
	o.params++
	o.escaped = 0
	o.args.WriteByte('"')
	o.args.WriteString(jsonStringBody(key))
	o.args.WriteString(`": `)
}

// streamString writes the escape of a string value read so far (each call with the
// value extended), but for an incomplete UTF-8 character at its end, whose escape it
// returns. Each byte is escaped once, so a long value streams in linear time.
func (o *argsObject) streamString(value string) (tail string) {
	if cut := completeRunes(value); cut > o.escaped {
		o.args.WriteString(jsonStringBody(value[o.escaped:cut]))
		o.escaped = cut
	}
	return jsonStringBody(value[o.escaped:])
}

// endString writes the rest of a complete string value and its closing quote.
func (o *argsObject) endString(value string) {
	o.args.WriteString(jsonStringBody(value[o.escaped:]))
	o.args.WriteByte('"')
	o.escaped = 0
}

// completeRunes returns the length of s without an incomplete UTF-8 character at its end.
func completeRunes(s string) int {
	for i := len(s) - 1; i >= max(0, len(s)-utf8.UTFMax); i-- {
		if utf8.RuneStart(s[i]) {
			if !utf8.FullRuneInString(s[i:]) {
				return i
			}
			break
		}
	}
	return len(s)
}

// jsonStringBody escapes s for the inside of a JSON string as Python's json.dumps with
// ensure_ascii=False does. Escaping works rune by rune, so a prefix of s escapes to a
// prefix of s's escape.
func jsonStringBody(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		default:
			if r < 0x20 {
				b.WriteString(`\u00`)
				b.WriteByte("0123456789abcdef"[r>>4])
				b.WriteByte("0123456789abcdef"[r&15])
			} else {
				b.WriteRune(r)
			}
		}
	}
	return b.String()
}
