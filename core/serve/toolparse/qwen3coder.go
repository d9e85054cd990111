package toolparse

import (
	"encoding/json"
	"math"
	"math/big"
	"strconv"
	"strings"
)

// qwen3Coder is the XML tool calling of Qwen3-Coder, Qwen3.5 and Qwen3.6:
//
//	<tool_call>
//	<function=get_weather>
//	<parameter=city>
//	Paris
//	</parameter>
//	<parameter=days>
//	3
//	</parameter>
//	</function>
//	</tool_call>
//
// Parameter values are text (one newline after the opening tag and before the closing
// one dropped); as vLLM's qwen3_coder parser, each is converted by the type its tool
// definition gives it (string, integer, number, boolean, else JSON) into the arguments'
// JSON object. String values stream as generated, others once complete. The content is
// the text before the first <tool_call>.
type qwen3Coder struct {
	types map[string]map[string]string // tool -> parameter -> JSON schema type
	first markerSearch
	at    int // index of the first <tool_call>, -1 before
	next  markerSearch
	calls []xmlCall
}

const (
	xmlFunction    = "<function="
	xmlFunctionEnd = "</function>"
	xmlParam       = "<parameter="
	xmlParamEnd    = "</parameter>"
)

// xmlCall is one call as far as it is read.
type xmlCall struct {
	start int // index after <function=
	pos   int // where reading continues; -1 until the name is read
	argsObject
	closed   bool
	broken   bool
	end      int
	param    string
	typ      string
	opened   bool // a string parameter's key and opening quote are written
	value    int  // index of the parameter's value; -1 when none is being read
	valueEnd markerSearch
	call     partialCall
}

func newQwen3Coder(tools []json.RawMessage) format {
	f := &qwen3Coder{at: -1, types: map[string]map[string]string{}}
	for _, raw := range tools {
		var t struct {
			Function struct {
				Name       string `json:"name"`
				Parameters struct {
					Properties map[string]struct {
						Type json.RawMessage `json:"type"`
					} `json:"properties"`
				} `json:"parameters"`
			} `json:"function"`
		}
		if json.Unmarshal(raw, &t) != nil {
			continue
		}
		params := map[string]string{}
		for name, p := range t.Function.Parameters.Properties {
			var typ string
			if json.Unmarshal(p.Type, &typ) != nil {
				typ = "object" // a list of types: read the value as JSON
			}
			params[name] = strings.ToLower(strings.TrimSpace(typ))
		}
		f.types[t.Function.Name] = params
	}
	return f
}

func (f *qwen3Coder) scan(text string, final bool) scanned {
	if f.at < 0 {
		at, content := f.first.findOrContent(text, hermesStart, final)
		if at < 0 {
			return scanned{content: content}
		}
		f.at = at
		f.next = markerSearch{from: at}
	}
	r := scanned{content: text[:f.at]}
	for {
		if n := len(f.calls); n == 0 || f.calls[n-1].closed {
			at, _ := f.next.find(text, xmlFunction)
			if at < 0 {
				break
			}
			f.calls = append(f.calls, xmlCall{start: at + len(xmlFunction), pos: -1, value: -1})
		}
		c := &f.calls[len(f.calls)-1]
		if !c.broken {
			c.read(text, f.types)
		}
		if !c.closed {
			break
		}
		f.next = markerSearch{from: c.end}
	}
	for i := range f.calls {
		r.calls = append(r.calls, f.calls[i].call)
	}
	return r
}

func (c *xmlCall) read(text string, types map[string]map[string]string) {
	if c.pos < 0 {
		end := strings.IndexByte(text[c.start:], '>')
		if end < 0 {
			return
		}
		c.call.name = strings.TrimSpace(text[c.start : c.start+end])
		c.pos = c.start + end + 1
		c.args.WriteByte('{')
	}
	partial := ""
	for !c.closed && !c.broken {
		if c.value >= 0 {
			at, held := c.valueEnd.find(text, xmlParamEnd)
			if at < 0 {
				if c.typ == "string" {
					v := text[c.value : len(text)-held]
					v = strings.TrimPrefix(v, "\n")
					v = strings.TrimSuffix(v, "\n") // a newline may be the one before the end tag
					if !c.opened && !isNullPrefix(v) {
						c.openParam(c.param)
						c.args.WriteByte('"')
						c.opened = true
					}
					if c.opened {
						partial = c.streamString(v)
					}
				}
				break
			}
			c.addParam(text[c.value:at])
			c.pos, c.value = at+len(xmlParamEnd), -1
			continue
		}
		rest := text[skipSpace(text, c.pos):]
		switch {
		case strings.HasPrefix(rest, xmlFunctionEnd):
			c.closed = true
			c.end = len(text) - len(rest) + len(xmlFunctionEnd)
		case strings.HasPrefix(rest, xmlParam):
			head := len(text) - len(rest) + len(xmlParam)
			end := strings.IndexByte(text[head:], '>')
			if end < 0 {
				c.call.args = c.args.String()
				return
			}
			c.param = strings.TrimSpace(text[head : head+end])
			c.typ = paramType(types, c.call.name, c.param)
			c.value = head + end + 1
			c.valueEnd = markerSearch{from: c.value}
			c.opened = false
		case strings.HasPrefix(xmlFunctionEnd, rest) || strings.HasPrefix(xmlParam, rest):
			c.call.args = c.args.String() // a tag is arriving
			return
		default:
			c.broken = true
		}
	}
	c.call.args = c.args.String() + partial
	if c.closed {
		c.call.args += "}"
		c.call.argsDone = true
		c.call.valid = c.call.name != ""
	}
}

func (c *xmlCall) addParam(value string) {
	value = strings.TrimPrefix(value, "\n")
	value = strings.TrimSuffix(value, "\n")
	if c.opened {
		c.endString(value)
		return
	}
	c.openParam(c.param)
	c.args.WriteString(convertParam(value, c.typ))
}

// isNullPrefix reports whether a value may still turn out to be null (any case), which
// every type reads as JSON null: a string value streams only once it cannot.
func isNullPrefix(v string) bool {
	return len(v) <= 4 && strings.HasPrefix("null", strings.ToLower(v))
}

// paramType is the type a tool's definition gives a parameter, "string" when it gives
// none (vLLM's qwen3_coder reads unknown parameters as strings).
func paramType(types map[string]map[string]string, tool, param string) string {
	typ, ok := types[tool][param]
	switch {
	case !ok:
		return "string"
	case typ == "str" || typ == "text" || typ == "varchar" || typ == "char" || typ == "enum":
		return "string"
	}
	return typ
}

// convertParam turns a parameter's text into JSON by its type, as vLLM's qwen3_coder
// parser does before json.dumps.
func convertParam(value, typ string) string {
	quoted := `"` + jsonStringBody(value) + `"`
	switch {
	case strings.ToLower(value) == "null":
		return "null"
	case typ == "string":
		return quoted
	case strings.HasPrefix(typ, "int") || strings.HasPrefix(typ, "uint") || strings.HasPrefix(typ, "long") ||
		strings.HasPrefix(typ, "short") || strings.HasPrefix(typ, "unsigned"):
		if n, ok := new(big.Int).SetString(strings.TrimSpace(value), 10); ok {
			return n.String()
		}
		return quoted
	case strings.HasPrefix(typ, "num") || strings.HasPrefix(typ, "float"):
		f, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
			return quoted
		}
		if f == math.Trunc(f) { // Python: int(f) when integral, exactly
			n, _ := new(big.Float).SetFloat64(f).Int(nil)
			return n.String()
		}
		return pyFloat(f)
	case typ == "boolean" || typ == "bool" || typ == "binary":
		if strings.ToLower(value) == "true" {
			return "true"
		}
		return "false"
	}
	if raw := strings.TrimSpace(value); json.Valid([]byte(raw)) {
		return raw
	}
	return quoted
}

// pyFloat prints f as Python's repr does.
func pyFloat(f float64) string {
	e := strconv.FormatFloat(f, 'e', -1, 64)
	exp, _ := strconv.Atoi(e[strings.IndexByte(e, 'e')+1:])
	if exp < -4 || exp >= 16 {
		return e
	}
	s := strconv.FormatFloat(f, 'f', -1, 64)
	if !strings.Contains(s, ".") {
		s += ".0"
	}
	return s
}
