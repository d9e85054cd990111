package toolparse

import (
	"strings"
	"testing"
)

// BenchmarkStream streams a long generation (about 16k characters of reasoning, answer
// and a call with long arguments) in 4-character deltas, as a server does per token.
func BenchmarkStream(b *testing.B) {
	long := strings.Repeat("Some reasoning about the weather, with a < sign. ", 100)
	args := `{"text": "` + strings.Repeat("lorem ipsum ", 500) + `"}`
	text := "<think>\n" + long + "</think>\n\n" + long + "<tool_call>\n{\"name\": \"write\", \"arguments\": " + args + "}\n</tool_call>"
	var pieces []string
	for i := 0; i < len(text); i += 4 {
		pieces = append(pieces, text[i:min(i+4, len(text))])
	}
	p, err := New("hermes", "qwen3")
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		s := p.NewStream("", testTools)
		for _, piece := range pieces {
			s.Add(piece)
		}
		s.Flush()
	}
}

// BenchmarkStreamStringParam streams a qwen3_coder call whose string parameter is a
// 24 KB file, in 4-character deltas: the escaped value must grow, not be rebuilt per
// delta.
func BenchmarkStreamStringParam(b *testing.B) {
	text := "<tool_call>\n<function=write>\n<parameter=text>\n" + strings.Repeat("lorem \"ipsum\"\n", 1700) +
		"\n</parameter>\n</function>\n</tool_call>"
	var pieces []string
	for i := 0; i < len(text); i += 4 {
		pieces = append(pieces, text[i:min(i+4, len(text))])
	}
	p, err := New("qwen3_coder", "")
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		s := p.NewStream("", testTools)
		for _, piece := range pieces {
			s.Add(piece)
		}
		s.Flush()
	}
}
