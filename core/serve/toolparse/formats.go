package toolparse

import (
	"encoding/json"
	"strings"
)

// Each format keeps its place in the text between scans (a format value serves one
// stream), so that a generation is read in time linear in its length.

// markerSearch finds a marker in text that grows, searching each byte once.
type markerSearch struct {
	from int // text[:from] holds no start of the marker
}

// find returns the index of marker in text from the search position, or -1; held is the
// length of the text's tail that could start the marker.
func (m *markerSearch) find(text, marker string) (at int, held int) {
	m.from = min(m.from, len(text)) // text may end where a marker was found after it
	if i := strings.Index(text[m.from:], marker); i >= 0 {
		return m.from + i, 0
	}
	held = holdBack(text, marker)
	m.from = max(m.from, len(text)-held)
	return -1, held
}

// findOrContent finds marker as find does; while it is absent, content is the text that
// surely comes before it: all of the text when final, else the text less the tail that
// could start the marker.
func (m *markerSearch) findOrContent(text, marker string, final bool) (at int, content string) {
	at, held := m.find(text, marker)
	if at >= 0 {
		return at, ""
	}
	if final {
		held = 0
	}
	return -1, text[:len(text)-held]
}

// hermes is <tool_call>{"name": ..., "arguments": {...}}</tool_call>, one block a call;
// the content is the text before the first block, text between and after blocks is
// dropped (vLLM's hermes parser).
type hermes struct {
	first  markerSearch // the first <tool_call>
	next   markerSearch // the <tool_call> after the last closed block
	at     int          // index of the first <tool_call>, -1 before
	blocks []hermesBlock
}

type hermesBlock struct {
	body    int // index where the JSON starts
	end     markerSearch
	endAt   int // index of </tool_call>, -1 before
	scanner callScanner
	call    partialCall
}

const (
	hermesStart = "<tool_call>"
	hermesEnd   = "</tool_call>"
)

func newHermes([]json.RawMessage) format { return &hermes{at: -1} }

func (h *hermes) scan(text string, final bool) scanned {
	if h.at < 0 {
		at, content := h.first.findOrContent(text, hermesStart, final)
		if at < 0 {
			return scanned{content: content}
		}
		h.at = at
		h.blocks = append(h.blocks, newHermesBlock(at))
	}
	r := scanned{content: text[:h.at]}
	for i := 0; i < len(h.blocks); i++ {
		b := &h.blocks[i]
		if b.endAt < 0 {
			// The end marker is looked for after the JSON object only, so that a
			// "</tool_call>" inside one of its strings does not end it.
			if st := b.scanner.state; st != closed && st != broken {
				b.call = b.scanner.feed(text[b.body:])
			}
			if st := b.scanner.state; st == closed || st == broken {
				if st == closed {
					b.end.from = max(b.end.from, b.body+b.scanner.end)
				}
				if b.endAt, _ = b.end.find(text, hermesEnd); b.endAt >= 0 {
					h.next = markerSearch{from: b.endAt + len(hermesEnd)}
				}
			}
		}
		r.calls = append(r.calls, b.call)
		if i == len(h.blocks)-1 && b.endAt >= 0 {
			if at, _ := h.next.find(text, hermesStart); at >= 0 {
				h.blocks = append(h.blocks, newHermesBlock(at))
			}
		}
	}
	return r
}

func newHermesBlock(at int) hermesBlock {
	body := at + len(hermesStart)
	return hermesBlock{body: body, end: markerSearch{from: body}, endAt: -1}
}

// llama3JSON is Llama 3.1's JSON tool calling: the whole output is
// {"name": ..., "parameters": {...}}, maybe after <|python_tag|>, several calls
// separated by ';'. Any other output is content.
type llama3JSON struct {
	decided bool
	content bool // the output is content
	objects []llamaObject
}

type llamaObject struct {
	at      int // index of the '{'
	scanner callScanner
	call    partialCall
}

const pythonTag = "<|python_tag|>"

func newLlama3JSON([]json.RawMessage) format { return &llama3JSON{} }

func (f *llama3JSON) scan(text string, final bool) scanned {
	if !f.decided {
		lead := skipSpace(text, 0)
		s := text[lead:]
		switch {
		case strings.HasPrefix(s, pythonTag):
			f.objects = append(f.objects, llamaObject{at: lead + len(pythonTag)})
		case strings.HasPrefix(s, "{"):
			f.objects = append(f.objects, llamaObject{at: lead})
		case !final && (s == "" || strings.HasPrefix(pythonTag, s)):
			return scanned{} // cannot tell yet
		default:
			f.content = true
		}
		f.decided = true
	}
	if f.content {
		return scanned{content: text}
	}
	var r scanned
	for i := 0; i < len(f.objects); i++ {
		o := &f.objects[i]
		if o.scanner.state != closed && o.scanner.state != broken {
			o.call = o.scanner.feed(text[o.at:])
		}
		if o.scanner.state == broken && o.call.name == "" {
			break // trailing text that is no call
		}
		// A call whose name was read stays, even if what follows is broken: a stream
		// has already announced it.
		r.calls = append(r.calls, o.call)
		if o.scanner.state == broken {
			break
		}
		if i == len(f.objects)-1 && o.scanner.state == closed {
			// The next call follows after ';'.
			j := skipSpace(text, o.at+o.scanner.end)
			if j < len(text) && text[j] == ';' {
				f.objects = append(f.objects, llamaObject{at: j + 1})
			}
		}
	}
	return r
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
type deepseek struct {
	v31    bool
	first  markerSearch
	at     int // index of the calls block, -1 before
	next   markerSearch
	blocks []deepseekBlock
}

type deepseekBlock struct {
	body   int // index after the call begin marker
	end    markerSearch
	endAt  int // index of the call end marker, -1 before
	sep    markerSearch
	sepAt  int // index in the body after the separator, -1 before
	nameAt int // index in the body after the name's line (V3), -1 before
	args   markerSearch
	call   partialCall
}

const (
	dsCallsBegin = "<｜tool▁calls▁begin｜>"
	dsCallBegin  = "<｜tool▁call▁begin｜>"
	dsSep        = "<｜tool▁sep｜>"
	dsCallEnd    = "<｜tool▁call▁end｜>"
	dsArgsOpen   = "```json\n"
	dsArgsClose  = "\n```"
)

func newDeepseek(v31 bool) func([]json.RawMessage) format {
	return func([]json.RawMessage) format { return &deepseek{v31: v31, at: -1} }
}

func (f *deepseek) scan(text string, final bool) scanned {
	if f.at < 0 {
		at, content := f.first.findOrContent(text, dsCallsBegin, final)
		if at < 0 {
			return scanned{content: content}
		}
		f.at = at
		f.next = markerSearch{from: at + len(dsCallsBegin)}
	}
	r := scanned{content: text[:f.at]}
	for {
		if n := len(f.blocks); n == 0 || f.blocks[n-1].endAt >= 0 {
			at, _ := f.next.find(text, dsCallBegin)
			if at < 0 {
				break
			}
			body := at + len(dsCallBegin)
			f.blocks = append(f.blocks, deepseekBlock{body: body, end: markerSearch{from: body}, endAt: -1, sepAt: -1, nameAt: -1})
		}
		b := &f.blocks[len(f.blocks)-1]
		b.endAt, _ = b.end.find(text, dsCallEnd)
		if b.endAt < 0 {
			b.call = f.call(text[b.body:], b, false)
			break
		}
		b.call = f.call(text[b.body:b.endAt], b, true)
		f.next = markerSearch{from: b.endAt + len(dsCallEnd)}
	}
	for _, b := range f.blocks {
		r.calls = append(r.calls, b.call)
	}
	return r
}

// call reads one call's body (closed: the call end marker followed it), keeping its place
// in b.
func (f *deepseek) call(body string, b *deepseekBlock, closed bool) partialCall {
	var c partialCall
	if b.sepAt < 0 {
		at, _ := b.sep.find(body, dsSep)
		if at < 0 {
			return c
		}
		b.sepAt = at + len(dsSep)
	}
	head, tail := body[:b.sepAt-len(dsSep)], body[b.sepAt:]
	if f.v31 {
		c.name = strings.TrimSpace(head)
		j, held := b.args.find(tail, dsCallEnd)
		switch {
		case closed:
			c.args, c.argsDone, c.valid = tail, true, c.name != ""
		case j >= 0:
			c.args = tail[:j]
		default:
			c.args = tail[:len(tail)-held] // a partial call end marker is held back
		}
		return c
	}
	if b.nameAt < 0 {
		nl := strings.IndexByte(tail, '\n')
		if nl < 0 {
			return c
		}
		b.nameAt = b.sepAt + nl + 1
	}
	c.name = strings.TrimSpace(body[b.sepAt : b.nameAt-1])
	after := body[b.nameAt:]
	if !strings.HasPrefix(after, dsArgsOpen) {
		return c
	}
	args := after[len(dsArgsOpen):]
	j, held := b.args.find(args, dsArgsClose)
	if j >= 0 {
		c.args, c.argsDone = args[:j], true
		c.valid = closed && c.name != ""
		return c
	}
	if closed {
		held = 0 // the body is complete: nothing more can follow
	} else {
		held = max(held, holdBack(args, dsCallEnd)) // and a partial call end marker
	}
	c.args = args[:len(args)-held]
	return c
}
