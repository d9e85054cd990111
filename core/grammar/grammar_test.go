package grammar

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"
)

func compileT(t *testing.T, v *Vocabulary, kind Kind, src string) *Grammar {
	t.Helper()
	g, err := Compile(v, kind, src)
	if err != nil {
		t.Fatalf("compile %s %q: %v", kind, src, err)
	}
	return g
}

// TestSchemaCorpus: every output produced under each schema of testdata/schemas by
// random choices among the allowed tokens (greedy and sampled) parses and validates, and
// EOS is allowed exactly where the output so far is a complete valid value.
func TestSchemaCorpus(t *testing.T) {
	v, _, eos := testVocab(t)
	files, err := filepath.Glob("testdata/schemas/*.json")
	if err != nil || len(files) < 10 {
		t.Fatalf("schemas: %v %d", err, len(files))
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			src, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			var schema any
			dec := json.NewDecoder(strings.NewReader(string(src)))
			dec.UseNumber()
			if err := dec.Decode(&schema); err != nil {
				t.Fatal(err)
			}
			vd := &validator{root: schema}
			g := compileT(t, v, JSONSchema, string(src))
			for i := 0; i < 24; i++ {
				rng := rand.New(rand.NewPCG(uint64(i), 7))
				greedy := i%2 == 0
				check := func(out []byte, eosOK bool) {
					val, err := parseJSON(out)
					complete := err == nil && vd.validate(schema, val, "#") == nil
					if eosOK != complete {
						t.Fatalf("after %q: EOS allowed %v, output complete and valid %v (%v)", out, eosOK, complete, err)
					}
				}
				out := walk(t, g, eos, rng, greedy, 10+rng.IntN(120), check)
				val, err := parseJSON(out)
				if err != nil {
					t.Fatalf("output %q does not parse: %v", out, err)
				}
				if err := vd.validate(schema, val, "#"); err != nil {
					t.Fatalf("output %q does not validate: %v", out, err)
				}
				if i < 2 {
					t.Logf("%s", out)
				}
			}
		})
	}
}

func TestJSONObject(t *testing.T) {
	v, _, eos := testVocab(t)
	g := compileT(t, v, JSONObject, "")
	for i := 0; i < 30; i++ {
		rng := rand.New(rand.NewPCG(uint64(i), 1))
		out := walk(t, g, eos, rng, i%2 == 0, rng.IntN(200), func(out []byte, eosOK bool) {
			val, err := parseJSON(out)
			_, isObject := val.(map[string]any)
			complete := err == nil && isObject
			if eosOK != complete {
				t.Fatalf("after %q: EOS allowed %v, a complete object %v", out, eosOK, complete)
			}
		})
		if _, err := parseJSON(out); err != nil {
			t.Fatalf("%q: %v", out, err)
		}
	}
}

// TestRegex: outputs match the regex as Go's regexp reads it, and EOS is allowed exactly
// where the output so far matches it whole.
func TestRegex(t *testing.T) {
	v, _, eos := testVocab(t)
	for _, re := range []string{
		`[a-z]+@[a-z]+\.com`,
		`\d{3}-\d{4}`,
		`(cat|dog|bird)s?`,
		`^[A-Z][a-z]{2,5} \d+$`,
		`(?i)yes|no`,
		`[^"\n]{1,8}é?`,
		`(ab)*c?`,
		`\w+\s\w+`,
		`.{0,4}日本`,
		`-?(0|[1-9][0-9]*)(\.[0-9]+)?`,
	} {
		t.Run(re, func(t *testing.T) {
			g := compileT(t, v, Regex, re)
			full := regexp.MustCompile(`^(?:` + re + `)$`)
			for i := 0; i < 20; i++ {
				rng := rand.New(rand.NewPCG(uint64(i), 3))
				out := walk(t, g, eos, rng, i%2 == 0, rng.IntN(40), func(out []byte, eosOK bool) {
					// Go's regexp reads an invalid byte as U+FFFD; the grammar
					// writes only valid UTF-8, so a partial character is no match.
					if m := full.Match(out) && utf8.Valid(out); m != eosOK {
						t.Fatalf("after %q: EOS allowed %v, matches %v", out, eosOK, m)
					}
				})
				if !full.Match(out) {
					t.Fatalf("%q does not match", out)
				}
			}
		})
	}
}

func TestGBNF(t *testing.T) {
	v, _, eos := testVocab(t)
	src := `# arithmetic
root ::= expr
expr ::= term (("+" | "-") term)*
term ::= factor ("*" factor)*
factor ::= [0-9]{1,3} | "(" expr ")"
`
	g := compileT(t, v, GBNF, src)
	shape := regexp.MustCompile(`^[0-9+\-*()]+$`)
	for i := 0; i < 20; i++ {
		rng := rand.New(rand.NewPCG(uint64(i), 5))
		out := walk(t, g, eos, rng, false, rng.IntN(30), nil)
		if !shape.Match(out) || !balanced(string(out)) {
			t.Fatalf("%q is not an expression", out)
		}
	}
	// Quoted text, negated classes and escapes.
	g = compileT(t, v, GBNF, "root ::= \"say \\\"\" [^\"\\n]+ \"\\\"\"\n")
	for i := 0; i < 10; i++ {
		out := walk(t, g, eos, rand.New(rand.NewPCG(uint64(i), 6)), false, 8, nil)
		if !regexp.MustCompile(`^say "[^"\n]+"$`).Match(out) {
			t.Fatalf("%q", out)
		}
	}
}

func balanced(s string) bool {
	d := 0
	for _, c := range s {
		switch c {
		case '(':
			d++
		case ')':
			d--
		}
		if d < 0 {
			return false
		}
	}
	return d == 0
}

func TestChoice(t *testing.T) {
	v, _, eos := testVocab(t)
	g := compileT(t, v, Choice, `["New York", "Paris", "Paris Hilton"]`)
	seen := map[string]bool{}
	for i := 0; i < 30; i++ {
		out := walk(t, g, eos, rand.New(rand.NewPCG(uint64(i), 9)), i%2 == 0, 5, nil)
		seen[string(out)] = true
	}
	for s := range seen {
		if s != "New York" && s != "Paris" && s != "Paris Hilton" {
			t.Fatalf("output %q is not a choice", s)
		}
	}
}

// TestEOSAndSpecial: special tokens are never allowed; EOS only at an end; after EOS
// nothing.
func TestEOSAndSpecial(t *testing.T) {
	v, special, eos := testVocab(t)
	g := compileT(t, v, Regex, `ab?`)
	m, _ := g.NewMatcher()
	mask := make([]uint32, m.Words())
	bit := func(id int32) bool { return mask[id>>5]&(1<<(id&31)) != 0 }
	m.FillMask(mask)
	if bit(eos) || bit(special) || !bit('a') || bit('b') {
		t.Fatalf("start: eos %v special %v a %v b %v", bit(eos), bit(special), bit('a'), bit('b'))
	}
	if err := m.Accept(eos); err == nil {
		t.Fatal("EOS accepted at the start")
	}
	if err := m.Accept(special); err == nil {
		t.Fatal("special token accepted")
	}
	if err := m.Accept('a'); err != nil {
		t.Fatal(err)
	}
	m.FillMask(mask)
	if !bit(eos) || !bit('b') || bit('a') || bit(special) {
		t.Fatalf("after a: eos %v b %v a %v", bit(eos), bit('b'), bit('a'))
	}
	if err := m.Accept(eos); err != nil || !m.Ended() {
		t.Fatal(err)
	}
	m.FillMask(mask)
	for _, w := range mask {
		if w != 0 {
			t.Fatal("a token allowed after EOS")
		}
	}
	if err := m.Accept('b'); err == nil {
		t.Fatal("token after EOS accepted")
	}
}

// TestRollback: rolling back N tokens restores the mask and acceptance of N tokens ago,
// as a rejected speculative draft needs.
func TestRollback(t *testing.T) {
	v, _, eos := testVocab(t)
	schema := `{"type":"object","properties":{"unit":{"enum":["celsius","fahrenheit"]},"n":{"type":"integer"}},"required":["unit","n"]}`
	g := compileT(t, v, JSONSchema, schema)
	m, _ := g.NewMatcher()
	tok := func(s string) int32 {
		for id, b := range v.bytes {
			if string(b) == s {
				return int32(id)
			}
		}
		t.Fatalf("no token %q", s)
		return 0
	}
	words := m.Words()
	before := make([]uint32, words)
	for _, s := range []string{`{"`, "unit", `":`, ` "`} {
		if err := m.Accept(tok(s)); err != nil {
			t.Fatalf("%q: %v", s, err)
		}
	}
	m.FillMask(before)
	for _, s := range []string{"celsius", `",`, ` "`} {
		if err := m.Accept(tok(s)); err != nil {
			t.Fatalf("%q: %v", s, err)
		}
	}
	if err := m.Rollback(3); err != nil {
		t.Fatal(err)
	}
	after := make([]uint32, words)
	m.FillMask(after)
	for i := range before {
		if before[i] != after[i] {
			t.Fatal("mask differs after rollback")
		}
	}
	if err := m.Accept(tok("fa")); err != nil {
		t.Fatal(err)
	}
	if err := m.Rollback(6); err == nil {
		t.Fatal("rollback past the start accepted")
	}
	if m.Accepted() != 5 {
		t.Fatalf("accepted %d, want 5", m.Accepted())
	}
	_ = eos
}

// TestRefused: features the compiler cannot enforce are refused at compile, naming them.
func TestRefused(t *testing.T) {
	v, _, _ := testVocab(t)
	for _, c := range []struct {
		kind      Kind
		src, want string
	}{
		{JSONSchema, `{"type":"object","patternProperties":{"^a":{}}}`, `"patternProperties"`},
		{JSONSchema, `{"not":{"type":"string"}}`, `"not"`},
		{JSONSchema, `{"type":"array","uniqueItems":true}`, `"uniqueItems"`},
		{JSONSchema, `{"type":"number","maximum":3.5}`, `maximum`},
		{JSONSchema, `{"type":"number","minimum":3,"exclusiveMaximum":3}`, `no number between`},
		{JSONSchema, `{"type":"integer","multipleOf":3}`, `"multipleOf"`},
		{JSONSchema, `{"$ref":"https://example.com/s.json"}`, `not a local reference`},
		{JSONSchema, `{"$ref":"#/$defs/missing"}`, `does not resolve`},
		{JSONSchema, `{"type":"object","properties":{"a":{}},"required":["b"]}`, `"b"`},
		{JSONSchema, `{"type":"string","maxLength":100000}`, `over the limit`},
		{JSONSchema, `{"type":"strin"}`, `unknown type "strin"`},
		{JSONSchema, `{"type":`, `json schema`},
		{Regex, `a\bb`, `word boundaries`},
		{Regex, `a{1,20000}`, `invalid repeat count`},
		{Regex, `(a`, `missing closing )`},
		{GBNF, "root ::= foo\n", `"foo" is used but not defined`},
		{GBNF, "root ::= root \"a\" | \"b\"\n", `left-recursive`},
		{GBNF, "expr ::= \"a\"\n", `no root rule`},
		{GBNF, "root ::= [z-a]\n", `reversed`},
		{Choice, `[]`, `no choices`},
		{Kind("xml"), ``, `unknown kind`},
	} {
		_, err := Compile(v, c.kind, c.src)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s %s: got %v, want an error with %s", c.kind, c.src, err, c.want)
		}
	}
}

func TestIntRange(t *testing.T) {
	v, _, _ := testVocab(t)
	for _, c := range []struct {
		schema string
		lo, hi int
	}{
		{`{"type":"integer","minimum":-37,"maximum":1234}`, -37, 1234},
		{`{"type":"integer","minimum":5,"maximum":5}`, 5, 5},
		{`{"type":"integer","exclusiveMinimum":-10,"exclusiveMaximum":-2}`, -9, -3},
		{`{"type":"integer","minimum":99,"maximum":101}`, 99, 101},
	} {
		g := compileT(t, v, JSONSchema, c.schema)
		for n := c.lo - 30; n <= c.hi+30; n++ {
			m, _ := g.NewMatcher()
			ok := true
			for _, b := range []byte(jsonInt(n)) {
				if m.Accept(int32(b)) != nil {
					ok = false
					break
				}
			}
			ok = ok && m.CanEnd()
			if want := n >= c.lo && n <= c.hi; ok != want {
				t.Fatalf("%s: %d accepted %v, want %v", c.schema, n, ok, want)
			}
		}
	}
}

func jsonInt(n int) string { b, _ := json.Marshal(n); return string(b) }

func TestCache(t *testing.T) {
	v, _, _ := testVocab(t)
	c := NewCache(v, 2)
	a, err := c.Get(Regex, "a+")
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := c.Get(Regex, "a+"); b != a {
		t.Fatal("second Get compiled again")
	}
	if _, err := c.Get(Regex, "(a"); err == nil {
		t.Fatal("bad regex compiled")
	}
	c.Get(Regex, "b+")
	if b, _ := c.Get(Regex, "a+"); b == a {
		t.Fatal("the least recently used entry was kept past the cache size")
	}
}

// TestStateLimit: an output that keeps reaching new parser states (ever deeper nesting)
// fails with ErrStateLimit instead of growing without bound, and the grammar's next
// matcher starts on a fresh runtime.
func TestStateLimit(t *testing.T) {
	v, _, _ := testVocab(t)
	g := compileT(t, v, JSONObject, "")
	m, _ := g.NewMatcher()
	if err := m.Accept('{'); err != nil {
		t.Fatal(err)
	}
	for _, b := range []byte(`"a":`) {
		if err := m.Accept(int32(b)); err != nil {
			t.Fatal(err)
		}
	}
	var err error
	for i := 0; i < 2*hardStates && err == nil; i++ {
		err = m.Accept('[')
	}
	if !errors.Is(err, ErrStateLimit) {
		t.Fatalf("deep nesting: %v, want ErrStateLimit", err)
	}
	old := m.rt
	m2, err := g.NewMatcher()
	if err != nil {
		t.Fatal(err)
	}
	if m2.rt == old {
		t.Fatal("a new matcher shares the runtime past its state limit")
	}
}

// TestNumberRange: numbers under integer bounds (inclusive and exclusive, either sign)
// are accepted exactly when they lie within them (-0 is never written).
func TestNumberRange(t *testing.T) {
	v, _, _ := testVocab(t)
	nums := []string{"-100", "-12.5", "-10", "-10.0", "-9.999", "-3", "-2.5", "-1", "-0.5", "0", "0.0", "0.25",
		"1", "1.5", "2", "2.0", "2.01", "9.99", "10", "10.00", "10.5", "11", "100", "1234.5"}
	for _, c := range []struct {
		schema string
		in     func(x float64) bool
	}{
		{`{"type":"number","minimum":0,"maximum":10}`, func(x float64) bool { return x >= 0 && x <= 10 }},
		{`{"type":"number","exclusiveMinimum":0,"exclusiveMaximum":10}`, func(x float64) bool { return x > 0 && x < 10 }},
		{`{"type":"number","minimum":-10,"exclusiveMaximum":2}`, func(x float64) bool { return x >= -10 && x < 2 }},
		{`{"type":"number","exclusiveMinimum":-3}`, func(x float64) bool { return x > -3 }},
		{`{"type":"number","maximum":-1}`, func(x float64) bool { return x <= -1 }},
		{`{"type":"number","exclusiveMaximum":0}`, func(x float64) bool { return x < 0 }},
		{`{"type":"number","minimum":2,"maximum":2}`, func(x float64) bool { return x == 2 }},
	} {
		g := compileT(t, v, JSONSchema, c.schema)
		for _, n := range nums {
			m, _ := g.NewMatcher()
			ok := true
			for _, b := range []byte(n) {
				if m.Accept(int32(b)) != nil {
					ok = false
					break
				}
			}
			ok = ok && m.CanEnd()
			var x float64
			json.Unmarshal([]byte(n), &x)
			if want := c.in(x); ok != want {
				t.Errorf("%s: %s accepted %v, want %v", c.schema, n, ok, want)
			}
		}
	}
	if _, err := Compile(v, JSONSchema, `{"type":"number","maximum":2.5}`); err == nil || !strings.Contains(err.Error(), "maximum") {
		t.Errorf("a fractional bound: %v", err)
	}
}

// TestExtraKeysAvoidDeclared: an additional property's key is never a declared one, so
// the parsed object keeps the declared value (which the validator then checks).
func TestExtraKeysAvoidDeclared(t *testing.T) {
	v, _, _ := testVocab(t)
	g := compileT(t, v, JSONSchema, `{"type":"object","properties":{"id":{"type":"integer"},"idx":{"type":"boolean"}},"additionalProperties":{"type":"string"}}`)
	for _, c := range []struct {
		text string
		ok   bool
	}{
		{`{"id": 1, "i": "x"}`, true}, {`{"id": 1, "idy": "x"}`, true}, {`{"id": 1, "idxx": "x"}`, true},
		{`{"id": 1, "": "x"}`, true}, {`{"id": 1, "é": "x"}`, true}, {`{"x": "y"}`, true},
		{`{"id": 1, "id": "x"}`, false}, {`{"idx": true, "idx": "x"}`, false}, {`{"id": "x"}`, false},
	} {
		m, _ := g.NewMatcher()
		ok := true
		for _, b := range []byte(c.text) {
			if m.Accept(int32(b)) != nil {
				ok = false
				break
			}
		}
		if ok = ok && m.CanEnd(); ok != c.ok {
			t.Errorf("%s: accepted %v, want %v", c.text, ok, c.ok)
		}
	}
}

// TestMaskMatchesBruteForce: along random outputs of every corpus schema, each mask is
// exactly the tokens whose bytes the grammar accepts from the current state (Allowed,
// checked token by token), the context-independent cache notwithstanding: with stacks cut
// at 1 and 2 frames as well as the default, so that many tokens depend on the context.
func TestMaskMatchesBruteForce(t *testing.T) {
	v, _, eos := testVocab(t)
	files, _ := filepath.Glob("testdata/schemas/*.json")
	defer func(k int) { keepFrames = k }(keepFrames)
	for _, k := range []int{1, 2, keepFrames} {
		keepFrames = k
		for _, f := range files {
			maskMatches(t, v, eos, f)
		}
	}
}

func maskMatches(t *testing.T, v *Vocabulary, eos int32, f string) {
	{
		src, _ := os.ReadFile(f)
		g := compileT(t, v, JSONSchema, string(src))
		for i := 0; i < 4; i++ {
			rng := rand.New(rand.NewPCG(uint64(i), 11))
			m, _ := g.NewMatcher()
			mask := make([]uint32, v.MaskWords())
			for step := 0; step < 300; step++ {
				if err := m.FillMask(mask); err != nil {
					t.Fatal(err)
				}
				var allowed []int32
				for id := int32(0); int(id) < v.size; id++ {
					in := mask[id>>5]&(1<<(id&31)) != 0
					if in != m.Allowed(id) {
						t.Fatalf("%s step %d: token %d %q: mask %v, Allowed %v", f, step, id, v.bytes[id], in, !in)
					}
					if in {
						allowed = append(allowed, id)
					}
				}
				var tok int32
				if step < 150 {
					tok = pick(allowed, rng, false)
				} else {
					tok = closer(allowed, v, eos, rng)
				}
				if tok == eos {
					break
				}
				if err := m.Accept(tok); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
}

// TestSharedRuntimeLimit: when matchers sharing a grammar's runtime fill it to the state
// limit, the one that needs more replays its output in a fresh runtime and goes on; only
// an output that alone reaches the limit fails (TestStateLimit).
func TestSharedRuntimeLimit(t *testing.T) {
	defer func(s, h int) { softStates, hardStates = s, h }(softStates, hardStates)
	softStates, hardStates = 1<<20, 200 // no replacement at NewMatcher: both share one runtime
	v, _, _ := testVocab(t)
	g := compileT(t, v, JSONObject, "")
	nest := func(m *Matcher, key string, depth int) error {
		for _, b := range []byte(`{"` + key + `":`) {
			if err := m.Accept(int32(b)); err != nil {
				return err
			}
		}
		for i := 0; i < depth; i++ {
			if err := m.Accept('['); err != nil {
				return err
			}
		}
		return nil
	}
	a, _ := g.NewMatcher()
	b, _ := g.NewMatcher()
	if a.rt != b.rt {
		t.Fatal("the matchers do not share a runtime")
	}
	if err := nest(a, "a", 120); err != nil {
		t.Fatal(err)
	}
	// b nests objects: stacks a never reached.
	for i := 0; i < 40; i++ {
		for _, c := range []byte(`{"b":`) {
			if err := b.Accept(int32(c)); err != nil {
				t.Fatalf("the second output failed: %v", err)
			}
		}
	}
	if b.rt == a.rt {
		t.Fatal("the second matcher did not move to a fresh runtime")
	}
	// b's history survived the move: its mask and a rollback still work.
	mask := make([]uint32, b.Words())
	if err := b.FillMask(mask); err != nil || mask['{'>>5]&(1<<('{'&31)) == 0 {
		t.Fatalf("after the move: %v, '{' allowed %v", err, mask['{'>>5]&(1<<('{'&31)) != 0)
	}
	if err := b.Rollback(2); err != nil || b.Accept('"') != nil || b.Accept(':') != nil {
		t.Fatal("rollback and accept after the move failed")
	}
	if c, _ := g.NewMatcher(); c.rt != b.rt {
		t.Fatal("a new matcher does not start on the fresh runtime")
	}
}

// TestTagged: tool calls in a model's own format (hermes' <tool_call> blocks): one to
// three structures, each its literal begin, arguments valid under its schema, its end.
func TestTagged(t *testing.T) {
	v, _, eos := testVocab(t)
	weather, _ := os.ReadFile("testdata/schemas/get_weather.json")
	src := fmt.Sprintf(`{"structures": [
		{"begin": "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": ", "schema": %s, "end": "}\n</tool_call>"},
		{"begin": "<tool_call>\n{\"name\": \"ping\", \"arguments\": ", "schema": {"type": "object", "properties": {}}, "end": "}\n</tool_call>"}],
		"separator": "\n", "min": 1, "max": 3}`, weather)
	g := compileT(t, v, Tagged, src)
	var schema any
	dec := json.NewDecoder(strings.NewReader(string(weather)))
	dec.UseNumber()
	dec.Decode(&schema)
	block := regexp.MustCompile(`(?s)^<tool_call>\n(\{.*\})\n</tool_call>$`)
	for i := 0; i < 20; i++ {
		out := walk(t, g, eos, rand.New(rand.NewPCG(uint64(i), 13)), i%2 == 0, 60, nil)
		blocks := strings.Split(string(out), "\n<tool_call>")
		if len(blocks) < 1 || len(blocks) > 3 {
			t.Fatalf("%q: %d blocks", out, len(blocks))
		}
		for k, b := range blocks {
			if k > 0 {
				b = "<tool_call>" + b
			}
			m := block.FindStringSubmatch(b)
			if m == nil {
				t.Fatalf("%q is not a <tool_call> block", b)
			}
			var call struct {
				Name      string          `json:"name"`
				Arguments json.RawMessage `json:"arguments"`
			}
			if err := json.Unmarshal([]byte(m[1]), &call); err != nil {
				t.Fatalf("%q: %v", m[1], err)
			}
			switch call.Name {
			case "get_weather":
				args, err := parseJSON(call.Arguments)
				if err != nil || (&validator{root: schema}).validate(schema, args, "#") != nil {
					t.Fatalf("arguments %s do not validate", call.Arguments)
				}
			case "ping":
				if strings.TrimSpace(string(call.Arguments))[0] != '{' {
					t.Fatalf("ping arguments %s", call.Arguments)
				}
			default:
				t.Fatalf("call of %q", call.Name)
			}
		}
	}
	if _, err := Compile(v, Tagged, `{"structures": []}`); err == nil {
		t.Error("no structures compiled")
	}
}

// TestJSONEscapedSlash: JSON's escape `\/` (RFC 8259) is accepted in strings, by the
// json_object grammar and under a schema's string, and plain '/' still is.
func TestJSONEscapedSlash(t *testing.T) {
	v, _, eos := testVocab(t)
	for _, c := range []struct {
		kind Kind
		src  string
	}{{JSONObject, ""}, {JSONSchema, `{"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}`}} {
		g := compileT(t, v, c.kind, c.src)
		for _, out := range []string{`{"a":"http:\/\/x/y"}`, `{"a":"\/"}`} {
			m, err := g.NewMatcher()
			if err != nil {
				t.Fatal(err)
			}
			for i := 0; i < len(out); i++ {
				if err := m.Accept(int32(out[i])); err != nil {
					t.Fatalf("%s: %q at byte %d: %v", c.kind, out, i, err)
				}
			}
			if err := m.Accept(eos); err != nil {
				t.Fatalf("%s: %q: EOS: %v", c.kind, out, err)
			}
		}
	}
}
