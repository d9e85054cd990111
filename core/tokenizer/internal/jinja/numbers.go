package jinja

// Python number semantics (resin's changes to the fork): integers of any size, floor
// division and modulo rounding toward negative infinity, floats printed as Python's repr.

import (
	"errors"
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

var errZeroDivision = errors.New("division by zero")

// NewBigInt returns an integer value of any size.
func NewBigInt(n *big.Int) Value {
	if n.IsInt64() {
		return NewInt(n.Int64())
	}
	return Value{kind: KindInt, v: new(big.Int).Set(n)}
}

// ParseInt reads a decimal integer of any size; ok is false when s is not one.
func ParseInt(s string) (Value, bool) {
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		return NewInt(n), true
	}
	n, ok := new(big.Int).SetString(s, 10)
	if !ok {
		return Undefined(), false
	}
	return NewBigInt(n), true
}

// bigOf returns an integer or boolean value as a big.Int.
func bigOf(v Value) *big.Int {
	switch x := v.v.(type) {
	case *big.Int:
		return new(big.Int).Set(x)
	case int64:
		return big.NewInt(x)
	case bool:
		if x {
			return big.NewInt(1)
		}
		return big.NewInt(0)
	}
	return big.NewInt(toInt64(v))
}

// isIntLike reports whether v takes part in integer arithmetic (Python's bool is an int).
func isIntLike(v Value) bool { return v.kind == KindInt || v.kind == KindBool }

// formatInt prints an integer value in decimal.
func formatInt(v Value) string {
	if b, ok := v.v.(*big.Int); ok {
		return b.String()
	}
	return strconv.FormatInt(v.v.(int64), 10)
}

// formatFloat prints f as Python's repr(float) does: the shortest digits that read back
// to f, a ".0" on integral values, and exponent form below 1e-4 and from 1e16.
func formatFloat(f float64) string {
	switch {
	case math.IsNaN(f):
		return "nan"
	case math.IsInf(f, 1):
		return "inf"
	case math.IsInf(f, -1):
		return "-inf"
	}
	e := strconv.FormatFloat(f, 'e', -1, 64)
	exp, _ := strconv.Atoi(e[strings.IndexByte(e, 'e')+1:])
	if f != 0 && (exp < -4 || exp >= 16) {
		return e
	}
	s := strconv.FormatFloat(f, 'f', -1, 64)
	if !strings.ContainsAny(s, ".") {
		s += ".0"
	}
	return s
}

// pyRepr quotes s as Python's repr(str) does.
func pyRepr(s string) string {
	quote := byte('\'')
	if strings.ContainsRune(s, '\'') && !strings.ContainsRune(s, '"') {
		quote = '"'
	}
	var b strings.Builder
	b.WriteByte(quote)
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		i += size
		switch {
		case r == rune(quote) || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\x%02x`, r)
		case r > 0x7f && !unicode.IsPrint(r) && r != ' ':
			switch {
			case r <= 0xff:
				fmt.Fprintf(&b, `\x%02x`, r)
			case r <= 0xffff:
				fmt.Fprintf(&b, `\u%04x`, r)
			default:
				fmt.Fprintf(&b, `\U%08x`, r)
			}
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte(quote)
	return b.String()
}

// arith applies a Python arithmetic operator to two values.
func arith(op string, a, b Value) (Value, error) {
	switch op {
	case "+":
		switch {
		case a.IsString() || b.IsString():
			return NewString(printValue(a) + printValue(b)), nil
		case a.IsList() && b.IsList():
			items := make([]Value, 0, a.AsList().Len()+b.AsList().Len())
			items = append(items, a.AsList().Items...)
			return NewList(append(items, b.AsList().Items...)), nil
		}
	case "*":
		if isIntLike(b) && (a.IsString() || a.IsList()) {
			return repeat(a, b)
		}
		if isIntLike(a) && (b.IsString() || b.IsList()) {
			return repeat(b, a)
		}
	case "%":
		if a.IsString() {
			return pyFormat(a.AsString(), b)
		}
	}
	if !(a.IsNumber() || a.IsBool()) || !(b.IsNumber() || b.IsBool()) {
		return Undefined(), fmt.Errorf("unsupported operand types for %s: %s and %s", op, typeName(a), typeName(b))
	}
	if isIntLike(a) && isIntLike(b) && op != "/" && !(op == "**" && bigOf(b).Sign() < 0) {
		return intArith(op, bigOf(a), bigOf(b))
	}
	x, y := toFloat64(a), toFloat64(b)
	switch op {
	case "+":
		return NewFloat(x + y), nil
	case "-":
		return NewFloat(x - y), nil
	case "*":
		return NewFloat(x * y), nil
	case "/":
		if y == 0 {
			return Undefined(), errZeroDivision
		}
		return NewFloat(x / y), nil
	case "//":
		if y == 0 {
			return Undefined(), errZeroDivision
		}
		return NewFloat(math.Floor(x / y)), nil
	case "%":
		if y == 0 {
			return Undefined(), errZeroDivision
		}
		r := math.Mod(x, y)
		if r != 0 && (r < 0) != (y < 0) {
			r += y
		}
		return NewFloat(r), nil
	case "**":
		return NewFloat(math.Pow(x, y)), nil
	}
	return Undefined(), fmt.Errorf("unknown operator %q", op)
}

func intArith(op string, x, y *big.Int) (Value, error) {
	z := new(big.Int)
	switch op {
	case "+":
		z.Add(x, y)
	case "-":
		z.Sub(x, y)
	case "*":
		z.Mul(x, y)
	case "//", "%":
		if y.Sign() == 0 {
			return Undefined(), errZeroDivision
		}
		q, r := new(big.Int).QuoRem(x, y, new(big.Int))
		if r.Sign() != 0 && (r.Sign() < 0) != (y.Sign() < 0) {
			q.Sub(q, big.NewInt(1))
			r.Add(r, y)
		}
		if op == "//" {
			z = q
		} else {
			z = r
		}
	case "**":
		if y.BitLen() > 20 {
			return Undefined(), fmt.Errorf("exponent %s is too large", y)
		}
		z.Exp(x, y, nil)
	default:
		return Undefined(), fmt.Errorf("unknown operator %q", op)
	}
	return NewBigInt(z), nil
}

// repeat is str*int and list*int.
func repeat(seq, times Value) (Value, error) {
	n := toInt64(times)
	if n < 0 {
		n = 0
	}
	if seq.IsString() {
		if int64(len(seq.AsString()))*n > 1<<30 {
			return Undefined(), errors.New("repeated string is too long")
		}
		return NewString(strings.Repeat(seq.AsString(), int(n))), nil
	}
	src := seq.AsList().Items
	if int64(len(src))*n > 1<<26 {
		return Undefined(), errors.New("repeated list is too long")
	}
	items := make([]Value, 0, len(src)*int(n))
	for range n {
		items = append(items, src...)
	}
	return NewList(items), nil
}

// typeName names v's type as Python would in an error.
func typeName(v Value) string {
	return [...]string{"Undefined", "NoneType", "bool", "int", "float", "str", "list", "dict", "function"}[v.kind]
}

// pyFormat is Python's printf-style str % args, for %s %r %d %i %f %F %e %E %g %G %x %X %o %c %%
// with flags, width and precision.
func pyFormat(format string, args Value) (Value, error) {
	var list []Value
	switch {
	case args.IsList():
		list = args.AsList().Items
	default:
		list = []Value{args}
	}
	var b strings.Builder
	next := 0
	for i := 0; i < len(format); i++ {
		c := format[i]
		if c != '%' {
			b.WriteByte(c)
			continue
		}
		j := i + 1
		for j < len(format) && strings.IndexByte("-+ #0123456789.", format[j]) >= 0 {
			j++
		}
		if j >= len(format) {
			return Undefined(), errors.New("incomplete format")
		}
		spec, verb := format[i+1:j], format[j]
		i = j
		if verb == '%' {
			b.WriteByte('%')
			continue
		}
		if next >= len(list) {
			return Undefined(), errors.New("not enough arguments for format string")
		}
		arg := list[next]
		next++
		switch verb {
		case 's':
			fmt.Fprintf(&b, "%"+spec+"s", printValue(arg))
		case 'r':
			fmt.Fprintf(&b, "%"+spec+"s", arg.String())
		case 'd', 'i':
			if arg.IsFloat() {
				arg = NewBigInt(bigFromFloat(arg.AsFloat()))
			}
			if !isIntLike(arg) {
				return Undefined(), fmt.Errorf("%%%c format: a real number is required, not %s", verb, typeName(arg))
			}
			fmt.Fprintf(&b, "%"+spec+"d", bigOf(arg))
		case 'x', 'X', 'o':
			if !isIntLike(arg) {
				return Undefined(), fmt.Errorf("%%%c format: an integer is required, not %s", verb, typeName(arg))
			}
			fmt.Fprintf(&b, "%"+spec+string(verb), bigOf(arg))
		case 'f', 'F', 'e', 'E', 'g', 'G':
			if !(arg.IsNumber() || arg.IsBool()) {
				return Undefined(), fmt.Errorf("%%%c format: a real number is required, not %s", verb, typeName(arg))
			}
			if !strings.Contains(spec, ".") {
				spec += ".6"
			}
			fmt.Fprintf(&b, "%"+spec+string(verb), toFloat64(arg))
		case 'c':
			if isIntLike(arg) {
				b.WriteRune(rune(toInt64(arg)))
			} else {
				b.WriteString(printValue(arg))
			}
		default:
			return Undefined(), fmt.Errorf("unsupported format character %q", verb)
		}
	}
	if next < len(list) && args.IsList() {
		return Undefined(), errors.New("not all arguments converted during string formatting")
	}
	return NewString(b.String()), nil
}

func bigFromFloat(f float64) *big.Int {
	n, _ := big.NewFloat(math.Trunc(f)).Int(nil)
	return n
}
