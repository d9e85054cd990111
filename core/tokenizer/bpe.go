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
// merge among adjacent symbols first (leftmost on ties), until none applies.
func (m *bpe) merge(piece string) []int32 {
	syms := make([]int32, 0, utf8.RuneCountInString(piece))
	for i, r := range piece {
		ch := piece[i : i+utf8.RuneLen(r)]
		if id, ok := m.vocab[ch]; ok {
			syms = append(syms, id)
		} else if m.unk >= 0 {
			if n := len(syms); n == 0 || syms[n-1] != m.unk {
				syms = append(syms, m.unk)
			}
		}
	}
	for len(syms) > 1 {
		best, at := merge{rank: -1}, -1
		for i := 0; i+1 < len(syms); i++ {
			mg, ok := m.merges[pair{syms[i], syms[i+1]}]
			if ok && (at < 0 || mg.rank < best.rank) {
				best, at = mg, i
			}
		}
		if at < 0 {
			break
		}
		// One merge at a time, the leftmost of the lowest rank: a merge it enables may
		// outrank the next occurrence of the same pair.
		syms[at] = best.id
		syms = append(syms[:at+1], syms[at+2:]...)
	}
	return syms
}
