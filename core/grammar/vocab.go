package grammar

import (
	"fmt"
	"sort"

	"github.com/resin-llm/resin/core/tokenizer"
)

// Vocabulary is what a matcher needs of a tokenizer: the bytes each token id stands for,
// which ids end the output (EOS) and which are special (never allowed by a grammar). It
// holds the token trie every mask walk uses and is shared by all grammars compiled
// against it.
type Vocabulary struct {
	size    int
	bytes   [][]byte
	eos     []int32
	isEOS   []bool
	special []bool

	// The trie of token bytes in preorder: node i (1..) has byte label[i] at depth
	// depth[i] (1 = first byte); its subtree ends before next[i]; the tokens spelled by
	// the path to it are toks[tokStart[i]:tokStart[i+1]].
	label    []byte
	depth    []uint16
	next     []int32
	tokStart []int32
	toks     []int32
	maxDepth int
}

// NewVocabulary builds a vocabulary from each token id's bytes. eos lists the ids that
// end the output; special marks ids no grammar allows (other control tokens). An id with
// no bytes that is neither is never allowed.
func NewVocabulary(tokens [][]byte, eos []int32, special []bool) (*Vocabulary, error) {
	n := len(tokens)
	if n == 0 {
		return nil, fmt.Errorf("grammar: empty vocabulary")
	}
	if n > 1<<24 {
		return nil, fmt.Errorf("grammar: vocabulary of %d tokens is too large", n)
	}
	v := &Vocabulary{size: n, bytes: make([][]byte, n), isEOS: make([]bool, n), special: make([]bool, n)}
	for _, id := range eos {
		if id < 0 || int(id) >= n {
			return nil, fmt.Errorf("grammar: EOS id %d outside the vocabulary of %d", id, n)
		}
		if !v.isEOS[id] {
			v.isEOS[id] = true
			v.eos = append(v.eos, id)
		}
	}
	for i := range special {
		if i < n && special[i] {
			v.special[i] = true
		}
	}
	ids := make([]int32, 0, n)
	for i, b := range tokens {
		if len(b) > 0 && !v.isEOS[i] && !v.special[i] {
			if len(b) > 0xffff {
				return nil, fmt.Errorf("grammar: token %d is %d bytes long", i, len(b))
			}
			ids = append(ids, int32(i))
			v.bytes[i] = append([]byte(nil), b...)
		}
	}
	sort.Slice(ids, func(a, b int) bool {
		ta, tb := tokens[ids[a]], tokens[ids[b]]
		if c := compareBytes(ta, tb); c != 0 {
			return c < 0
		}
		return ids[a] < ids[b]
	})
	// Build the preorder trie from the sorted tokens: each token shares the prefix it
	// has in common with the previous one.
	v.label = []byte{0}
	v.depth = []uint16{0}
	v.tokStart = []int32{0}
	var path []int32 // path[d-1] is the node at depth d on the current path
	var prev []byte
	for _, id := range ids {
		t := tokens[id]
		common := 0
		for common < len(prev) && common < len(t) && prev[common] == t[common] {
			common++
		}
		path = path[:common]
		for d := common; d < len(t); d++ {
			node := int32(len(v.label))
			v.label = append(v.label, t[d])
			v.depth = append(v.depth, uint16(d+1))
			v.tokStart = append(v.tokStart, int32(len(v.toks)))
			path = append(path, node)
		}
		v.toks = append(v.toks, id)
		v.maxDepth = max(v.maxDepth, len(t))
		prev = t
	}
	v.tokStart = append(v.tokStart, int32(len(v.toks)))
	// The token of a node sits at the end of its run; tokStart[i] was set when node i was
	// made, before its token was appended, so node i's tokens are toks[tokStart[i]:tokStart[i+1]]
	// as long as a node's token comes before its children's (true in sorted order).
	nodes := len(v.label)
	v.next = make([]int32, nodes)
	// next[i]: the first node after i at depth <= depth[i].
	stack := []int32{}
	for i := 1; i < nodes; i++ {
		for len(stack) > 0 && v.depth[stack[len(stack)-1]] >= v.depth[i] {
			v.next[stack[len(stack)-1]] = int32(i)
			stack = stack[:len(stack)-1]
		}
		stack = append(stack, int32(i))
	}
	for _, s := range stack {
		v.next[s] = int32(nodes)
	}
	return v, nil
}

func compareBytes(a, b []byte) int {
	for i := 0; i < len(a) && i < len(b); i++ {
		if a[i] != b[i] {
			if a[i] < b[i] {
				return -1
			}
			return 1
		}
	}
	return len(a) - len(b)
}

// FromTokenizer builds the vocabulary of t: each id's bytes (byte-level BPE decoded), its
// special added tokens marked special, and eos the ids that end the output. size, when
// above 0, is the model's vocabulary, which the masks cover exactly: ids of a padded
// vocabulary past t's are never allowed, and t's ids past the model's (added tokens
// beyond the embedding, which the model can never sample) are dropped.
func FromTokenizer(t *tokenizer.Tokenizer, eos []int32, size int) (*Vocabulary, error) {
	n := t.VocabSize()
	if size > 0 {
		n = size
	}
	tokens := make([][]byte, n)
	special := make([]bool, n)
	for id := 0; id < min(t.VocabSize(), n); id++ {
		if t.IsSpecial(int32(id)) {
			special[id] = true
			continue
		}
		tokens[id] = t.AppendBytes(nil, int32(id), false)
	}
	return NewVocabulary(tokens, eos, special)
}

// Size is the number of token ids the vocabulary covers; a mask has (Size+31)/32 words.
func (v *Vocabulary) Size() int { return v.size }

// MaskWords is the length of a mask for this vocabulary.
func (v *Vocabulary) MaskWords() int { return (v.size + 31) / 32 }

// EOS returns the ids that end the output.
func (v *Vocabulary) EOS() []int32 { return v.eos }
