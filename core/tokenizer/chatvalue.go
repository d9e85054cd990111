package tokenizer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"slices"

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
