package tokenizer

import (
	"slices"
	"strings"
	"testing"
)

// Text that is not valid UTF-8 (a CLI argument, a caller of the package) is encoded as
// if each bad sequence were U+FFFD, what a JSON client sends, instead of panicking in a
// pre-tokenizer that measures runes where the text has bytes.
func TestEncodeInvalidUTF8(t *testing.T) {
	tok := tiny(t)
	for _, in := range []string{"\xff\xfe abc \xc3", "12\xff34", "\xc3", "a\xe2\x82b 7"} {
		got, err := tok.Encode(in, false)
		if err != nil {
			t.Fatalf("%q: %v", in, err)
		}
		want, err := tok.Encode(strings.ToValidUTF8(in, "\uFFFD"), false)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, want) {
			t.Errorf("%q: %v, want %v (as U+FFFD)", in, got, want)
		}
	}
	// Digits keeps the bytes of a bad sequence as they are.
	pieces, err := digitsSplit{individual: true}.split(nil, []string{"1\xff2"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(pieces, []string{"1", "\xff", "2"}) {
		t.Errorf("digits split of 1\\xff2: %q", pieces)
	}
}
