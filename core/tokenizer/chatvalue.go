package tokenizer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/resin-llm/resin/core/tokenizer/internal/jinja"
)

// toValue converts template data to Jinja values. JSON given as json.RawMessage keeps its
// key order, as Python dicts do, so `tojson` in a template prints tools and tool-call
// arguments exactly as transformers does; Go maps are ordered by key.
func toValue(v any) (jinja.Value, error) {
	switch x := v.(type) {
	case jinja.Value:
		return x, nil
	case json.RawMessage:
		return jsonValue(x)
	case []map[string]any:
		return listValue(x)
	case []any:
		return listValue(x)
	case map[string]any:
		d := jinja.NewDict()
		for _, k := range slices.Sorted(maps.Keys(x)) {
			val, err := toValue(x[k])
			if err != nil {
				return jinja.Value{}, err
			}
			d.AsDict().Set(k, val)
		}
		return d, nil
	}
	return jinja.FromGoValue(v), nil
}

// listValue converts each of xs with toValue into a Jinja list.
func listValue[T any](xs []T) (jinja.Value, error) {
	items := make([]jinja.Value, len(xs))
	for i, x := range xs {
		val, err := toValue(x)
		if err != nil {
			return jinja.Value{}, err
		}
		items[i] = val
	}
	return jinja.NewList(items), nil
}

// jsonValue decodes JSON into Jinja values, keeping object key order.
func jsonValue(raw []byte) (jinja.Value, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	v, err := decodeValue(dec)
	if err != nil {
		return jinja.Value{}, fmt.Errorf("template data: %w", err)
	}
	return v, nil
}

func decodeValue(dec *json.Decoder) (jinja.Value, error) {
	tok, err := dec.Token()
	if err != nil {
		return jinja.Value{}, err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			d := jinja.NewDict()
			for dec.More() {
				k, err := dec.Token()
				if err != nil {
					return jinja.Value{}, err
				}
				key, _ := k.(string)
				val, err := decodeValue(dec)
				if err != nil {
					return jinja.Value{}, err
				}
				d.AsDict().Set(key, val)
			}
			_, err := dec.Token() // '}'
			return d, err
		case '[':
			var items []jinja.Value
			for dec.More() {
				val, err := decodeValue(dec)
				if err != nil {
					return jinja.Value{}, err
				}
				items = append(items, val)
			}
			_, err := dec.Token() // ']'
			return jinja.NewList(items), err
		}
		return jinja.Value{}, fmt.Errorf("unexpected %v", t)
	case json.Number:
		return jinja.FromGoValue(t), nil
	}
	return jinja.FromGoValue(tok), nil
}

// reasoningFields are the names transformers accepts for a message's reasoning, in order.
var reasoningFields = []string{"reasoning_content", "thinking", "reasoning"}

// prepareMessages applies transformers' and vLLM's message preparation to converted
// messages: content parts joined for ContentString templates, reasoning aliased as
// {"thinking": r, ...message, "reasoning_content": r}, tool call arguments decoded when
// decodeArgs.
func prepareMessages(msgs jinja.Value, format ContentFormat, decodeArgs bool) jinja.Value {
	if !msgs.IsList() {
		return msgs
	}
	out := make([]jinja.Value, len(msgs.AsList().Items))
	for i, m := range msgs.AsList().Items {
		out[i] = m
		if !m.IsDict() {
			continue
		}
		d := m.AsDict()
		content, hasContent := d.Get("content")
		joinParts := format == ContentString && hasContent && content.IsList()
		var reasoning jinja.Value
		for _, k := range reasoningFields {
			if v, ok := d.Get(k); ok && !v.IsNone() {
				reasoning = v
				break
			}
		}
		alias := !reasoning.IsUndefined()
		calls, hasCalls := d.Get("tool_calls")
		role, _ := d.Get("role")
		decode := decodeArgs && hasCalls && calls.IsList() && role.IsString() && role.AsString() == "assistant"
		if !joinParts && !alias && !decode {
			continue
		}
		nd := jinja.NewDict()
		if alias {
			nd.AsDict().Set("thinking", reasoning)
		}
		for _, k := range d.OrderedKeys() {
			v, _ := d.Get(k)
			if k == "tool_calls" && decode {
				if calls.AsList().Len() == 0 {
					continue // dropped, as vLLM does
				}
				v = decodeToolArguments(calls)
			}
			nd.AsDict().Set(k, v)
		}
		if alias {
			nd.AsDict().Set("reasoning_content", reasoning)
		}
		if joinParts {
			nd.AsDict().Set("content", jinja.NewString(joinTextParts(content)))
		}
		out[i] = nd
	}
	return jinja.NewList(out)
}

// joinTextParts joins the text of the {"type": "text"} parts with newlines, as vLLM does
// for templates that print content as a string.
func joinTextParts(parts jinja.Value) string {
	var texts []string
	for _, p := range parts.AsList().Items {
		if !p.IsDict() {
			continue
		}
		typ, _ := p.AsDict().Get("type")
		text, ok := p.AsDict().Get("text")
		if ok && text.IsString() && (typ.IsUndefined() || typ.IsString() && typ.AsString() == "text") {
			texts = append(texts, text.AsString())
		}
	}
	return strings.Join(texts, "\n")
}

// decodeToolArguments returns tool calls whose function.arguments are mappings: a JSON
// object string decoded (key order and number spelling kept), anything else {}.
func decodeToolArguments(calls jinja.Value) jinja.Value {
	out := make([]jinja.Value, len(calls.AsList().Items))
	for i, c := range calls.AsList().Items {
		out[i] = c
		if !c.IsDict() {
			continue
		}
		fn, ok := c.AsDict().Get("function")
		if !ok || !fn.IsDict() {
			continue
		}
		args, _ := fn.AsDict().Get("arguments")
		decoded := jinja.NewDict()
		switch {
		case args.IsDict():
			decoded = args
		case args.IsString():
			if v, err := jsonValue([]byte(args.AsString())); err == nil && v.IsDict() {
				decoded = v
			}
		}
		nfn := copyDict(fn)
		nfn.AsDict().Set("arguments", decoded)
		nc := copyDict(c)
		nc.AsDict().Set("function", nfn)
		out[i] = nc
	}
	return jinja.NewList(out)
}

func copyDict(d jinja.Value) jinja.Value {
	out := jinja.NewDict()
	for _, k := range d.AsDict().OrderedKeys() {
		v, _ := d.AsDict().Get(k)
		out.AsDict().Set(k, v)
	}
	return out
}
