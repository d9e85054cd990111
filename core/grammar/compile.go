package grammar

import (
	"container/list"
	"encoding/json"
	"fmt"
	"sync"
)

// Kind is the form a grammar is written in.
type Kind string

const (
	JSONSchema Kind = "json_schema" // a JSON Schema (response_format json_schema, guided_json)
	JSONObject Kind = "json_object" // any JSON object; the source is ignored
	Regex      Kind = "regex"       // a regular expression the whole output matches (guided_regex)
	GBNF       Kind = "grammar"     // llama.cpp's GBNF (guided_grammar)
	Choice     Kind = "choice"      // a JSON array of strings, the output one of them (guided_choice)
	// Tagged is one or more structures, each a literal begin, a JSON value under a
	// schema and a literal end, as {"structures": [{"begin", "schema", "end"}...],
	// "separator", "min", "max" (0: no bound)}: tool calls in a model's own format.
	Tagged Kind = "tagged"
)

// maxSource bounds a grammar's text.
const maxSource = 1 << 20

// Compile compiles source, written in kind, against v.
func Compile(v *Vocabulary, kind Kind, source string) (*Grammar, error) {
	if len(source) > maxSource {
		return nil, fmt.Errorf("grammar: %s of %d bytes is over the limit of %d", kind, len(source), maxSource)
	}
	var d *grammarDef
	var err error
	switch kind {
	case JSONSchema:
		d, err = jsonSchemaDef(source)
	case JSONObject:
		d = jsonObjectDef()
	case Regex:
		var x *expr
		if x, err = regexExpr(source, rawBytes, false); err == nil {
			d = newDef("root")
			d.define("root", x)
		}
	case GBNF:
		d, err = gbnfDef(source)
	case Choice:
		d, err = choiceDef(source)
	case Tagged:
		d, err = taggedDef(source)
	default:
		return nil, fmt.Errorf("grammar: unknown kind %q", kind)
	}
	if err != nil {
		return nil, err
	}
	p, err := compile(d)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", kind, err)
	}
	g, err := newGrammar(kind, p, v)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", kind, err)
	}
	return g, nil
}

func choiceDef(source string) (*grammarDef, error) {
	var choices []string
	if err := json.Unmarshal([]byte(source), &choices); err != nil {
		return nil, fmt.Errorf("choice: not a JSON array of strings: %w", err)
	}
	if len(choices) == 0 {
		return nil, fmt.Errorf("choice: no choices")
	}
	alts := make([]*expr, len(choices))
	for i, c := range choices {
		alts[i] = lit(c)
	}
	d := newDef("root")
	d.define("root", alt(alts...))
	return d, nil
}

// Cache keeps compiled grammars by (kind, source), the most recently used first; it is
// safe for concurrent use. A failed compile is cached too, so a bad schema sent again
// is refused at once.
type Cache struct {
	vocab *Vocabulary
	max   int
	mu    sync.Mutex
	order *list.List
	byKey map[cacheKey]*list.Element
}

type cacheKey struct {
	kind   Kind
	source string
}

type cacheEntry struct {
	key  cacheKey
	once sync.Once
	g    *Grammar
	err  error
}

// NewCache caches up to n grammars compiled against v.
func NewCache(v *Vocabulary, n int) *Cache {
	return &Cache{vocab: v, max: max(n, 1), order: list.New(), byKey: map[cacheKey]*list.Element{}}
}

// Vocabulary is the vocabulary the cache compiles against.
func (c *Cache) Vocabulary() *Vocabulary { return c.vocab }

// Get returns the grammar of (kind, source), compiling it on first use.
func (c *Cache) Get(kind Kind, source string) (*Grammar, error) {
	if kind == JSONObject {
		source = ""
	}
	k := cacheKey{kind, source}
	c.mu.Lock()
	el, ok := c.byKey[k]
	if ok {
		c.order.MoveToFront(el)
	} else {
		el = c.order.PushFront(&cacheEntry{key: k})
		c.byKey[k] = el
		for c.order.Len() > c.max {
			last := c.order.Back()
			c.order.Remove(last)
			delete(c.byKey, last.Value.(*cacheEntry).key)
		}
	}
	e := el.Value.(*cacheEntry)
	c.mu.Unlock()
	e.once.Do(func() { e.g, e.err = Compile(c.vocab, kind, source) })
	return e.g, e.err
}
