package grammar

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"
)

// jsonSchemaDef compiles a JSON Schema to a grammar whose outputs are the JSON texts the
// schema accepts, in the subset xgrammar and llguidance support. As they do, objects
// list their properties in the schema's order, and a schema that does not say
// additionalProperties allows none beside its properties when it has any (strict
// mode). Keywords that assert something this compiler cannot enforce are refused by name;
// annotations (title, description, default, examples...) and unknown formats are
// ignored, as a validator does by default.
func jsonSchemaDef(source string) (*grammarDef, error) {
	dec := json.NewDecoder(strings.NewReader(source))
	dec.UseNumber()
	root, err := decodeOrdered(dec)
	if err != nil {
		return nil, fmt.Errorf("json schema: %w", err)
	}
	if _, err := dec.Token(); err == nil {
		return nil, fmt.Errorf("json schema: text after the schema")
	}
	d := newDef("root")
	defineJSONBase(d)
	c := &schemaCompiler{def: d, root: root, refs: map[string]string{}}
	x, err := c.schema(root, "#")
	if err != nil {
		return nil, err
	}
	d.define("root", seq(x, ref("ws")))
	return d, nil
}

// taggedDef compiles a Tagged source: between min and max (0: no bound) structures,
// separated by separator, each one of the given begin, JSON value under schema, end
// (a tool call in a model's own format, as xgrammar's structural tags).
func taggedDef(source string) (*grammarDef, error) {
	var t struct {
		Structures []struct {
			Begin  string          `json:"begin"`
			Schema json.RawMessage `json:"schema"`
			End    string          `json:"end"`
		} `json:"structures"`
		Separator string `json:"separator"`
		Min       int    `json:"min"`
		Max       int    `json:"max"`
	}
	dec := json.NewDecoder(strings.NewReader(source))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&t); err != nil {
		return nil, fmt.Errorf("tagged: %w", err)
	}
	if len(t.Structures) == 0 || t.Min < 0 || t.Max < 0 || t.Max > 0 && t.Max < t.Min || t.Min > maxRepeat || t.Max > maxRepeat {
		return nil, fmt.Errorf("tagged: want structures and 0 <= min <= max (0: unbounded) <= %d", maxRepeat)
	}
	d := newDef("root")
	defineJSONBase(d)
	alts := make([]*expr, len(t.Structures))
	for i, st := range t.Structures {
		dec := json.NewDecoder(bytes.NewReader(st.Schema))
		dec.UseNumber()
		root, err := decodeOrdered(dec)
		if err != nil {
			return nil, fmt.Errorf("tagged: structure %d: json schema: %w", i, err)
		}
		c := &schemaCompiler{def: d, root: root, refs: map[string]string{}, prefix: fmt.Sprintf("s%d.", i)}
		x, err := c.schema(root, "#")
		if err != nil {
			return nil, fmt.Errorf("tagged: structure %d: %w", i, err)
		}
		alts[i] = seq(lit(st.Begin), x, lit(st.End))
	}
	d.define("structure", alt(alts...))
	more := seq(lit(t.Separator), ref("structure"))
	hi := -1
	if t.Max > 0 {
		hi = t.Max - 1
	}
	if t.Min == 0 {
		d.define("root", opt(seq(ref("structure"), repeat(more, 0, hi))))
	} else {
		d.define("root", seq(ref("structure"), repeat(more, t.Min-1, hi)))
	}
	return d, nil
}

type schemaCompiler struct {
	def    *grammarDef
	root   any
	refs   map[string]string // JSON pointer -> rule name
	n      int
	depth  int
	prefix string // of the rule names, when several schemas share a grammar
}

// refused are the JSON Schema keywords that assert what the compiler cannot enforce.
// Keywords it does not know at all (vendor extensions, a stray "name") are ignored, as a
// validator ignores them.
var refused = map[string]bool{
	"not": true, "if": true, "then": true, "else": true, "patternProperties": true,
	"propertyNames": true, "minProperties": true, "maxProperties": true,
	"dependentRequired": true, "dependentSchemas": true, "dependencies": true,
	"unevaluatedProperties": true, "unevaluatedItems": true, "uniqueItems": true,
	"contains": true, "minContains": true, "maxContains": true, "multipleOf": true,
	"$dynamicRef": true, "$recursiveRef": true, "additionalItems": true,
}

// asserting are the keywords the compiler enforces.
var asserting = map[string]bool{
	"type": true, "properties": true, "required": true, "additionalProperties": true,
	"enum": true, "const": true, "items": true, "prefixItems": true, "minItems": true,
	"maxItems": true, "pattern": true, "minLength": true, "maxLength": true,
	"minimum": true, "maximum": true, "exclusiveMinimum": true, "exclusiveMaximum": true,
	"anyOf": true, "oneOf": true, "allOf": true, "$ref": true, "nullable": true,
}

func (c *schemaCompiler) fresh(hint string) string {
	c.n++
	return fmt.Sprintf("%s%s-%d", c.prefix, hint, c.n)
}

func (c *schemaCompiler) schema(s any, at string) (*expr, error) {
	if c.depth++; c.depth > 64 {
		return nil, fmt.Errorf("json schema: nested more than 64 deep at %s", at)
	}
	defer func() { c.depth-- }()
	switch s := s.(type) {
	case bool:
		if s {
			return ref("value"), nil
		}
		return nil, fmt.Errorf("json schema: false at %s allows no value", at)
	case map[string]any:
		return c.object(s, at)
	}
	return nil, fmt.Errorf("json schema: %s is not a schema (an object or a boolean)", at)
}

func (c *schemaCompiler) object(s map[string]any, at string) (*expr, error) {
	for _, k := range propertyOrder(s) {
		if refused[k] && !(k == "uniqueItems" && s[k] == false) {
			return nil, fmt.Errorf("json schema: keyword %q at %s is not supported", k, at)
		}
	}
	if r, ok := s["$ref"]; ok {
		if len(assertions(s)) > 1 {
			return nil, fmt.Errorf("json schema: $ref beside %v at %s is not supported", others(s, "$ref"), at)
		}
		p, ok := r.(string)
		if !ok {
			return nil, fmt.Errorf("json schema: $ref at %s is not a string", at)
		}
		return c.ref(p, at)
	}
	if v, ok := s["const"]; ok {
		return jsonLiteral(v)
	}
	if v, ok := s["enum"]; ok {
		list, ok := v.([]any)
		if !ok || len(list) == 0 {
			return nil, fmt.Errorf("json schema: enum at %s is not a non-empty array", at)
		}
		alts := make([]*expr, len(list))
		for i, e := range list {
			x, err := jsonLiteral(e)
			if err != nil {
				return nil, err
			}
			alts[i] = x
		}
		return alt(alts...), nil
	}
	for _, k := range []string{"anyOf", "oneOf"} {
		v, ok := s[k]
		if !ok {
			continue
		}
		if o := others(s, k, "nullable"); len(o) > 0 {
			return nil, fmt.Errorf("json schema: %s beside %v at %s is not supported", k, o, at)
		}
		list, ok := v.([]any)
		if !ok || len(list) == 0 {
			return nil, fmt.Errorf("json schema: %s at %s is not a non-empty array", k, at)
		}
		alts := make([]*expr, len(list))
		for i, e := range list {
			x, err := c.schema(e, fmt.Sprintf("%s/%s/%d", at, k, i))
			if err != nil {
				return nil, err
			}
			alts[i] = x
		}
		return c.nullable(s, alt(alts...)), nil
	}
	if v, ok := s["allOf"]; ok {
		list, ok := v.([]any)
		if !ok || len(list) != 1 || len(others(s, "allOf")) > 0 {
			return nil, fmt.Errorf("json schema: allOf at %s is supported only with one schema and nothing beside it", at)
		}
		return c.schema(list[0], at+"/allOf/0")
	}
	types, err := schemaTypes(s, at)
	if err != nil {
		return nil, err
	}
	alts := make([]*expr, 0, len(types))
	for _, t := range types {
		x, err := c.typed(t, s, at)
		if err != nil {
			return nil, err
		}
		alts = append(alts, x)
	}
	return c.nullable(s, alt(alts...)), nil
}

// nullable adds null for OpenAPI's nullable: true.
func (c *schemaCompiler) nullable(s map[string]any, x *expr) *expr {
	if b, _ := s["nullable"].(bool); b {
		return alt(x, lit("null"))
	}
	return x
}

func assertions(s map[string]any) []string {
	var out []string
	for k := range s {
		if asserting[k] {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

func others(s map[string]any, skip ...string) []string {
	var out []string
	for _, k := range assertions(s) {
		keep := true
		for _, x := range skip {
			keep = keep && k != x
		}
		if keep {
			out = append(out, k)
		}
	}
	return out
}

// schemaTypes is the schema's type list, inferred from its keywords when absent.
func schemaTypes(s map[string]any, at string) ([]string, error) {
	switch t := s["type"].(type) {
	case string:
		return []string{t}, nil
	case []any:
		out := make([]string, 0, len(t))
		for _, e := range t {
			str, ok := e.(string)
			if !ok {
				return nil, fmt.Errorf("json schema: type at %s lists a non-string", at)
			}
			out = append(out, str)
		}
		if len(out) == 0 {
			return nil, fmt.Errorf("json schema: type at %s is an empty list", at)
		}
		return out, nil
	case nil:
		if _, ok := s["type"]; ok {
			return nil, fmt.Errorf("json schema: type at %s is null", at)
		}
	default:
		return nil, fmt.Errorf("json schema: type at %s is not a string or a list", at)
	}
	has := func(keys ...string) bool {
		for _, k := range keys {
			if _, ok := s[k]; ok {
				return true
			}
		}
		return false
	}
	switch {
	case has("properties", "additionalProperties", "required"):
		return []string{"object"}, nil
	case has("items", "prefixItems", "minItems", "maxItems"):
		return []string{"array"}, nil
	case has("pattern", "minLength", "maxLength"):
		return []string{"string"}, nil
	case has("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
		return []string{"number"}, nil
	}
	return []string{"any"}, nil
}

func (c *schemaCompiler) typed(t string, s map[string]any, at string) (*expr, error) {
	switch t {
	case "any":
		return ref("value"), nil
	case "null":
		return lit("null"), nil
	case "boolean":
		return alt(lit("true"), lit("false")), nil
	case "string":
		return c.str(s, at)
	case "integer":
		return c.integer(s, at)
	case "number":
		return c.number(s, at)
	case "array":
		return c.array(s, at)
	case "object":
		return c.obj(s, at)
	}
	return nil, fmt.Errorf("json schema: unknown type %q at %s", t, at)
}

// formats are the string formats enforced exactly (a date's day is not checked against
// its month).
var formats = map[string]string{
	"date":      `\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])`,
	"time":      `([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d+)?(Z|[+-]([01]\d|2[0-3]):[0-5]\d)`,
	"date-time": `\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])T([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d+)?(Z|[+-]([01]\d|2[0-3]):[0-5]\d)`,
	"uuid":      `[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}`,
	"ipv4":      `((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)`,
}

func (c *schemaCompiler) str(s map[string]any, at string) (*expr, error) {
	minLen, err := intKeyword(s, "minLength", at, 0)
	if err != nil {
		return nil, err
	}
	maxLen, err := intKeyword(s, "maxLength", at, -1)
	if err != nil {
		return nil, err
	}
	_, hasLen := s["minLength"]
	if _, ok := s["maxLength"]; ok {
		hasLen = true
	}
	if p, ok := s["pattern"]; ok {
		if hasLen {
			return nil, fmt.Errorf("json schema: pattern with minLength/maxLength at %s is not supported", at)
		}
		pat, ok := p.(string)
		if !ok {
			return nil, fmt.Errorf("json schema: pattern at %s is not a string", at)
		}
		x, err := regexExpr(pat, jsonString, true)
		if err != nil {
			return nil, fmt.Errorf("json schema: pattern at %s: %w", at, err)
		}
		return seq(lit(`"`), x, lit(`"`)), nil
	}
	if f, ok := s["format"].(string); ok && formats[f] != "" && !hasLen {
		x, err := regexExpr(formats[f], jsonString, false)
		if err != nil {
			return nil, err
		}
		return seq(lit(`"`), x, lit(`"`)), nil
	}
	if maxLen >= 0 && maxLen < minLen {
		return nil, fmt.Errorf("json schema: maxLength %d < minLength %d at %s", maxLen, minLen, at)
	}
	if minLen > maxRepeat || maxLen > maxRepeat {
		return nil, fmt.Errorf("json schema: minLength/maxLength at %s is over the limit %d", at, maxRepeat)
	}
	if !hasLen {
		return ref("string"), nil
	}
	return seq(lit(`"`), repeat(ref("char"), minLen, maxLen), lit(`"`)), nil
}

// intKeyword reads a non-negative integer keyword, def when absent.
func intKeyword(s map[string]any, key, at string, def int) (int, error) {
	v, ok := s[key]
	if !ok {
		return def, nil
	}
	n, ok := v.(json.Number)
	if !ok {
		return 0, fmt.Errorf("json schema: %s at %s is not a number", key, at)
	}
	i, err := strconv.ParseInt(string(n), 10, 64)
	if err != nil {
		f, ferr := n.Float64()
		if ferr != nil || f != math.Trunc(f) {
			return 0, fmt.Errorf("json schema: %s at %s is not an integer", key, at)
		}
		i = int64(f)
	}
	if i < 0 {
		return 0, fmt.Errorf("json schema: %s at %s is negative", key, at)
	}
	if i > maxRepeat {
		return 0, fmt.Errorf("json schema: %s %d at %s is over the limit %d", key, i, at, maxRepeat)
	}
	return int(i), nil
}

// bound reads a numeric keyword.
func bound(s map[string]any, key, at string) (float64, bool, error) {
	v, ok := s[key]
	if !ok {
		return 0, false, nil
	}
	n, ok := v.(json.Number)
	if !ok {
		return 0, false, fmt.Errorf("json schema: %s at %s is not a number (draft-4 boolean forms are not supported)", key, at)
	}
	f, err := n.Float64()
	if err != nil {
		return 0, false, fmt.Errorf("json schema: %s at %s: %w", key, at, err)
	}
	return f, true, nil
}

const maxIntBound = 1e17

func (c *schemaCompiler) integer(s map[string]any, at string) (*expr, error) {
	var lo, hi *int64
	set := func(p **int64, v float64, key string) error {
		if math.Abs(v) > maxIntBound {
			return fmt.Errorf("json schema: %s %v at %s is too large (the limit is 1e17)", key, v, at)
		}
		i := int64(v)
		if *p == nil || (p == &lo && i > **p) || (p == &hi && i < **p) {
			*p = &i
		}
		return nil
	}
	for _, k := range []string{"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"} {
		v, ok, err := bound(s, k, at)
		if err != nil {
			return nil, err
		}
		if !ok {
			continue
		}
		switch k {
		case "minimum":
			err = set(&lo, math.Ceil(v), k)
		case "exclusiveMinimum":
			err = set(&lo, math.Floor(v)+1, k)
		case "maximum":
			err = set(&hi, math.Floor(v), k)
		case "exclusiveMaximum":
			err = set(&hi, math.Ceil(v)-1, k)
		}
		if err != nil {
			return nil, err
		}
	}
	if lo == nil && hi == nil {
		return ref("integer"), nil
	}
	if lo != nil && hi != nil && *lo > *hi {
		return nil, fmt.Errorf("json schema: no integer between the bounds at %s", at)
	}
	return intRange(lo, hi), nil
}

func (c *schemaCompiler) number(s map[string]any, at string) (*expr, error) {
	var lo, hi *numBound
	for _, k := range []string{"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"} {
		v, ok, err := bound(s, k, at)
		if err != nil {
			return nil, err
		}
		if !ok {
			continue
		}
		if v != math.Trunc(v) || math.Abs(v) > maxIntBound {
			return nil, fmt.Errorf("json schema: %s %v on a number at %s is not supported (number bounds must be integers up to 1e17)", k, v, at)
		}
		b := &numBound{v: int64(v), strict: strings.HasPrefix(k, "exclusive")}
		if strings.HasSuffix(k, "inimum") {
			if lo == nil || b.v > lo.v || b.v == lo.v && b.strict {
				lo = b
			}
		} else if hi == nil || b.v < hi.v || b.v == hi.v && b.strict {
			hi = b
		}
	}
	if lo == nil && hi == nil {
		return ref("number"), nil
	}
	if lo != nil && hi != nil && (lo.v > hi.v || lo.v == hi.v && (lo.strict || hi.strict)) {
		return nil, fmt.Errorf("json schema: no number between the bounds at %s", at)
	}
	return numberRange(lo, hi), nil
}

// numBound is an integer bound of a number, strict for exclusiveMinimum/Maximum.
type numBound struct {
	v      int64
	strict bool
}

// numberRange matches the JSON numbers (without exponent) between integer bounds (nil:
// open), split by sign: x >= 0 is a magnitude between bounds, x < 0 is "-" and one.
func numberRange(lo, hi *numBound) *expr {
	var alts []*expr
	// x >= 0: from max(lo, 0) to hi.
	if hi == nil || hi.v > 0 || hi.v == 0 && !hi.strict {
		low := &numBound{v: 0}
		if lo != nil && lo.v >= 0 {
			low = lo
		}
		alts = append(alts, magnitudeRange(low, hi))
	}
	// x < 0: m = -x > 0 from max(-hi, 0) (exclusive at 0) to -lo.
	if lo == nil || lo.v < 0 {
		low := &numBound{v: 0, strict: true}
		if hi != nil && hi.v < 0 {
			low = &numBound{v: -hi.v, strict: hi.strict}
		}
		var up *numBound
		if lo != nil {
			up = &numBound{v: -lo.v, strict: lo.strict}
		}
		alts = append(alts, seq(lit("-"), magnitudeRange(low, up)))
	}
	return alt(alts...)
}

// magnitudeRange matches the non-negative decimals m (integer part, optional fraction)
// with lo <= m (lo < m when strict) and m <= hi (m < hi when strict; hi nil: open).
func magnitudeRange(lo, hi *numBound) *expr {
	digit := byteRange('0', '9')
	anyFrac := opt(seq(lit("."), plus(digit)))
	zeroFrac := opt(seq(lit("."), plus(lit("0"))))
	// A fraction that is not zero: ".", digits, a non-zero digit, digits.
	nonzeroFrac := seq(lit("."), star(digit), byteRange('1', '9'), star(digit))
	intLit := func(v int64) *expr { return lit(strconv.FormatInt(v, 10)) }
	var alts []*expr
	// Integer parts whose every fraction is inside: [first, last].
	first := lo.v
	if lo.strict {
		first++
	}
	var last *int64
	if hi != nil {
		l := hi.v - 1
		last = &l
	}
	if last == nil || first <= *last {
		alts = append(alts, seq(magnitude(first, last), anyFrac))
	}
	// m just above a strict lower bound: its integer part with a non-zero fraction.
	if lo.strict && (hi == nil || hi.v > lo.v) {
		alts = append(alts, seq(intLit(lo.v), nonzeroFrac))
	}
	// m equal to an inclusive upper bound.
	if hi != nil && !hi.strict && (hi.v > lo.v || hi.v == lo.v && !lo.strict) {
		alts = append(alts, seq(intLit(hi.v), zeroFrac))
	}
	return alt(alts...)
}

func (c *schemaCompiler) array(s map[string]any, at string) (*expr, error) {
	minItems, err := intKeyword(s, "minItems", at, 0)
	if err != nil {
		return nil, err
	}
	maxItems, err := intKeyword(s, "maxItems", at, -1)
	if err != nil {
		return nil, err
	}
	if maxItems >= 0 && maxItems < minItems {
		return nil, fmt.Errorf("json schema: maxItems %d < minItems %d at %s", maxItems, minItems, at)
	}
	var item *expr = ref("value")
	itemsAllowed := true
	if v, ok := s["items"]; ok {
		if b, isBool := v.(bool); isBool && !b {
			itemsAllowed = false
		} else {
			if item, err = c.schema(v, at+"/items"); err != nil {
				return nil, err
			}
		}
	}
	sep := seq(lit(","), ref("ws"))
	if p, ok := s["prefixItems"]; ok {
		if _, has := s["minItems"]; has {
			return nil, fmt.Errorf("json schema: prefixItems with minItems at %s is not supported", at)
		}
		if _, has := s["maxItems"]; has {
			return nil, fmt.Errorf("json schema: prefixItems with maxItems at %s is not supported", at)
		}
		list, ok := p.([]any)
		if !ok || len(list) == 0 {
			return nil, fmt.Errorf("json schema: prefixItems at %s is not a non-empty array", at)
		}
		// [ p0 (, p1 (, p2 ... (, item)*)?)? ]: any prefix of the prefix items, then
		// the others only after all of them.
		var tail *expr = empty()
		if itemsAllowed {
			tail = star(seq(sep, item, ref("ws")))
		}
		for i := len(list) - 1; i >= 0; i-- {
			x, err := c.schema(list[i], fmt.Sprintf("%s/prefixItems/%d", at, i))
			if err != nil {
				return nil, err
			}
			name := c.fresh("prefix")
			if i == 0 {
				c.def.define(name, seq(x, ref("ws"), tail))
			} else {
				c.def.define(name, opt(seq(sep, x, ref("ws"), tail)))
			}
			tail = ref(name)
		}
		return seq(lit("["), ref("ws"), opt(tail), lit("]")), nil
	}
	if !itemsAllowed {
		if minItems > 0 {
			return nil, fmt.Errorf("json schema: items false with minItems at %s allows nothing", at)
		}
		return seq(lit("["), ref("ws"), lit("]")), nil
	}
	name := c.fresh("item")
	c.def.define(name, seq(item, ref("ws")))
	one := ref(name)
	var rest *expr
	if maxItems < 0 {
		rest = repeat(seq(sep, one), max(minItems-1, 0), -1)
	} else {
		rest = repeat(seq(sep, one), max(minItems-1, 0), max(maxItems-1, 0))
	}
	var body *expr = seq(one, rest)
	if maxItems == 0 {
		body = empty()
	} else if minItems == 0 {
		body = opt(body)
	}
	return seq(lit("["), ref("ws"), body, lit("]")), nil
}

func (c *schemaCompiler) obj(s map[string]any, at string) (*expr, error) {
	props, _ := s["properties"].(map[string]any)
	if _, ok := s["properties"]; ok && props == nil {
		return nil, fmt.Errorf("json schema: properties at %s is not an object", at)
	}
	required := map[string]bool{}
	if v, ok := s["required"]; ok {
		list, ok := v.([]any)
		if !ok {
			return nil, fmt.Errorf("json schema: required at %s is not an array", at)
		}
		for _, e := range list {
			name, ok := e.(string)
			if !ok {
				return nil, fmt.Errorf("json schema: required at %s lists a non-string", at)
			}
			if _, ok := props[name]; !ok {
				return nil, fmt.Errorf("json schema: required property %q at %s is not in properties", name, at)
			}
			required[name] = true
		}
	}
	// Extra properties: those additionalProperties allows; none by default once
	// properties are given (strict), any without them.
	var extra *expr
	if v, ok := s["additionalProperties"]; ok {
		if b, isBool := v.(bool); isBool {
			if b {
				extra = ref("value")
			}
		} else {
			x, err := c.schema(v, at+"/additionalProperties")
			if err != nil {
				return nil, err
			}
			extra = x
		}
	}
	names := propertyOrder(props)
	if _, ok := s["additionalProperties"]; !ok && len(names) == 0 {
		extra = ref("value")
	}
	kvs := make([]*expr, len(names))
	for i, name := range names {
		x, err := c.schema(props[name], at+"/properties/"+name)
		if err != nil {
			return nil, err
		}
		key, err := jsonLiteral(name)
		if err != nil {
			return nil, err
		}
		kvs[i] = seq(key, ref("ws"), lit(":"), ref("ws"), x, ref("ws"))
	}
	sep := seq(lit(","), ref("ws"))
	var extraKV *expr
	if extra != nil {
		kv := c.fresh("extra")
		c.def.define(kv, seq(c.otherKey(names), ref("ws"), lit(":"), ref("ws"), extra, ref("ws")))
		extraKV = ref(kv)
	}
	// after[i]: the rest from property i once one was written; first[i]: before any.
	base := c.fresh("obj")
	after := func(i int) string { return fmt.Sprintf("%s.a%d", base, i) }
	first := func(i int) string { return fmt.Sprintf("%s.f%d", base, i) }
	n := len(names)
	if extraKV != nil {
		c.def.define(after(n), star(seq(sep, extraKV)))
		c.def.define(first(n), opt(seq(extraKV, ref(after(n)))))
	} else {
		c.def.define(after(n), empty())
		c.def.define(first(n), empty())
	}
	for i := n - 1; i >= 0; i-- {
		withI := seq(sep, kvs[i], ref(after(i+1)))
		startI := seq(kvs[i], ref(after(i+1)))
		if required[names[i]] {
			c.def.define(after(i), withI)
			c.def.define(first(i), startI)
		} else {
			c.def.define(after(i), alt(withI, ref(after(i+1))))
			c.def.define(first(i), alt(startI, ref(first(i+1))))
		}
	}
	return seq(lit("{"), ref("ws"), ref(first(0)), lit("}")), nil
}

// orderKey holds, in every object decodeOrdered makes, its keys in the text's order.
const orderKey = "\x00order"

// otherKey matches a JSON string that is none of names, so that an additional property
// cannot repeat a declared one (whose value the parser would then replace). It works on
// the names' characters when they are printable ASCII without '"' or '\\'; otherwise any
// key is allowed.
func (c *schemaCompiler) otherKey(names []string) *expr {
	if len(names) == 0 {
		return ref("string")
	}
	for _, n := range names {
		for i := 0; i < len(n); i++ {
			if n[i] < 0x20 || n[i] >= 0x7f || n[i] == '"' || n[i] == '\\' {
				return ref("string")
			}
		}
	}
	type node struct {
		children map[byte]*node
		order    []byte
		terminal bool
	}
	root := &node{children: map[byte]*node{}}
	for _, n := range names {
		at := root
		for i := 0; i < len(n); i++ {
			next, ok := at.children[n[i]]
			if !ok {
				next = &node{children: map[byte]*node{}}
				at.children[n[i]] = next
				at.order = append(at.order, n[i])
			}
			at = next
		}
		at.terminal = true
	}
	conv := regexConv{mode: jsonString}
	rest := seq(star(ref("char")), lit(`"`)) // once off the names' trie, any key
	var build func(n *node) *expr
	build = func(n *node) *expr {
		var alts []*expr
		if !n.terminal {
			alts = append(alts, lit(`"`))
		}
		var others []runeRange
		next := rune(0)
		sorted := append([]byte(nil), n.order...)
		sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
		for _, b := range sorted {
			alts = append(alts, seq(lit(string(b)), build(n.children[b])))
			if rune(b) > next {
				others = append(others, runeRange{next, rune(b) - 1})
			}
			next = rune(b) + 1
		}
		others = append(others, runeRange{next, utf8.MaxRune})
		alts = append(alts, seq(conv.class(others), rest))
		return alt(alts...)
	}
	name := c.fresh("key")
	c.def.define(name, seq(lit(`"`), build(root)))
	return ref(name)
}

// propertyOrder lists the properties in the schema text's order.
func propertyOrder(props map[string]any) []string {
	order, _ := props[orderKey].([]string)
	return order
}

// decodeOrdered decodes one JSON value as Decode into any does (numbers as json.Number),
// recording each object's key order under orderKey.
func decodeOrdered(dec *json.Decoder) (any, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch tok {
	case json.Delim('{'):
		m := map[string]any{}
		var order []string
		for dec.More() {
			k, err := dec.Token()
			if err != nil {
				return nil, err
			}
			key := k.(string)
			v, err := decodeOrdered(dec)
			if err != nil {
				return nil, err
			}
			if _, dup := m[key]; !dup {
				order = append(order, key)
			}
			m[key] = v
		}
		if _, err := dec.Token(); err != nil {
			return nil, err
		}
		m[orderKey] = order
		return m, nil
	case json.Delim('['):
		list := []any{}
		for dec.More() {
			v, err := decodeOrdered(dec)
			if err != nil {
				return nil, err
			}
			list = append(list, v)
		}
		if _, err := dec.Token(); err != nil {
			return nil, err
		}
		return list, nil
	}
	return tok, nil
}

func (c *schemaCompiler) ref(p, at string) (*expr, error) {
	if name, ok := c.refs[p]; ok {
		return ref(name), nil
	}
	if !strings.HasPrefix(p, "#") {
		return nil, fmt.Errorf("json schema: $ref %q at %s is not a local reference (#...)", p, at)
	}
	target := c.root
	if p != "#" {
		if !strings.HasPrefix(p, "#/") {
			return nil, fmt.Errorf("json schema: $ref %q at %s is not a JSON pointer", p, at)
		}
		for _, tok := range strings.Split(p[2:], "/") {
			tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
			m, ok := target.(map[string]any)
			if !ok {
				return nil, fmt.Errorf("json schema: $ref %q at %s does not resolve", p, at)
			}
			if target, ok = m[tok]; !ok {
				return nil, fmt.Errorf("json schema: $ref %q at %s does not resolve", p, at)
			}
		}
	}
	name := c.fresh("ref")
	c.refs[p] = name
	x, err := c.schema(target, p)
	if err != nil {
		return nil, err
	}
	c.def.define(name, x)
	return ref(name), nil
}

// jsonLiteral matches v's JSON encoding.
func jsonLiteral(v any) (*expr, error) {
	var buf bytes.Buffer
	if err := encodeOrdered(&buf, v); err != nil {
		return nil, fmt.Errorf("json schema: %w", err)
	}
	return lit(buf.String()), nil
}

// encodeOrdered writes v compactly, objects in their decoded key order.
func encodeOrdered(buf *bytes.Buffer, v any) error {
	switch v := v.(type) {
	case map[string]any:
		buf.WriteByte('{')
		for i, k := range propertyOrder(v) {
			if i > 0 {
				buf.WriteByte(',')
			}
			if err := encodeOrdered(buf, k); err != nil {
				return err
			}
			buf.WriteByte(':')
			if err := encodeOrdered(buf, v[k]); err != nil {
				return err
			}
		}
		buf.WriteByte('}')
		return nil
	case []any:
		buf.WriteByte('[')
		for i, e := range v {
			if i > 0 {
				buf.WriteByte(',')
			}
			if err := encodeOrdered(buf, e); err != nil {
				return err
			}
		}
		buf.WriteByte(']')
		return nil
	}
	enc := json.NewEncoder(buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return err
	}
	buf.Truncate(buf.Len() - 1) // Encode's newline
	return nil
}
