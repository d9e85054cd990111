package grammar

import (
	"fmt"
	"strconv"
	"unicode/utf8"
)

// gbnfDef parses a grammar in llama.cpp's GBNF: rules `name ::= alternatives`, with
// "literals", [classes] ([^...] negated), . (any character), rule names, ( groups ),
// the postfix operators * + ? {m} {m,} {m,n}, and # comments. A rule ends at a newline
// outside parentheses unless the next line continues it after a |. Matching starts at
// root.
func gbnfDef(src string) (*grammarDef, error) {
	p := &gbnfParser{src: src, def: newDef("root")}
	if err := p.parse(); err != nil {
		return nil, fmt.Errorf("gbnf: %w", err)
	}
	if _, ok := p.def.rules["root"]; !ok {
		return nil, fmt.Errorf("gbnf: no root rule")
	}
	for _, name := range p.refs {
		if _, ok := p.def.rules[name]; !ok {
			return nil, fmt.Errorf("gbnf: rule %q is used but not defined", name)
		}
	}
	return p.def, nil
}

type gbnfParser struct {
	src  string
	pos  int
	def  *grammarDef
	refs []string
}

func (p *gbnfParser) errorf(format string, args ...any) error {
	line, col := 1, 1
	for i := 0; i < p.pos && i < len(p.src); i++ {
		if p.src[i] == '\n' {
			line, col = line+1, 1
		} else {
			col++
		}
	}
	return fmt.Errorf("line %d col %d: %s", line, col, fmt.Sprintf(format, args...))
}

// space skips blanks and comments, and newlines too when nested.
func (p *gbnfParser) space(newlines bool) {
	for p.pos < len(p.src) {
		c := p.src[p.pos]
		switch {
		case c == ' ' || c == '\t' || c == '\r':
			p.pos++
		case c == '\n' && newlines:
			p.pos++
		case c == '#':
			for p.pos < len(p.src) && p.src[p.pos] != '\n' {
				p.pos++
			}
		default:
			return
		}
	}
}

func isNameByte(c byte) bool {
	return c == '-' || c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

func (p *gbnfParser) name() string {
	start := p.pos
	for p.pos < len(p.src) && isNameByte(p.src[p.pos]) {
		p.pos++
	}
	return p.src[start:p.pos]
}

func (p *gbnfParser) parse() error {
	for {
		p.space(true)
		if p.pos >= len(p.src) {
			return nil
		}
		name := p.name()
		if name == "" {
			return p.errorf("expected a rule name")
		}
		p.space(false)
		if len(p.src)-p.pos < 3 || p.src[p.pos:p.pos+3] != "::=" {
			return p.errorf("expected ::= after %q", name)
		}
		p.pos += 3
		p.space(true)
		x, err := p.alternatives(false)
		if err != nil {
			return err
		}
		if _, dup := p.def.rules[name]; dup {
			return p.errorf("rule %q is defined twice", name)
		}
		p.def.define(name, x)
		if p.pos < len(p.src) && p.src[p.pos] != '\n' {
			return p.errorf("unexpected %q", p.src[p.pos])
		}
	}
}

func (p *gbnfParser) alternatives(nested bool) (*expr, error) {
	var alts []*expr
	for {
		s, err := p.sequence(nested)
		if err != nil {
			return nil, err
		}
		alts = append(alts, s)
		if p.pos < len(p.src) && p.src[p.pos] == '|' {
			p.pos++
			p.space(true)
			continue
		}
		break
	}
	if len(alts) == 1 {
		return alts[0], nil
	}
	return alt(alts...), nil
}

func (p *gbnfParser) sequence(nested bool) (*expr, error) {
	var items []*expr
	for p.pos < len(p.src) {
		c := p.src[p.pos]
		var x *expr
		var err error
		switch {
		case c == '"':
			p.pos++
			x, err = p.literal()
		case c == '[':
			p.pos++
			x, err = p.class()
		case c == '.':
			p.pos++
			x = anyRune()
		case c == '(':
			p.pos++
			p.space(true)
			if x, err = p.alternatives(true); err != nil {
				return nil, err
			}
			if p.pos >= len(p.src) || p.src[p.pos] != ')' {
				return nil, p.errorf("expected )")
			}
			p.pos++
		case isNameByte(c):
			name := p.name()
			// A name followed by ::= starts the next rule (a rule may end without a
			// newline only at the end of the text).
			save := p.pos
			p.space(true)
			if len(p.src)-p.pos >= 3 && p.src[p.pos:p.pos+3] == "::=" {
				return nil, p.errorf("rule %q starts before the previous rule ended with a newline", name)
			}
			p.pos = save
			p.refs = append(p.refs, name)
			x = ref(name)
		default:
			goto done
		}
		if err != nil {
			return nil, err
		}
		p.space(nested)
		x, err = p.postfix(x, nested)
		if err != nil {
			return nil, err
		}
		items = append(items, x)
	}
done:
	if len(items) == 1 {
		return items[0], nil
	}
	return seq(items...), nil
}

func (p *gbnfParser) postfix(x *expr, nested bool) (*expr, error) {
	for p.pos < len(p.src) {
		switch p.src[p.pos] {
		case '*':
			x = star(x)
		case '+':
			x = plus(x)
		case '?':
			x = opt(x)
		case '{':
			p.pos++
			p.space(false)
			lo, ok := p.number()
			if !ok {
				return nil, p.errorf("expected a number after {")
			}
			hi := lo
			p.space(false)
			if p.pos < len(p.src) && p.src[p.pos] == ',' {
				p.pos++
				p.space(false)
				if n, ok := p.number(); ok {
					hi = n
				} else {
					hi = -1
				}
				p.space(false)
			}
			if p.pos >= len(p.src) || p.src[p.pos] != '}' {
				return nil, p.errorf("expected }")
			}
			if lo > maxRepeat || hi > maxRepeat {
				return nil, p.errorf("repetition bound over the limit %d", maxRepeat)
			}
			if hi >= 0 && hi < lo {
				return nil, p.errorf("repetition {%d,%d} has max < min", lo, hi)
			}
			x = repeat(x, lo, hi)
		default:
			return x, nil
		}
		p.pos++
		p.space(nested)
	}
	return x, nil
}

func (p *gbnfParser) number() (int, bool) {
	start := p.pos
	for p.pos < len(p.src) && p.src[p.pos] >= '0' && p.src[p.pos] <= '9' {
		p.pos++
	}
	if start == p.pos || p.pos-start > 6 {
		return 0, false
	}
	n, _ := strconv.Atoi(p.src[start:p.pos])
	return n, true
}

// char reads one character of a literal or class, with escapes.
func (p *gbnfParser) char() (rune, error) {
	if p.pos >= len(p.src) {
		return 0, p.errorf("unexpected end")
	}
	c := p.src[p.pos]
	if c != '\\' {
		r, n := utf8.DecodeRuneInString(p.src[p.pos:])
		p.pos += n
		return r, nil
	}
	p.pos++
	if p.pos >= len(p.src) {
		return 0, p.errorf("unexpected end after \\")
	}
	e := p.src[p.pos]
	p.pos++
	switch e {
	case 'n':
		return '\n', nil
	case 't':
		return '\t', nil
	case 'r':
		return '\r', nil
	case '\\', '"', '[', ']', '-', '^', '/':
		return rune(e), nil
	case 'x', 'u', 'U':
		n := map[byte]int{'x': 2, 'u': 4, 'U': 8}[e]
		if len(p.src)-p.pos < n {
			return 0, p.errorf("short \\%c escape", e)
		}
		v, err := strconv.ParseUint(p.src[p.pos:p.pos+n], 16, 32)
		if err != nil || v > utf8.MaxRune {
			return 0, p.errorf("bad \\%c escape", e)
		}
		p.pos += n
		return rune(v), nil
	}
	return 0, p.errorf("unknown escape \\%c", e)
}

func (p *gbnfParser) literal() (*expr, error) {
	var b []byte
	for {
		if p.pos >= len(p.src) {
			return nil, p.errorf("unterminated literal")
		}
		if p.src[p.pos] == '"' {
			p.pos++
			break
		}
		r, err := p.char()
		if err != nil {
			return nil, err
		}
		b = utf8.AppendRune(b, r)
	}
	if len(b) == 0 {
		return empty(), nil
	}
	return lit(string(b)), nil
}

func (p *gbnfParser) class() (*expr, error) {
	negated := false
	if p.pos < len(p.src) && p.src[p.pos] == '^' {
		negated = true
		p.pos++
	}
	var rs []runeRange
	for {
		if p.pos >= len(p.src) {
			return nil, p.errorf("unterminated character class")
		}
		if p.src[p.pos] == ']' {
			p.pos++
			break
		}
		lo, err := p.char()
		if err != nil {
			return nil, err
		}
		hi := lo
		if p.pos+1 < len(p.src) && p.src[p.pos] == '-' && p.src[p.pos+1] != ']' {
			p.pos++
			if hi, err = p.char(); err != nil {
				return nil, err
			}
			if hi < lo {
				return nil, p.errorf("class range %q-%q is reversed", lo, hi)
			}
		}
		rs = append(rs, runeRange{lo, hi})
	}
	if negated {
		rs = negate(rs)
	}
	if len(rs) == 0 {
		return nil, p.errorf("empty character class")
	}
	return utf8Expr(rs), nil
}
