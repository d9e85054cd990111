package grammar

import (
	"sort"
	"unicode/utf8"
)

// runeRange is an inclusive range of code points.
type runeRange struct{ lo, hi rune }

// utf8Expr matches the UTF-8 encoding of one code point in ranges (surrogates excluded):
// an alternation of byte-range sequences, as RE2 and Rust's regex compile classes.
func utf8Expr(ranges []runeRange) *expr {
	var alts []*expr
	for _, r := range ranges {
		lo, hi := r.lo, min(r.hi, utf8.MaxRune)
		// Surrogates are not encodable.
		if lo <= 0xDFFF && hi >= 0xD800 {
			if lo < 0xD800 {
				alts = appendUTF8(alts, lo, 0xD7FF)
			}
			if hi > 0xDFFF {
				alts = appendUTF8(alts, 0xE000, hi)
			}
			continue
		}
		if lo <= hi {
			alts = appendUTF8(alts, lo, hi)
		}
	}
	// Merge single-byte alternatives into one set.
	var ascii byteSet
	var out []*expr
	for _, a := range alts {
		if a.op == opBytes {
			for i := range ascii {
				ascii[i] |= a.set[i]
			}
			continue
		}
		out = append(out, a)
	}
	if !ascii.empty() {
		out = append([]*expr{bytesOf(ascii)}, out...)
	}
	switch len(out) {
	case 0:
		return bytesOf(byteSet{}) // refused at compile as an empty class
	case 1:
		return out[0]
	}
	return alt(out...)
}

var utf8Bounds = []rune{0x7F, 0x7FF, 0xFFFF, utf8.MaxRune}

func appendUTF8(alts []*expr, lo, hi rune) []*expr {
	// Split at encoded-length boundaries.
	for _, b := range utf8Bounds {
		if lo <= b && hi > b {
			alts = appendUTF8(alts, lo, b)
			return appendUTF8(alts, b+1, hi)
		}
	}
	if hi < 0x80 {
		return append(alts, byteRange(byte(lo), byte(hi)))
	}
	n := utf8.RuneLen(lo)
	// Split until every continuation byte spans its whole range or lo and hi share
	// the bytes before it.
	for i := 1; i < n; i++ {
		m := rune(1)<<(6*i) - 1
		if lo&^m != hi&^m {
			if lo&m != 0 {
				alts = appendUTF8(alts, lo, lo|m)
				return appendUTF8(alts, (lo|m)+1, hi)
			}
			if hi&m != m {
				alts = appendUTF8(alts, lo, (hi&^m)-1)
				return appendUTF8(alts, hi&^m, hi)
			}
		}
	}
	var a, b [4]byte
	utf8.EncodeRune(a[:], lo)
	utf8.EncodeRune(b[:], hi)
	subs := make([]*expr, n)
	for i := 0; i < n; i++ {
		subs[i] = byteRange(a[i], b[i])
	}
	return append(alts, seq(subs...))
}

// anyRune matches any UTF-8 encoded code point.
func anyRune() *expr { return utf8Expr([]runeRange{{0, utf8.MaxRune}}) }

// negate returns the code points not in ranges (sorted, non-overlapping after merge).
func negate(ranges []runeRange) []runeRange {
	rs := mergeRanges(ranges)
	var out []runeRange
	next := rune(0)
	for _, r := range rs {
		if r.lo > next {
			out = append(out, runeRange{next, r.lo - 1})
		}
		next = r.hi + 1
	}
	if next <= utf8.MaxRune {
		out = append(out, runeRange{next, utf8.MaxRune})
	}
	return out
}

func mergeRanges(ranges []runeRange) []runeRange {
	rs := append([]runeRange(nil), ranges...)
	sort.Slice(rs, func(i, j int) bool { return rs[i].lo < rs[j].lo })
	var out []runeRange
	for _, r := range rs {
		if len(out) > 0 && r.lo <= out[len(out)-1].hi+1 {
			out[len(out)-1].hi = max(out[len(out)-1].hi, r.hi)
			continue
		}
		out = append(out, r)
	}
	return out
}
