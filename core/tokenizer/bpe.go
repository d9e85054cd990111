package tokenizer

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"unicode/utf8"
)

// pair is two adjacent symbol ids that a merge joins.
type pair struct{ a, b int32 }

// merge is a merge's rank (lower merges first) and the id of the symbol it produces.
type merge struct {
	rank int32
	id   int32
}

// bpe is the byte-pair-encoding model: a vocabulary and ranked merges.
type bpe struct {
	vocab        map[string]int32
	merges       map[pair]merge
	ignoreMerges bool
	unk          int32 // -1 when the model has no unknown token

	mu    sync.RWMutex
	cache map[string][]int32
}

const bpeCacheLimit = 1 << 16

type bpeSpec struct {
	Type         string            `json:"type"`
	Vocab        map[string]int32  `json:"vocab"`
	Merges       []json.RawMessage `json:"merges"`
	UnkToken     *string           `json:"unk_token"`
	IgnoreMerges bool              `json:"ignore_merges"`
	ByteFallback bool              `json:"byte_fallback"`
	ContPrefix   *string           `json:"continuing_subword_prefix"`
	EndSuffix    *string           `json:"end_of_word_suffix"`
}

// newBPE builds the model, accepting merges written as "a b" or as ["a", "b"].
func newBPE(spec bpeSpec) (*bpe, error) {
	if spec.Type != "BPE" {
		return nil, fmt.Errorf("model %q: %w", spec.Type, ErrUnsupported)
	}
	if spec.ByteFallback {
		return nil, fmt.Errorf("BPE byte_fallback: %w", ErrUnsupported)
	}
	if (spec.ContPrefix != nil && *spec.ContPrefix != "") || (spec.EndSuffix != nil && *spec.EndSuffix != "") {
		return nil, fmt.Errorf("BPE continuing_subword_prefix/end_of_word_suffix: %w", ErrUnsupported)
	}
	if len(spec.Vocab) == 0 {
		return nil, fmt.Errorf("BPE model has an empty vocabulary: %w", ErrInvalid)
	}
	m := &bpe{
		vocab:        spec.Vocab,
		merges:       make(map[pair]merge, len(spec.Merges)),
		ignoreMerges: spec.IgnoreMerges,
		unk:          -1,
		cache:        make(map[string][]int32),
	}
	if spec.UnkToken != nil {
		id, ok := spec.Vocab[*spec.UnkToken]
		if !ok {
			return nil, fmt.Errorf("unk_token %q is not in the vocabulary: %w", *spec.UnkToken, ErrInvalid)
		}
		m.unk = id
	}
	for rank, raw := range spec.Merges {
		a, b, err := parseMerge(raw)
		if err != nil {
			return nil, fmt.Errorf("merge %d: %w", rank, err)
		}
		ia, oka := spec.Vocab[a]
		ib, okb := spec.Vocab[b]
		id, okm := spec.Vocab[a+b]
		if !oka || !okb || !okm {
			return nil, fmt.Errorf("merge %d (%q %q) uses a token missing from the vocabulary: %w", rank, a, b, ErrInvalid)
		}
		p := pair{ia, ib}
		if _, dup := m.merges[p]; !dup {
			m.merges[p] = merge{rank: int32(rank), id: id}
		}
	}
	return m, nil
}

func parseMerge(raw json.RawMessage) (string, string, error) {
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		a, b, ok := strings.Cut(s, " ")
		if !ok {
			return "", "", fmt.Errorf("merge %q has no space: %w", s, ErrInvalid)
		}
		return a, b, nil
	}
	var ab []string
	if err := json.Unmarshal(raw, &ab); err != nil || len(ab) != 2 {
		return "", "", fmt.Errorf("merge %s is neither \"a b\" nor [\"a\", \"b\"]: %w", raw, ErrInvalid)
	}
	return ab[0], ab[1], nil
}

// encode appends the ids of one pre-tokenized piece to dst.
func (m *bpe) encode(dst []int32, piece string) []int32 {
	if m.ignoreMerges {
		if id, ok := m.vocab[piece]; ok {
			return append(dst, id)
		}
	}
	m.mu.RLock()
	ids, ok := m.cache[piece]
	m.mu.RUnlock()
	if ok {
		return append(dst, ids...)
	}
	ids = m.merge(piece)
	m.mu.Lock()
	if len(m.cache) >= bpeCacheLimit {
		clear(m.cache)
	}
	m.cache[piece] = ids
	m.mu.Unlock()
	return append(dst, ids...)
}

// merge runs the merges over the characters of piece, always applying the lowest-ranked
// merge among adjacent symbols first (leftmost on ties), until none applies. Symbols form
// a linked list and candidate merges sit in a heap, so a piece of n characters costs
// O(n log n) rather than a rescan per merge.
func (m *bpe) merge(piece string) []int32 {
	n := utf8.RuneCountInString(piece)
	syms := make([]symbol, 0, n)
	for i, r := range piece {
		ch := piece[i : i+utf8.RuneLen(r)]
		id, ok := m.vocab[ch]
		if !ok {
			if m.unk < 0 {
				continue
			}
			if k := len(syms); k > 0 && syms[k-1].id == m.unk {
				continue
			}
			id = m.unk
		}
		syms = append(syms, symbol{id: id, prev: int32(len(syms)) - 1, next: int32(len(syms)) + 1})
	}
	if len(syms) == 0 {
		return nil
	}
	syms[len(syms)-1].next = -1
	var h mergeHeap
	for i := 0; i+1 < len(syms); i++ {
		m.push(&h, syms, int32(i), int32(i+1))
	}
	for len(h) > 0 {
		c := h.pop()
		l, r := &syms[c.left], &syms[c.right]
		if l.dead || r.dead || l.next != c.right || l.id != c.leftID || r.id != c.rightID {
			continue // stale: one side merged since
		}
		l.id = c.id
		r.dead = true
		l.next = r.next
		if r.next >= 0 {
			syms[r.next].prev = c.left
		}
		if l.prev >= 0 {
			m.push(&h, syms, l.prev, c.left)
		}
		if l.next >= 0 {
			m.push(&h, syms, c.left, l.next)
		}
	}
	out := make([]int32, 0, len(syms))
	for i := int32(0); i >= 0; i = syms[i].next {
		out = append(out, syms[i].id)
	}
	return out
}

// symbol is one node of the list a piece is merged in.
type symbol struct {
	id         int32
	prev, next int32 // neighbours, -1 at the ends
	dead       bool  // merged into its left neighbour
}

// candidate is a possible merge of two adjacent symbols.
type candidate struct {
	rank, id        int32
	left, right     int32
	leftID, rightID int32
}

func (m *bpe) push(h *mergeHeap, syms []symbol, left, right int32) {
	a, b := syms[left].id, syms[right].id
	if mg, ok := m.merges[pair{a, b}]; ok {
		h.push(candidate{rank: mg.rank, id: mg.id, left: left, right: right, leftID: a, rightID: b})
	}
}

// mergeHeap is a binary min-heap of candidates by (rank, left position).
type mergeHeap []candidate

func (h mergeHeap) less(i, j int) bool {
	if h[i].rank != h[j].rank {
		return h[i].rank < h[j].rank
	}
	return h[i].left < h[j].left
}

func (h *mergeHeap) push(c candidate) {
	*h = append(*h, c)
	s := *h
	for i := len(s) - 1; i > 0; {
		p := (i - 1) / 2
		if !s.less(i, p) {
			break
		}
		s[i], s[p] = s[p], s[i]
		i = p
	}
}

func (h *mergeHeap) pop() candidate {
	s := *h
	top := s[0]
	last := len(s) - 1
	s[0] = s[last]
	s = s[:last]
	for i := 0; ; {
		l, r, m := 2*i+1, 2*i+2, i
		if l < len(s) && s.less(l, m) {
			m = l
		}
		if r < len(s) && s.less(r, m) {
			m = r
		}
		if m == i {
			break
		}
		s[i], s[m] = s[m], s[i]
		i = m
	}
	*h = s
	return top
}
