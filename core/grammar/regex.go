package grammar

import (
	"fmt"
	"regexp/syntax"
	"unicode"
	"unicode/utf8"
)

// regexMode says what bytes a regex's characters become.
type regexMode uint8

const (
	rawBytes   regexMode = iota // each character as its UTF-8 bytes (a guided_regex output)
	jsonString                  // each character as it is written inside a JSON string
)

// regexExpr compiles a regular expression (Go's RE2 syntax, which covers the JSON Schema
// patterns and vLLM regexes seen in practice) to an expression matching the whole
// output. With search set (JSON Schema's pattern, which matches anywhere in the string)
// a side without its ^ or $ anchor may have any text there.
func regexExpr(pattern string, mode regexMode, search bool) (*expr, error) {
	re, err := syntax.Parse(pattern, syntax.Perl)
	if err != nil {
		return nil, fmt.Errorf("regex %q: %w", pattern, err)
	}
	subs := []*syntax.Regexp{re}
	if re.Op == syntax.OpConcat {
		subs = re.Sub
	}
	begin, end := false, false
	for len(subs) > 0 && isBegin(subs[0]) {
		subs, begin = subs[1:], true
	}
	for len(subs) > 0 && isEnd(subs[len(subs)-1]) {
		subs, end = subs[:len(subs)-1], true
	}
	c := regexConv{mode: mode}
	var parts []*expr
	if search && !begin {
		parts = append(parts, star(c.class(anyCharRanges)))
	}
	for _, s := range subs {
		x, err := c.conv(s)
		if err != nil {
			return nil, fmt.Errorf("regex %q: %w", pattern, err)
		}
		parts = append(parts, x)
	}
	if search && !end {
		parts = append(parts, star(c.class(anyCharRanges)))
	}
	return seq(parts...), nil
}

func isBegin(re *syntax.Regexp) bool {
	return re.Op == syntax.OpBeginText || re.Op == syntax.OpBeginLine
}

func isEnd(re *syntax.Regexp) bool {
	return re.Op == syntax.OpEndText || re.Op == syntax.OpEndLine
}

var (
	anyCharRanges   = []runeRange{{0, utf8.MaxRune}}
	anyCharNotNL    = []runeRange{{0, '\n' - 1}, {'\n' + 1, utf8.MaxRune}}
	jsonEscapedRune = map[rune]string{'"': `\"`, '\\': `\\`, '\n': `\n`, '\r': `\r`, '\t': `\t`, '\b': `\b`, '\f': `\f`}
)

type regexConv struct {
	mode  regexMode
	nodes int
}

func (c *regexConv) conv(re *syntax.Regexp) (*expr, error) {
	if c.nodes++; c.nodes > maxExprNodes {
		return nil, fmt.Errorf("too large")
	}
	switch re.Op {
	case syntax.OpNoMatch:
		return nil, fmt.Errorf("it matches nothing")
	case syntax.OpEmptyMatch:
		return empty(), nil
	case syntax.OpLiteral:
		subs := make([]*expr, len(re.Rune))
		for i, r := range re.Rune {
			if re.Flags&syntax.FoldCase != 0 {
				subs[i] = c.class(foldRanges(r))
			} else {
				subs[i] = c.class([]runeRange{{r, r}})
			}
		}
		return seq(subs...), nil
	case syntax.OpCharClass:
		var rs []runeRange
		for i := 0; i+1 < len(re.Rune); i += 2 {
			rs = append(rs, runeRange{re.Rune[i], re.Rune[i+1]})
		}
		if len(rs) == 0 {
			return nil, fmt.Errorf("an empty character class matches nothing")
		}
		return c.class(rs), nil
	case syntax.OpAnyCharNotNL:
		return c.class(anyCharNotNL), nil
	case syntax.OpAnyChar:
		return c.class(anyCharRanges), nil
	case syntax.OpBeginLine, syntax.OpEndLine, syntax.OpBeginText, syntax.OpEndText:
		return nil, fmt.Errorf("anchors (^, $) are supported only at the start and end")
	case syntax.OpWordBoundary, syntax.OpNoWordBoundary:
		return nil, fmt.Errorf(`word boundaries (\b, \B) are not supported`)
	case syntax.OpCapture:
		return c.conv(re.Sub[0])
	case syntax.OpStar, syntax.OpPlus, syntax.OpQuest, syntax.OpRepeat:
		sub, err := c.conv(re.Sub[0])
		if err != nil {
			return nil, err
		}
		switch re.Op {
		case syntax.OpStar:
			return star(sub), nil
		case syntax.OpPlus:
			return plus(sub), nil
		case syntax.OpQuest:
			return opt(sub), nil
		}
		if re.Min > maxRepeat || re.Max > maxRepeat {
			return nil, fmt.Errorf("repetition {%d,%d} is over the limit %d", re.Min, re.Max, maxRepeat)
		}
		return repeat(sub, re.Min, re.Max), nil
	case syntax.OpConcat, syntax.OpAlternate:
		subs := make([]*expr, len(re.Sub))
		for i, s := range re.Sub {
			x, err := c.conv(s)
			if err != nil {
				return nil, err
			}
			subs[i] = x
		}
		if re.Op == syntax.OpConcat {
			return seq(subs...), nil
		}
		return alt(subs...), nil
	}
	return nil, fmt.Errorf("unsupported regex operator %v", re.Op)
}

// class matches one character of ranges, written as the mode writes characters.
func (c *regexConv) class(rs []runeRange) *expr {
	if c.mode == rawBytes {
		return utf8Expr(rs)
	}
	// Inside a JSON string: ", \ and control characters escaped, the rest as UTF-8 ('/'
	// either way).
	var plain []runeRange
	var escaped []*expr
	for _, r := range mergeRanges(rs) {
		for ch := r.lo; ch <= min(r.hi, 0x1F); ch++ {
			escaped = append(escaped, lit(jsonEscape(ch)))
		}
		for _, ch := range []rune{'"', '\\'} {
			if r.lo <= ch && ch <= r.hi {
				escaped = append(escaped, lit(jsonEscape(ch)))
			}
		}
		if r.lo <= '/' && '/' <= r.hi {
			escaped = append(escaped, lit(`\/`)) // JSON's optional escape of '/'
		}
		plain = append(plain, subtractSpecials(r)...)
	}
	var alts []*expr
	if len(plain) > 0 {
		alts = append(alts, utf8Expr(plain))
	}
	alts = append(alts, escaped...)
	if len(alts) == 1 {
		return alts[0]
	}
	return alt(alts...)
}

func jsonEscape(r rune) string {
	if s, ok := jsonEscapedRune[r]; ok {
		return s
	}
	return fmt.Sprintf(`\u%04x`, r)
}

// subtractSpecials removes control characters, '"' and '\\' from r.
func subtractSpecials(r runeRange) []runeRange {
	var out []runeRange
	cut := func(lo, hi rune) {
		if lo <= hi {
			out = append(out, runeRange{lo, hi})
		}
	}
	lo := max(r.lo, 0x20)
	// [lo, hi] minus '"' (0x22) and '\\' (0x5C)
	for _, s := range []rune{'"', '\\'} {
		if lo <= s && s <= r.hi {
			cut(lo, s-1)
			lo = s + 1
		}
	}
	cut(lo, r.hi)
	return out
}

// foldRanges is r and its simple case folds.
func foldRanges(r rune) []runeRange {
	rs := []runeRange{{r, r}}
	for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
		rs = append(rs, runeRange{f, f})
	}
	return rs
}
