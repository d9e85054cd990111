package toolparse

import (
	"fmt"
	"reflect"
	"testing"
	"unicode/utf8"
)

// FuzzStreamSplit: for any text, any parser pair and any split into pieces, the stream
// gives what Parse gives (Parse is the stream fed the whole text, so this is the
// parsers' independence from how text arrives).
func FuzzStreamSplit(f *testing.F) {
	for _, g := range generations {
		f.Add(g.text, uint64(7), uint8(0))
	}
	f.Add("<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\" string=\"true\">x</｜DSML｜parameter>\n</｜DSML｜invoke>", uint64(5), uint8(9))
	f.Add("[TOOL_CALLS]f[ARGS]{\"a\": [1]}[TOOL_CALLS] [{\"name\": \"g\"}]", uint64(2), uint8(21))
	f.Add("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>", uint64(4), uint8(24))
	f.Add("<think>a</think><tool_call>{\"name\": \"x\", \"arguments\": {\"a\": [1, {\"b\": \"}\"}]}}</tool_call>", uint64(3), uint8(5))
	pairs := [][2]string{}
	for _, tool := range append([]string{""}, ToolParsers()...) {
		for _, r := range append([]string{""}, ReasoningParsers()...) {
			pairs = append(pairs, [2]string{tool, r})
		}
	}
	f.Fuzz(func(t *testing.T, text string, seed uint64, pair uint8) {
		if !utf8.ValidString(text) {
			return
		}
		pp := pairs[int(pair)%len(pairs)]
		newP := func() *Parser {
			p, err := New(pp[0], pp[1])
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			p.NewID = func() string { n++; return fmt.Sprint(n) }
			return p
		}
		want := newP().Parse("", text, testTools)
		s := newP().NewStream("", testTools)
		var got Result
		runes := []rune(text)
		for len(runes) > 0 {
			n := 1 + int(seed%5)
			seed = seed*6364136223846793005 + 1442695040888963407
			n = min(n, len(runes))
			got.Append(s.Add(string(runes[:n])))
			runes = runes[n:]
		}
		got.Append(s.Flush())
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%v on %q:\n streamed %+v\n parsed   %+v", pp, text, got, want)
		}
	})
}
