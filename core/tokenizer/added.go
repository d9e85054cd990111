package tokenizer

import (
	"sort"
	"unicode"
	"unicode/utf8"
)

// AddedToken is a token matched in raw text before normalization and BPE, such as a
// chat-template marker or an end-of-text token.
type AddedToken struct {
	ID         int32  `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

// addedMatcher finds added tokens in text, leftmost first and longest among those.
type addedMatcher struct {
	byFirst [256][]*AddedToken // candidates by first byte, longest first
}

func newAddedMatcher(tokens []AddedToken) *addedMatcher {
	m := &addedMatcher{}
	for i := range tokens {
		t := &tokens[i]
		if t.Content == "" {
			continue
		}
		b := t.Content[0]
		m.byFirst[b] = append(m.byFirst[b], t)
	}
	for b := range m.byFirst {
		c := m.byFirst[b]
		sort.SliceStable(c, func(i, j int) bool { return len(c[i].Content) > len(c[j].Content) })
	}
	return m
}

// segment is a run of text between added tokens, or one added token (tok != nil).
type segment struct {
	text string
	tok  *AddedToken
}

// split cuts s into plain-text segments and added tokens.
func (m *addedMatcher) split(dst []segment, s string) []segment {
	textStart := 0
	for i := 0; i < len(s); {
		t := m.matchAt(s, i)
		if t == nil {
			i++
			continue
		}
		start, end := i, i+len(t.Content)
		if t.LStrip {
			for start > textStart {
				r, n := utf8.DecodeLastRuneInString(s[textStart:start])
				if !unicode.IsSpace(r) {
					break
				}
				start -= n
			}
		}
		if t.RStrip {
			for end < len(s) {
				r, n := utf8.DecodeRuneInString(s[end:])
				if !unicode.IsSpace(r) {
					break
				}
				end += n
			}
		}
		if start > textStart {
			dst = append(dst, segment{text: s[textStart:start]})
		}
		dst = append(dst, segment{tok: t})
		textStart, i = end, end
	}
	if textStart < len(s) {
		dst = append(dst, segment{text: s[textStart:]})
	}
	return dst
}

func (m *addedMatcher) matchAt(s string, i int) *AddedToken {
	for _, t := range m.byFirst[s[i]] {
		if len(s)-i < len(t.Content) || s[i:i+len(t.Content)] != t.Content {
			continue
		}
		if t.SingleWord && !wordBounded(s, i, i+len(t.Content)) {
			continue
		}
		return t
	}
	return nil
}

func isWordRune(r rune) bool { return r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) }

func wordBounded(s string, start, end int) bool {
	if start > 0 {
		if r, _ := utf8.DecodeLastRuneInString(s[:start]); isWordRune(r) {
			return false
		}
	}
	if end < len(s) {
		if r, _ := utf8.DecodeRuneInString(s[end:]); isWordRune(r) {
			return false
		}
	}
	return true
}
