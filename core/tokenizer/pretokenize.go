package tokenizer

import (
	"encoding/json"
	"fmt"
	"unicode"
	"unicode/utf8"

	"github.com/dlclark/regexp2/v2"
)

// preTokenizer cuts a normalized segment into pieces that BPE merges independently.
type preTokenizer interface {
	// split appends the pieces of each input piece to dst and returns it.
	split(dst, pieces []string) ([]string, error)
}

// gpt2Pattern is the regex GPT-2's ByteLevel pre-tokenizer applies when use_regex is set.
const gpt2Pattern = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`

// splitBehavior says what happens to the parts a pattern matches (the delimiters).
type splitBehavior int

const (
	behaviorRemoved splitBehavior = iota
	behaviorIsolated
	behaviorMergedWithPrevious
	behaviorMergedWithNext
	behaviorContiguous
)

func parseBehavior(s string) (splitBehavior, error) {
	switch s {
	case "Removed":
		return behaviorRemoved, nil
	case "Isolated":
		return behaviorIsolated, nil
	case "MergedWithPrevious":
		return behaviorMergedWithPrevious, nil
	case "MergedWithNext":
		return behaviorMergedWithNext, nil
	case "Contiguous":
		return behaviorContiguous, nil
	}
	return 0, fmt.Errorf("split behavior %q: %w", s, ErrUnsupported)
}

// span is a byte range of a piece and whether it is a delimiter.
type span struct {
	start, end int
	delim      bool
}

// applyBehavior turns the spans of s into pieces according to b, as the reference's
// SplitDelimiterBehavior does: a delimiter merges into a neighbouring span only when that
// neighbour is not a delimiter itself, and Contiguous joins runs of equal spans.
func applyBehavior(dst []string, s string, spans []span, b splitBehavior) []string {
	switch b {
	case behaviorRemoved:
		for _, sp := range spans {
			if !sp.delim {
				dst = appendPiece(dst, s[sp.start:sp.end])
			}
		}
	case behaviorIsolated:
		for _, sp := range spans {
			dst = appendPiece(dst, s[sp.start:sp.end])
		}
	case behaviorMergedWithPrevious:
		var out []span
		for i, sp := range spans {
			if sp.delim && i > 0 && !spans[i-1].delim && len(out) > 0 {
				out[len(out)-1].end = sp.end
				continue
			}
			out = append(out, sp)
		}
		for _, sp := range out {
			dst = appendPiece(dst, s[sp.start:sp.end])
		}
	case behaviorMergedWithNext:
		var out []span
		for i := len(spans) - 1; i >= 0; i-- {
			sp := spans[i]
			if sp.delim && i+1 < len(spans) && !spans[i+1].delim && len(out) > 0 {
				out[len(out)-1].start = sp.start
				continue
			}
			out = append(out, sp)
		}
		for i := len(out) - 1; i >= 0; i-- {
			dst = appendPiece(dst, s[out[i].start:out[i].end])
		}
	case behaviorContiguous:
		var out []span
		for i, sp := range spans {
			if i > 0 && spans[i-1].delim == sp.delim && len(out) > 0 {
				out[len(out)-1].end = sp.end
				continue
			}
			out = append(out, sp)
		}
		for _, sp := range out {
			dst = appendPiece(dst, s[sp.start:sp.end])
		}
	}
	return dst
}

func appendPiece(dst []string, s string) []string {
	if s == "" {
		return dst
	}
	return append(dst, s)
}

// regexSplit is the Split pre-tokenizer with a regex or literal pattern.
type regexSplit struct {
	re       *regexp2.Regexp
	literal  string
	behavior splitBehavior
	invert   bool
}

func (p *regexSplit) spans(s string) ([]span, error) {
	var idx [][]int
	if p.re != nil {
		var err error
		idx, err = p.re.FindAllStringIndex(s, -1)
		if err != nil {
			return nil, fmt.Errorf("split %q: %w", p.re.String(), err)
		}
	} else if p.literal != "" {
		for off := 0; off < len(s); {
			i := indexFrom(s, p.literal, off)
			if i < 0 {
				break
			}
			idx = append(idx, []int{i, i + len(p.literal)})
			off = i + len(p.literal)
		}
	}
	spans := make([]span, 0, 2*len(idx)+1)
	prev := 0
	for _, m := range idx {
		if m[0] == m[1] {
			continue
		}
		if m[0] > prev {
			spans = append(spans, span{prev, m[0], p.invert})
		}
		spans = append(spans, span{m[0], m[1], !p.invert})
		prev = m[1]
	}
	if prev < len(s) {
		spans = append(spans, span{prev, len(s), p.invert})
	}
	return spans, nil
}

func (p *regexSplit) split(dst, pieces []string) ([]string, error) {
	for _, s := range pieces {
		spans, err := p.spans(s)
		if err != nil {
			return nil, err
		}
		dst = applyBehavior(dst, s, spans, p.behavior)
	}
	return dst, nil
}

func indexFrom(s, sub string, off int) int {
	for i := off; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return i
		}
	}
	return -1
}

// digitsSplit isolates digits: each one alone, or runs of them.
type digitsSplit struct{ individual bool }

func (p digitsSplit) split(dst, pieces []string) ([]string, error) {
	for _, s := range pieces {
		var spans []span
		for i, r := range s {
			_, size := utf8.DecodeRuneInString(s[i:]) // 1 for a bad byte, not len("\uFFFD")
			end := i + size
			d := unicode.IsNumber(r)
			if n := len(spans); n > 0 && spans[n-1].delim == d && (!d || !p.individual) {
				spans[n-1].end = end
				continue
			}
			spans = append(spans, span{i, end, d})
		}
		dst = applyBehavior(dst, s, spans, behaviorIsolated)
	}
	return dst, nil
}

// byteLevel is the ByteLevel pre-tokenizer: optional prefix space, optional GPT-2 regex
// split, then every byte mapped to its printable rune.
type byteLevel struct {
	addPrefixSpace bool
	re             *regexSplit
}

func (p *byteLevel) split(dst, pieces []string) ([]string, error) {
	start := len(dst)
	for _, s := range pieces {
		if p.addPrefixSpace && (len(s) == 0 || s[0] != ' ') {
			s = " " + s
		}
		if p.re != nil {
			var err error
			dst, err = p.re.split(dst, []string{s})
			if err != nil {
				return nil, err
			}
		} else {
			dst = appendPiece(dst, s)
		}
	}
	for i := start; i < len(dst); i++ {
		dst[i] = byteLevelEncode(dst[i])
	}
	return dst, nil
}

// sequencePre runs pre-tokenizers one after another.
type sequencePre []preTokenizer

func (q sequencePre) split(dst, pieces []string) ([]string, error) {
	cur := pieces
	for _, p := range q {
		next, err := p.split(nil, cur)
		if err != nil {
			return nil, err
		}
		cur = next
	}
	return append(dst, cur...), nil
}

func compileRegex(pattern string) (*regexp2.Regexp, error) {
	re, err := regexp2.Compile(pattern, regexp2.None)
	if err != nil {
		return nil, fmt.Errorf("compile regex %q: %w", pattern, err)
	}
	return re, nil
}

// parsePreTokenizer builds a pre-tokenizer from its tokenizer.json description.
func parsePreTokenizer(raw json.RawMessage) (preTokenizer, bool, error) {
	if isNull(raw) {
		return nil, false, nil
	}
	var head struct {
		Type             string            `json:"type"`
		Pretokenizers    []json.RawMessage `json:"pretokenizers"`
		Pattern          patternSpec       `json:"pattern"`
		Behavior         string            `json:"behavior"`
		Invert           bool              `json:"invert"`
		AddPrefixSpace   bool              `json:"add_prefix_space"`
		UseRegex         *bool             `json:"use_regex"`
		IndividualDigits bool              `json:"individual_digits"`
	}
	if err := json.Unmarshal(raw, &head); err != nil {
		return nil, false, fmt.Errorf("pre_tokenizer: %w", err)
	}
	switch head.Type {
	case "Sequence":
		var seq sequencePre
		byteLvl := false
		for _, r := range head.Pretokenizers {
			p, bl, err := parsePreTokenizer(r)
			if err != nil {
				return nil, false, err
			}
			byteLvl = byteLvl || bl
			if p != nil {
				seq = append(seq, p)
			}
		}
		return seq, byteLvl, nil
	case "Split":
		b, err := parseBehavior(head.Behavior)
		if err != nil {
			return nil, false, err
		}
		p := &regexSplit{behavior: b, invert: head.Invert}
		switch {
		case head.Pattern.Regex != nil:
			if p.re, err = compileRegex(*head.Pattern.Regex); err != nil {
				return nil, false, err
			}
		case head.Pattern.String != nil:
			p.literal = *head.Pattern.String
		default:
			return nil, false, fmt.Errorf("split pre_tokenizer without a pattern: %w", ErrInvalid)
		}
		return p, false, nil
	case "Digits":
		return digitsSplit{individual: head.IndividualDigits}, false, nil
	case "ByteLevel":
		p := &byteLevel{addPrefixSpace: head.AddPrefixSpace}
		if head.UseRegex == nil || *head.UseRegex {
			re, err := compileRegex(gpt2Pattern)
			if err != nil {
				return nil, false, err
			}
			p.re = &regexSplit{re: re, behavior: behaviorIsolated}
		}
		return p, true, nil
	default:
		return nil, false, fmt.Errorf("pre_tokenizer %q: %w", head.Type, ErrUnsupported)
	}
}
