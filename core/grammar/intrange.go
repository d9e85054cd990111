package grammar

import (
	"strconv"
	"strings"
)

// intRange matches the decimal integers (no leading zeros, no "-0") in [lo, hi]; a nil
// bound is open.
func intRange(lo, hi *int64) *expr {
	var alts []*expr
	// The non-negative part [max(lo,0), hi].
	if hi == nil || *hi >= 0 {
		a := int64(0)
		if lo != nil && *lo > 0 {
			a = *lo
		}
		alts = append(alts, magnitude(a, hi))
	}
	// The negative part: -m for m in [max(-hi,1), -lo].
	if lo == nil || *lo < 0 {
		a := int64(1)
		if hi != nil && *hi < 0 {
			a = -*hi
		}
		var b *int64
		if lo != nil {
			m := -*lo
			b = &m
		}
		alts = append(alts, seq(lit("-"), magnitude(a, b)))
	}
	return alt(alts...)
}

// magnitude matches the integers in [a, b] (a >= 0; b nil for no upper bound).
func magnitude(a int64, b *int64) *expr {
	digit := byteRange('0', '9')
	la := len(strconv.FormatInt(a, 10))
	var alts []*expr
	top := 18
	if b != nil {
		top = len(strconv.FormatInt(*b, 10))
	}
	for l := la; l <= top; l++ {
		lo := pow10(l - 1)
		if l == 1 {
			lo = 0
		}
		hi := pow10(l) - 1
		lo = max(lo, a)
		if b != nil {
			hi = min(hi, *b)
		}
		if lo > hi {
			continue
		}
		alts = append(alts, sameLength(strconv.FormatInt(lo, 10), strconv.FormatInt(hi, 10)))
	}
	if b == nil {
		// Any number longer than 18 digits.
		alts = append(alts, seq(byteRange('1', '9'), repeat(digit, top, -1)))
	}
	return alt(alts...)
}

func pow10(n int) int64 {
	p := int64(1)
	for ; n > 0; n-- {
		p *= 10
	}
	return p
}

// sameLength matches the digit strings of x's length between x and y.
func sameLength(x, y string) *expr {
	if x == y {
		return lit(x)
	}
	if len(x) == 1 {
		return byteRange(x[0], y[0])
	}
	if strings.Trim(x, "0") == "" && strings.Trim(y, "9") == "" {
		return repeat(byteRange('0', '9'), len(x), len(x)) // every digit string: no branching
	}
	if x[0] == y[0] {
		return seq(lit(x[:1]), sameLength(x[1:], y[1:]))
	}
	n := len(x) - 1
	nines, zeros := strings.Repeat("9", n), strings.Repeat("0", n)
	alts := []*expr{seq(lit(x[:1]), sameLength(x[1:], nines))}
	if x[0]+1 <= y[0]-1 {
		alts = append(alts, seq(byteRange(x[0]+1, y[0]-1), repeat(byteRange('0', '9'), n, n)))
	}
	alts = append(alts, seq(lit(y[:1]), sameLength(zeros, y[1:])))
	return alt(alts...)
}
