package grammar

// The JSON rules every JSON grammar shares: whitespace, strings, numbers and any value.

func defineJSONBase(d *grammarDef) {
	if _, ok := d.rules["ws"]; ok {
		return
	}
	var ws byteSet
	for _, b := range []byte(" \t\n\r") {
		ws.add(b)
	}
	// Any whitespace, as xgrammar's default: an unbounded run is one parser state
	// whatever its length (a bounded one is a state per count), so its masks are cached
	// once per place in the grammar.
	d.define("ws", star(bytesOf(ws)))
	c := regexConv{mode: jsonString}
	d.define("char", c.class(anyCharRanges))
	d.define("string", seq(lit(`"`), star(ref("char")), lit(`"`)))
	digit := byteRange('0', '9')
	d.define("integer", seq(opt(lit("-")), alt(lit("0"), seq(byteRange('1', '9'), star(digit)))))
	var e byteSet
	e.add('e')
	e.add('E')
	var sign byteSet
	sign.add('+')
	sign.add('-')
	d.define("number", seq(ref("integer"),
		opt(seq(lit("."), plus(digit))),
		opt(seq(bytesOf(e), opt(bytesOf(sign)), plus(digit)))))
	d.define("value", alt(ref("object"), ref("array"), ref("string"), ref("number"),
		lit("true"), lit("false"), lit("null")))
	member := seq(ref("string"), ref("ws"), lit(":"), ref("ws"), ref("value"), ref("ws"))
	d.define("object", seq(lit("{"), ref("ws"),
		opt(seq(member, star(seq(lit(","), ref("ws"), member)))), lit("}")))
	item := seq(ref("value"), ref("ws"))
	d.define("array", seq(lit("["), ref("ws"),
		opt(seq(item, star(seq(lit(","), ref("ws"), item)))), lit("]")))
}

// jsonObjectDef is any JSON object (response_format json_object).
func jsonObjectDef() *grammarDef {
	d := newDef("root")
	defineJSONBase(d)
	d.define("root", seq(ref("object"), ref("ws")))
	return d
}
