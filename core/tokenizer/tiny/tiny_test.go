package tiny

import (
	"strings"
	"testing"
)

func TestLoadVocabCutsToTheModel(t *testing.T) {
	whole, _, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	if whole.VocabSize() != Size {
		t.Fatalf("the embedded tokenizer has %d tokens, Size says %d", whole.VocabSize(), Size)
	}
	text := "Hello, wörld! 12345 <|im_end|> résumé\n\ttabs   and spaces 日本"
	for _, n := range []int{MinSize, 512, Size - 1} {
		tok, chat, err := LoadVocab(n)
		if err != nil {
			t.Fatalf("LoadVocab(%d): %v", n, err)
		}
		if tok.VocabSize() > n || chat == nil {
			t.Fatalf("LoadVocab(%d): %d tokens, chat %v", n, tok.VocabSize(), chat)
		}
		ids, err := tok.Encode(text, false)
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range ids {
			if int(id) >= n {
				t.Fatalf("LoadVocab(%d) encoded id %d", n, id)
			}
		}
		if got := tok.Decode(ids, false); got != text {
			t.Fatalf("LoadVocab(%d) round trip: %q", n, got)
		}
		if EOS(tok) != EOS(whole) {
			t.Fatalf("LoadVocab(%d): end-of-turn %d, want %d", n, EOS(tok), EOS(whole))
		}
		wholeIDs, _ := whole.Encode(text, false)
		if n < 400 && len(ids) <= len(wholeIDs) {
			t.Fatalf("LoadVocab(%d) has fewer merges yet encodes in %d tokens, the whole one in %d", n, len(ids), len(wholeIDs))
		}
	}
	if _, _, err := LoadVocab(MinSize - 1); err == nil || !strings.Contains(err.Error(), "too small") {
		t.Fatalf("LoadVocab(%d): %v", MinSize-1, err)
	}
	if tok, _, err := LoadVocab(4096); err != nil || tok.VocabSize() != Size {
		t.Fatalf("LoadVocab(4096): %v", err)
	}
}
