package grammar

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

// testVocab is a small byte-level vocabulary: every byte, then pieces that span JSON
// tokens, words, digits and multi-byte characters, then a special token and EOS.
func testVocab(t testing.TB) (*Vocabulary, int32, int32) {
	var toks [][]byte
	for b := 0; b < 256; b++ {
		toks = append(toks, []byte{byte(b)})
	}
	pieces := []string{`{"`, `"}`, `":`, `",`, `": "`, `", "`, `"]`, `["`, `}}`, `]}`, `},{`, `":{"`,
		"true", "false", "null", "tr", "ue", "fa", "lse", "nu", "ll", ` "`, "\n", "  ", "\n  ", "\n    ", ", ", ": ",
		"name", "type", "id", " the", "city", "New", " York", "value", "items", "email", "@", "example", ".com",
		"2024", "-01", "-12", "-31", "T12", ":30", ":00Z", "é", "日本", "\\n", "\\\"", "\\u00", "abc", "xyz",
		"e+", "E-", ".5", "-0", "00", "12", "345", "-", "0.", "1e", `\`, `"a`, `a"`, "unit", "celsius", "fahrenheit",
		"location", "Paris", " de", "ğ", "😀"}
	for i := 0; i < 100; i++ {
		pieces = append(pieces, fmt.Sprintf("%02d", i))
	}
	for _, p := range pieces {
		toks = append(toks, []byte(p))
	}
	special := int32(len(toks))
	toks = append(toks, nil)
	eos := int32(len(toks))
	toks = append(toks, nil)
	isSpecial := make([]bool, len(toks))
	isSpecial[special] = true
	v, err := NewVocabulary(toks, []int32{eos}, isSpecial)
	if err != nil {
		t.Fatal(err)
	}
	return v, special, eos
}

// walk generates one output under g: for budget tokens it picks among the allowed ones
// by random logits (greedy: the largest; else sampled), then it prefers EOS and closing
// tokens so that the output ends. check runs before each step on the output so far and
// whether EOS is allowed. It returns the output, or fails if it did not end.
func walk(t *testing.T, g *Grammar, eos int32, rng *rand.Rand, greedy bool, budget int, check func(out []byte, eosAllowed bool)) []byte {
	t.Helper()
	m, err := g.NewMatcher()
	if err != nil {
		t.Fatal(err)
	}
	v := g.vocab
	mask := make([]uint32, v.MaskWords())
	var out []byte
	var allowed []int32
	for step := 0; step < budget+4000; step++ {
		if err := m.FillMask(mask); err != nil {
			t.Fatal(err)
		}
		allowed = allowed[:0]
		for id := 0; id < v.size; id++ {
			if mask[id>>5]&(1<<(id&31)) != 0 {
				allowed = append(allowed, int32(id))
			}
		}
		eosOK := mask[eos>>5]&(1<<(eos&31)) != 0
		if eosOK != m.CanEnd() {
			t.Fatalf("mask says EOS %v, CanEnd %v", eosOK, m.CanEnd())
		}
		if check != nil {
			check(out, eosOK)
		}
		if len(allowed) == 0 {
			t.Fatalf("no token allowed after %q", out)
		}
		// Spot-check the mask against Allowed.
		probe := int32(rng.IntN(v.size))
		if got, want := m.Allowed(probe), mask[probe>>5]&(1<<(probe&31)) != 0; got != want {
			t.Fatalf("after %q: Allowed(%d %q) = %v, mask %v", out, probe, v.bytes[probe], got, want)
		}
		var tok int32
		if step < budget {
			tok = pick(allowed, rng, greedy)
		} else {
			tok = closer(allowed, v, eos, rng)
		}
		if err := m.Accept(tok); err != nil {
			t.Fatalf("after %q: accept %d: %v", out, tok, err)
		}
		if tok == eos {
			if !m.Ended() {
				t.Fatal("EOS accepted but not ended")
			}
			return out
		}
		out = append(out, v.bytes[tok]...)
	}
	t.Fatalf("output did not end: %q", out)
	return nil
}

// pick chooses by fresh random logits: the largest, or sampled from their softmax.
func pick(allowed []int32, rng *rand.Rand, greedy bool) int32 {
	if greedy {
		best, bestL := allowed[0], -1.0
		for _, id := range allowed {
			if l := rng.Float64(); l > bestL {
				best, bestL = id, l
			}
		}
		return best
	}
	ws := make([]float64, len(allowed))
	sum := 0.0
	for i := range allowed {
		ws[i] = math.Exp(4 * rng.Float64())
		sum += ws[i]
	}
	r := rng.Float64() * sum
	for i, w := range ws {
		if r -= w; r <= 0 {
			return allowed[i]
		}
	}
	return allowed[len(allowed)-1]
}

func closer(allowed []int32, v *Vocabulary, eos int32, rng *rand.Rand) int32 {
	for _, want := range []string{"", `"`, "}", "]"} {
		for _, id := range allowed {
			if want == "" && id == eos || want != "" && string(v.bytes[id]) == want {
				return id
			}
		}
	}
	return allowed[rng.IntN(len(allowed))]
}

// validate checks a JSON value against the schema subset the compiler supports, with
// JSON Schema's own semantics (additionalProperties allows any when absent).
type validator struct{ root any }

func parseJSON(b []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if dec.More() {
		return nil, fmt.Errorf("text after the value")
	}
	if _, err := dec.Token(); err == nil {
		return nil, fmt.Errorf("text after the value")
	}
	return v, nil
}

func (vd *validator) validate(s any, v any, at string) error {
	switch s := s.(type) {
	case bool:
		if !s {
			return fmt.Errorf("%s: false schema", at)
		}
		return nil
	case map[string]any:
		return vd.object(s, v, at)
	}
	return fmt.Errorf("%s: bad schema", at)
}

func canon(v any) string { b, _ := json.Marshal(v); return string(b) }

func numEqual(a, b any) bool {
	na, ok1 := a.(json.Number)
	nb, ok2 := b.(json.Number)
	if ok1 && ok2 {
		fa, _ := na.Float64()
		fb, _ := nb.Float64()
		return fa == fb
	}
	return reflect.DeepEqual(canon(a), canon(b))
}

func (vd *validator) object(s map[string]any, v any, at string) error {
	if r, ok := s["$ref"].(string); ok {
		target := vd.root
		if r != "#" {
			for _, tok := range strings.Split(r[2:], "/") {
				target = target.(map[string]any)[tok]
			}
		}
		return vd.validate(target, v, at)
	}
	if c, ok := s["const"]; ok && !numEqual(c, v) {
		return fmt.Errorf("%s: %s is not the const %s", at, canon(v), canon(c))
	}
	if e, ok := s["enum"].([]any); ok {
		found := false
		for _, x := range e {
			found = found || numEqual(x, v)
		}
		if !found {
			return fmt.Errorf("%s: %s not in enum", at, canon(v))
		}
	}
	if list, ok := s["anyOf"].([]any); ok {
		var errs []string
		for _, sub := range list {
			if err := vd.validate(sub, v, at); err == nil {
				errs = nil
				break
			} else {
				errs = append(errs, err.Error())
			}
		}
		if errs != nil {
			return fmt.Errorf("%s: no anyOf branch: %v", at, errs)
		}
	}
	if list, ok := s["oneOf"].([]any); ok {
		n := 0
		for _, sub := range list {
			if vd.validate(sub, v, at) == nil {
				n++
			}
		}
		if n != 1 {
			return fmt.Errorf("%s: %d oneOf branches match", at, n)
		}
	}
	if list, ok := s["allOf"].([]any); ok {
		for _, sub := range list {
			if err := vd.validate(sub, v, at); err != nil {
				return err
			}
		}
	}
	if t, ok := s["type"]; ok {
		types := []any{t}
		if l, ok := t.([]any); ok {
			types = l
		}
		match := false
		for _, ty := range types {
			match = match || hasType(ty.(string), v)
		}
		if b, _ := s["nullable"].(bool); b && v == nil {
			match = true
		}
		if !match {
			return fmt.Errorf("%s: %s is not of type %v", at, canon(v), t)
		}
	}
	switch v := v.(type) {
	case string:
		n := utf8.RuneCountInString(v)
		if m, ok := s["minLength"].(json.Number); ok {
			if k, _ := m.Int64(); int64(n) < k {
				return fmt.Errorf("%s: %q shorter than %d", at, v, k)
			}
		}
		if m, ok := s["maxLength"].(json.Number); ok {
			if k, _ := m.Int64(); int64(n) > k {
				return fmt.Errorf("%s: %q longer than %d", at, v, k)
			}
		}
		if p, ok := s["pattern"].(string); ok && !regexp.MustCompile(p).MatchString(v) {
			return fmt.Errorf("%s: %q does not match %q", at, v, p)
		}
		if f, ok := s["format"].(string); ok && formats[f] != "" && !regexp.MustCompile(`^(?:`+formats[f]+`)$`).MatchString(v) {
			return fmt.Errorf("%s: %q is not a %s", at, v, f)
		}
	case json.Number:
		f, _ := v.Float64()
		for k, cmp := range map[string]func(x, b float64) bool{
			"minimum": func(x, b float64) bool { return x >= b }, "maximum": func(x, b float64) bool { return x <= b },
			"exclusiveMinimum": func(x, b float64) bool { return x > b }, "exclusiveMaximum": func(x, b float64) bool { return x < b },
		} {
			if b, ok := s[k].(json.Number); ok {
				bf, _ := b.Float64()
				if !cmp(f, bf) {
					return fmt.Errorf("%s: %s breaks %s %s", at, v, k, b)
				}
			}
		}
	case []any:
		if m, ok := s["minItems"].(json.Number); ok {
			if k, _ := m.Int64(); int64(len(v)) < k {
				return fmt.Errorf("%s: %d items, fewer than %d", at, len(v), k)
			}
		}
		if m, ok := s["maxItems"].(json.Number); ok {
			if k, _ := m.Int64(); int64(len(v)) > k {
				return fmt.Errorf("%s: %d items, more than %d", at, len(v), k)
			}
		}
		prefix, _ := s["prefixItems"].([]any)
		for i, e := range v {
			var sub any = true
			if i < len(prefix) {
				sub = prefix[i]
			} else if it, ok := s["items"]; ok {
				sub = it
			}
			if err := vd.validate(sub, e, fmt.Sprintf("%s/%d", at, i)); err != nil {
				return err
			}
		}
	case map[string]any:
		props, _ := s["properties"].(map[string]any)
		if req, ok := s["required"].([]any); ok {
			for _, r := range req {
				if _, ok := v[r.(string)]; !ok {
					return fmt.Errorf("%s: required %q missing", at, r)
				}
			}
		}
		for k, e := range v {
			if ps, ok := props[k]; ok {
				if err := vd.validate(ps, e, at+"/"+k); err != nil {
					return err
				}
				continue
			}
			if ap, ok := s["additionalProperties"]; ok {
				if err := vd.validate(ap, e, at+"/"+k); err != nil {
					return fmt.Errorf("%s: additional property %q: %w", at, k, err)
				}
			}
		}
	}
	return nil
}

func hasType(t string, v any) bool {
	switch t {
	case "null":
		return v == nil
	case "boolean":
		_, ok := v.(bool)
		return ok
	case "string":
		_, ok := v.(string)
		return ok
	case "number":
		_, ok := v.(json.Number)
		return ok
	case "integer":
		n, ok := v.(json.Number)
		if !ok {
			return false
		}
		_, err := strconv.ParseInt(string(n), 10, 64)
		if err != nil {
			f, ferr := n.Float64()
			return ferr == nil && f == math.Trunc(f)
		}
		return true
	case "array":
		_, ok := v.([]any)
		return ok
	case "object":
		_, ok := v.(map[string]any)
		return ok
	}
	return false
}
