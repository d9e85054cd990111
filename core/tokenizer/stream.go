package tokenizer

import "unicode/utf8"

// Detokenizer turns a stream of token ids into text incrementally. Each call returns only
// whole UTF-8 characters: bytes of a character split across tokens are held until the
// character completes. The concatenation of everything it returns, Flush included, equals
// Decode of all the ids.
type Detokenizer struct {
	tok         *Tokenizer
	skipSpecial bool
	pending     []byte
	out         []byte
}

// NewDetokenizer starts an incremental decode.
func (t *Tokenizer) NewDetokenizer(skipSpecial bool) *Detokenizer {
	return &Detokenizer{tok: t, skipSpecial: skipSpecial}
}

// Add appends one token and returns the text that became complete, possibly "".
func (d *Detokenizer) Add(id int32) string {
	d.pending = d.tok.AppendBytes(d.pending, id, d.skipSpecial)
	return d.emit(false)
}

// Flush returns what is still held, with an incomplete trailing character as U+FFFD.
func (d *Detokenizer) Flush() string { return d.emit(true) }

// Pending reports how many bytes are held back waiting for the rest of a character.
func (d *Detokenizer) Pending() int { return len(d.pending) }

func (d *Detokenizer) emit(final bool) string {
	n := len(d.pending)
	if !final {
		n = completePrefix(d.pending)
	}
	if n == 0 {
		return ""
	}
	d.out = appendLossy(d.out[:0], d.pending[:n])
	rest := copy(d.pending, d.pending[n:])
	d.pending = d.pending[:rest]
	return string(d.out)
}

// completePrefix is the length of p without a trailing incomplete (but so far valid)
// UTF-8 sequence.
func completePrefix(p []byte) int {
	for back := 1; back <= 3 && back <= len(p); back++ {
		i := len(p) - back
		if !utf8.RuneStart(p[i]) {
			continue
		}
		if !utf8.FullRune(p[i:]) {
			return i
		}
		break
	}
	return len(p)
}

// appendLossy appends p to dst, replacing each maximal invalid UTF-8 subsequence with one
// U+FFFD (the rule Rust's from_utf8_lossy and Python's "replace" follow).
func appendLossy(dst, p []byte) []byte {
	for i := 0; i < len(p); {
		r, size := utf8.DecodeRune(p[i:])
		if r != utf8.RuneError || size > 1 {
			dst = append(dst, p[i:i+size]...)
			i += size
			continue
		}
		k := 1
		for j := 2; j <= 3 && i+j <= len(p); j++ {
			if utf8.FullRune(p[i : i+j]) {
				break
			}
			k = j
		}
		dst = utf8.AppendRune(dst, utf8.RuneError)
		i += k
	}
	return dst
}
