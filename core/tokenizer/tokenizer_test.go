package tokenizer

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

func tiny(t testing.TB) *Tokenizer {
	t.Helper()
	tok, err := Load(filepath.Join("tiny", "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func TestDetokenizerHoldsPartialCharacters(t *testing.T) {
	tok := tiny(t)
	text := "a😀b中"
	ids, err := tok.Encode(text, false)
	if err != nil {
		t.Fatal(err)
	}
	d := tok.NewDetokenizer(false)
	var got strings.Builder
	sawHold := false
	for _, id := range ids {
		s := d.Add(id)
		if !utf8.ValidString(s) {
			t.Fatalf("Add returned invalid UTF-8 %q", s)
		}
		if d.Pending() > 0 {
			sawHold = true
		}
		got.WriteString(s)
	}
	got.WriteString(d.Flush())
	if got.String() != text {
		t.Fatalf("streamed %q, want %q", got.String(), text)
	}
	if !sawHold {
		t.Fatalf("ids %v never split a character, so the test proves nothing", ids)
	}
}

func TestDetokenizerFlushesBrokenTail(t *testing.T) {
	tok := tiny(t)
	id, ok := tok.TokenID(string(byteToRune[0xF0])) // a lone 4-byte lead
	if !ok {
		t.Fatal("byte token missing from the tiny vocabulary")
	}
	d := tok.NewDetokenizer(false)
	if s := d.Add(id); s != "" {
		t.Fatalf("lead byte emitted %q", s)
	}
	if s := d.Flush(); s != "\uFFFD" {
		t.Fatalf("flush = %q, want U+FFFD", s)
	}
}

func TestLossyMatchesMaximalSubpart(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"a\xE0\xA0b", "a\uFFFDb"},
		{"\xC3A", "\uFFFDA"},
		{"\x80\x80", "\uFFFD\uFFFD"},
		{"\xF0\x9F\x98", "\uFFFD"},
		{"ok", "ok"},
	} {
		if got := string(appendLossy(nil, []byte(c.in))); got != c.want {
			t.Errorf("lossy(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestAddedTokenStrip(t *testing.T) {
	tok := tiny(t)
	tool, ok := tok.TokenID("<tool>")
	if !ok {
		t.Fatal("<tool> missing")
	}
	ids, err := tok.Encode("x   <tool>   y", false)
	if err != nil {
		t.Fatal(err)
	}
	x, _ := tok.Encode("x", false)
	y, _ := tok.Encode("y", false)
	want := append(append(append([]int32{}, x...), tool), y...)
	if len(ids) != len(want) {
		t.Fatalf("got %v, want %v (lstrip/rstrip should absorb the spaces)", ids, want)
	}
	for i := range ids {
		if ids[i] != want[i] {
			t.Fatalf("got %v, want %v", ids, want)
		}
	}
}

func TestParseErrors(t *testing.T) {
	for _, c := range []struct {
		name, json string
		want       error
	}{
		{"not json", `{`, ErrInvalid},
		{"unigram", `{"model":{"type":"Unigram","vocab":{"a":0}}}`, ErrUnsupported},
		{"empty vocab", `{"model":{"type":"BPE","vocab":{},"merges":[]}}`, ErrInvalid},
		{"merge of unknown token", `{"model":{"type":"BPE","vocab":{"a":0,"b":1},"merges":["a b"]}}`, ErrInvalid},
		{"merge without space", `{"model":{"type":"BPE","vocab":{"a":0},"merges":["ab"]}}`, ErrInvalid},
		{"bad regex", `{"model":{"type":"BPE","vocab":{"a":0},"merges":[]},"pre_tokenizer":{"type":"Split","pattern":{"Regex":"(("},"behavior":"Isolated"}}`, nil},
		{"metaspace", `{"model":{"type":"BPE","vocab":{"a":0},"merges":[]},"pre_tokenizer":{"type":"Metaspace"}}`, ErrUnsupported},
		// A stray id must be an error, not a dense id table of 34 GB.
		{"stray vocab id", `{"model":{"type":"BPE","vocab":{"a":0,"b":2000000000},"merges":[]}}`, ErrInvalid},
		{"stray added id", `{"model":{"type":"BPE","vocab":{"a":0},"merges":[]},"added_tokens":[{"id":2147483647,"content":"<x>","special":true}]}`, ErrInvalid},
	} {
		_, err := Parse([]byte(c.json))
		if err == nil {
			t.Errorf("%s: no error", c.name)
			continue
		}
		if c.want != nil && !errors.Is(err, c.want) {
			t.Errorf("%s: error %v is not %v", c.name, err, c.want)
		}
	}
}

func TestMergeFormatsAgree(t *testing.T) {
	str := `{"model":{"type":"BPE","vocab":{"a":0,"b":1,"ab":2,"abab":3},"merges":["a b","ab ab"]}}`
	pairs := `{"model":{"type":"BPE","vocab":{"a":0,"b":1,"ab":2,"abab":3},"merges":[["a","b"],["ab","ab"]]}}`
	for _, src := range []string{str, pairs} {
		tok, err := Parse([]byte(src))
		if err != nil {
			t.Fatal(err)
		}
		ids, err := tok.Encode("ababa", false)
		if err != nil {
			t.Fatal(err)
		}
		if len(ids) != 2 || ids[0] != 3 || ids[1] != 0 {
			t.Fatalf("%s: ids %v, want [3 0]", src, ids)
		}
	}
}

func TestNamedChatTemplates(t *testing.T) {
	cfg := `{"bos_token":{"content":"<s>"},"chat_template":[{"name":"default","template":"{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"},{"name":"tool_use","template":"T"}]}`
	c, err := ParseChatTemplate([]byte(cfg), "")
	if err != nil {
		t.Fatal(err)
	}
	out, err := c.Render([]map[string]any{{"role": "user", "content": "hi"}}, ChatOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if out != "<s>[user]hi" {
		t.Fatalf("rendered %q", out)
	}
	if _, err := ParseChatTemplate([]byte(cfg), "missing"); !errors.Is(err, ErrNoChatTemplate) {
		t.Fatalf("missing template: %v", err)
	}
	if _, err := ParseChatTemplate([]byte(`{}`), ""); !errors.Is(err, ErrNoChatTemplate) {
		t.Fatalf("no template: %v", err)
	}
}

func BenchmarkEncode(b *testing.B) {
	tok := tiny(b)
	text := strings.Repeat("The quick brown fox, 1234 jumps over the lazy dog! 中文 😀\n", 20)
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := tok.Encode(text, false); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDetokenizer(b *testing.B) {
	tok := tiny(b)
	ids, _ := tok.Encode(strings.Repeat("streamed text with ünïcödé 😀 ", 10), false)
	b.ReportAllocs()
	for b.Loop() {
		d := tok.NewDetokenizer(false)
		for _, id := range ids {
			_ = d.Add(id)
		}
	}
}

// BenchmarkEncodeReal encodes a mixed 8 KB text with each real tokenizer that
// .ci/setup.d/30-tokenizers.sh fetched.
func BenchmarkEncodeReal(b *testing.B) {
	text := strings.Repeat("The quick brown fox, 1234 jumps over the lazy dog! 中文分词 😀\n\tfunc main() { return x+1 }\n", 80)
	for _, name := range []string{"qwen3", "llama3", "deepseek_v3", "gpt4o"} {
		b.Run(name, func(b *testing.B) {
			dir := tokenizerDirB(b, name)
			tok, err := Load(filepath.Join(dir, "tokenizer.json"))
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(text)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := tok.Encode(text, false); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func tokenizerDirB(b *testing.B, name string) string {
	root := os.Getenv("RESIN_TOKENIZERS_DIR")
	if root == "" {
		root = filepath.Join("..", "..", ".cache", "tokenizers")
	}
	dir := filepath.Join(root, name)
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err != nil {
		b.Skipf("%s is missing: run .ci/setup.d/30-tokenizers.sh", dir)
	}
	return dir
}

func TestConcurrentEncode(t *testing.T) {
	tok := tiny(t)
	texts := []string{"Hello, world! 123", "中文 😀 tabs\t\t", "<|im_start|>user\nhi<|im_end|>", "func main() {}"}
	want := make([][]int32, len(texts))
	for i, s := range texts {
		want[i], _ = tok.Encode(s, false)
	}
	done := make(chan error, 8)
	for g := 0; g < 8; g++ {
		go func() {
			for k := 0; k < 50; k++ {
				i := (g + k) % len(texts)
				got, err := tok.Encode(texts[i], false)
				if err == nil && !slices.Equal(got, want[i]) {
					err = errors.New("concurrent encode disagrees")
				}
				if err != nil {
					done <- err
					return
				}
			}
			done <- nil
		}()
	}
	for g := 0; g < 8; g++ {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

// TestSplitBehaviors checks every SplitDelimiterBehavior, plain and inverted, and Digits,
// against what the reference's pre_tokenize_str returns for the same input.
func TestSplitBehaviors(t *testing.T) {
	const s = "the-final--countdown"
	for _, c := range []struct {
		behavior      splitBehavior
		plain, invert []string
	}{
		{behaviorRemoved, []string{"the", "final", "countdown"}, []string{"-", "-", "-"}},
		{behaviorIsolated, []string{"the", "-", "final", "-", "-", "countdown"}, []string{"the", "-", "final", "-", "-", "countdown"}},
		{behaviorMergedWithPrevious, []string{"the-", "final-", "-", "countdown"}, []string{"the", "-final", "-", "-countdown"}},
		{behaviorMergedWithNext, []string{"the", "-final", "-", "-countdown"}, []string{"the-", "final-", "-", "countdown"}},
		{behaviorContiguous, []string{"the", "-", "final", "--", "countdown"}, []string{"the", "-", "final", "--", "countdown"}},
	} {
		for _, invert := range []bool{false, true} {
			p := &regexSplit{literal: "-", behavior: c.behavior, invert: invert}
			got, err := p.split(nil, []string{s})
			if err != nil {
				t.Fatal(err)
			}
			want := c.plain
			if invert {
				want = c.invert
			}
			if !slices.Equal(got, want) {
				t.Errorf("behavior %d invert=%v: %q, want %q", c.behavior, invert, got, want)
			}
		}
	}
	got, _ := digitsSplit{}.split(nil, []string{"ab123c4½5"})
	if want := []string{"ab", "123", "c", "4½5"}; !slices.Equal(got, want) {
		t.Errorf("digits: %q, want %q", got, want)
	}
	got, _ = digitsSplit{individual: true}.split(nil, []string{"ab12c"})
	if want := []string{"ab", "1", "2", "c"}; !slices.Equal(got, want) {
		t.Errorf("individual digits: %q, want %q", got, want)
	}
}

// BenchmarkEncodeLongWord encodes one 16 KB run of letters: a single BPE piece, where a
// rescan per merge would be quadratic.
func BenchmarkEncodeLongWord(b *testing.B) {
	tok := tiny(b)
	var sb strings.Builder
	for i := 0; sb.Len() < 16<<10; i++ {
		sb.WriteByte("etaoinshrdlucmfw"[(i*7+i/3)%16])
	}
	text := sb.String()
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	for b.Loop() {
		tok.model.mu.Lock()
		clear(tok.model.cache)
		tok.model.mu.Unlock()
		if _, err := tok.Encode(text, false); err != nil {
			b.Fatal(err)
		}
	}
}
