package jinja

// tojson as transformers defines it (resin's change to the fork): json.dumps(x,
// ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys), with
// Python's number spelling and no HTML escaping.

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"unicode/utf8"
)

type jsonOptions struct {
	indent      string // "" and !indented: one line
	indented    bool
	itemSep     string
	keySep      string
	sortKeys    bool
	ensureASCII bool
}

func filterTojson(args []Value, kwargs map[string]Value) (Value, error) {
	if len(args) == 0 {
		return Undefined(), fmt.Errorf("tojson: no value")
	}
	o := jsonOptions{itemSep: ", ", keySep: ": "}
	if v, ok := kwargs["indent"]; ok && !v.IsNone() && !v.IsUndefined() {
		o.indented, o.itemSep = true, ","
		if v.IsString() {
			o.indent = v.AsString()
		} else {
			o.indent = strings.Repeat(" ", int(max(toInt64(v), 0)))
		}
	}
	if len(args) > 1 && !kwargsHas(kwargs, "indent") {
		o.indented, o.itemSep = true, ","
		o.indent = strings.Repeat(" ", int(max(toInt64(args[1]), 0)))
	}
	if v, ok := kwargs["separators"]; ok && !v.IsNone() {
		if !v.IsList() || v.AsList().Len() != 2 || !v.AsList().Items[0].IsString() || !v.AsList().Items[1].IsString() {
			return Undefined(), fmt.Errorf("tojson: separators must be two strings")
		}
		o.itemSep, o.keySep = v.AsList().Items[0].AsString(), v.AsList().Items[1].AsString()
	}
	if v, ok := kwargs["sort_keys"]; ok {
		o.sortKeys = v.IsTruthy()
	}
	if v, ok := kwargs["ensure_ascii"]; ok {
		o.ensureASCII = v.IsTruthy()
	}
	var sb strings.Builder
	if err := o.encode(&sb, args[0], 0); err != nil {
		return Undefined(), err
	}
	return NewString(sb.String()), nil
}

func kwargsHas(kwargs map[string]Value, k string) bool {
	_, ok := kwargs[k]
	return ok
}

func (o *jsonOptions) newline(sb *strings.Builder, depth int) {
	if o.indented {
		sb.WriteByte('\n')
		sb.WriteString(strings.Repeat(o.indent, depth))
	}
}

func (o *jsonOptions) encode(sb *strings.Builder, v Value, depth int) error {
	switch v.kind {
	case KindUndefined, KindNone:
		sb.WriteString("null")
	case KindBool:
		if v.AsBool() {
			sb.WriteString("true")
		} else {
			sb.WriteString("false")
		}
	case KindInt:
		sb.WriteString(formatInt(v))
	case KindFloat:
		switch f := v.AsFloat(); {
		case math.IsNaN(f):
			sb.WriteString("NaN")
		case math.IsInf(f, 1):
			sb.WriteString("Infinity")
		case math.IsInf(f, -1):
			sb.WriteString("-Infinity")
		default:
			sb.WriteString(formatFloat(f))
		}
	case KindString:
		o.encodeString(sb, v.AsString())
	case KindList:
		items := v.AsList().Items
		if len(items) == 0 {
			sb.WriteString("[]")
			return nil
		}
		sb.WriteByte('[')
		for i, item := range items {
			if i > 0 {
				sb.WriteString(o.itemSep)
			}
			o.newline(sb, depth+1)
			if err := o.encode(sb, item, depth+1); err != nil {
				return err
			}
		}
		o.newline(sb, depth)
		sb.WriteByte(']')
	case KindDict:
		d := v.AsDict()
		if d.Len() == 0 {
			sb.WriteString("{}")
			return nil
		}
		keys := d.Keys
		if o.sortKeys {
			keys = slices.Sorted(slices.Values(keys))
		}
		sb.WriteByte('{')
		for i, key := range keys {
			if i > 0 {
				sb.WriteString(o.itemSep)
			}
			o.newline(sb, depth+1)
			o.encodeString(sb, key)
			sb.WriteString(o.keySep)
			if err := o.encode(sb, d.Data[key], depth+1); err != nil {
				return err
			}
		}
		o.newline(sb, depth)
		sb.WriteByte('}')
	default:
		return fmt.Errorf("tojson: Object of type %s is not JSON serializable", typeName(v))
	}
	return nil
}

// encodeString writes s as Python's json.dumps does.
func (o *jsonOptions) encodeString(sb *strings.Builder, s string) {
	sb.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			sb.WriteString(`\"`)
		case '\\':
			sb.WriteString(`\\`)
		case '\n':
			sb.WriteString(`\n`)
		case '\r':
			sb.WriteString(`\r`)
		case '\t':
			sb.WriteString(`\t`)
		case '\b':
			sb.WriteString(`\b`)
		case '\f':
			sb.WriteString(`\f`)
		default:
			switch {
			case r < 0x20 || (o.ensureASCII && r == 0x7f):
				fmt.Fprintf(sb, `\u%04x`, r)
			case o.ensureASCII && r > 0x7f:
				if r > 0xffff {
					r -= 0x10000
					fmt.Fprintf(sb, `\u%04x\u%04x`, 0xd800+(r>>10), 0xdc00+(r&0x3ff))
				} else {
					fmt.Fprintf(sb, `\u%04x`, r)
				}
			default:
				sb.WriteRune(r)
			}
		}
	}
	sb.WriteByte('"')
}

// filterFormat is Jinja's format filter: printf-style formatting with the arguments.
func filterFormat(args []Value, kwargs map[string]Value) (Value, error) {
	if len(args) == 0 || !args[0].IsString() {
		return Undefined(), fmt.Errorf("format: expects a string")
	}
	return pyFormat(args[0].AsString(), NewList(args[1:]))
}

// filterCenter is Jinja's center filter: str.center(width) (padded with spaces, the extra
// one on the right when the padding is odd... as Python places it).
func filterCenter(args []Value, kwargs map[string]Value) (Value, error) {
	if len(args) == 0 {
		return Undefined(), fmt.Errorf("center: no value")
	}
	s := printValue(args[0])
	width := int64(80)
	if len(args) > 1 {
		width = toInt64(args[1])
	}
	if w, ok := kwargs["width"]; ok {
		width = toInt64(w)
	}
	n := utf8.RuneCountInString(s)
	pad := int(width) - n
	if pad <= 0 {
		return NewString(s), nil
	}
	// CPython: left = pad/2 + (pad & width & 1).
	left := pad/2 + (pad & int(width) & 1)
	return NewString(strings.Repeat(" ", left) + s + strings.Repeat(" ", pad-left)), nil
}
