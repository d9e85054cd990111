package grammar

import (
	"testing"

	"github.com/resin-llm/resin/core/tokenizer/tiny"
)

// TestFromTokenizerSizesByModel: the masks cover exactly the model's vocabulary, whether
// it is padded past the tokenizer's ids (the extra ids never allowed) or the tokenizer
// has ids past it (dropped; before, the masks were as wide as the tokenizer's, and every
// structured request was refused on such a model).
func TestFromTokenizerSizesByModel(t *testing.T) {
	tok, _, err := tiny.Load()
	if err != nil {
		t.Fatal(err)
	}
	n := tok.VocabSize()
	for _, size := range []int{n - 10, n, n + 40} {
		v, err := FromTokenizer(tok, []int32{1}, size)
		if err != nil {
			t.Fatalf("size %d: %v", size, err)
		}
		if v.Size() != size || v.MaskWords() != (size+31)/32 {
			t.Fatalf("size %d: vocabulary of %d ids, %d mask words", size, v.Size(), v.MaskWords())
		}
		g, err := Compile(v, JSONObject, "")
		if err != nil {
			t.Fatal(err)
		}
		m, _ := g.NewMatcher()
		mask := make([]uint32, m.Words())
		if err := m.FillMask(mask); err != nil {
			t.Fatal(err)
		}
		for id := min(n, size); id < size; id++ {
			if mask[id>>5]&(1<<(id&31)) != 0 {
				t.Fatalf("size %d: id %d past the tokenizer allowed", size, id)
			}
		}
	}
}
