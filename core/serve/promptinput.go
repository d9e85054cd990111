package serve

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
)

// promptInput is a completion prompt: text or token ids.
type promptInput struct {
	text string
	ids  []int32
}

// promptField is the completions prompt field: a string, an array of strings, an array
// of token ids, or an array of arrays of token ids, decoded once in the shape its first
// bytes announce. Token ids are read one by one and refused as soon as an array reaches
// maxTokens (the model's context, which must also hold a generated token), so an
// oversized id array costs its parse up to the limit, not its whole length.
type promptField struct {
	maxTokens int // 0: no limit (set by the handler before decoding)
	inputs    []promptInput
}

// UnmarshalJSON decodes the prompt. encoding/json has checked b's syntax already; the
// shape is checked here.
func (p *promptField) UnmarshalJSON(b []byte) error {
	p.inputs = nil // a repeated key replaces the prompt
	b = bytes.TrimLeft(b, " \t\r\n")
	if len(b) == 0 || b[0] == 'n' { // null: absent
		return nil
	}
	switch b[0] {
	case '"':
		var text string
		if err := json.Unmarshal(b, &text); err != nil {
			return errPromptShape
		}
		p.inputs = []promptInput{{text: text}}
		return nil
	case '[':
	default:
		return errPromptShape
	}
	sc := idScanner{b: b, i: 1}
	sc.space()
	switch sc.peek() {
	case ']':
		return invalid("prompt", "The prompt batch is empty.")
	case '"':
		var texts []string
		if err := json.Unmarshal(b, &texts); err != nil {
			return errPromptShape
		}
		if err := checkBatch(len(texts)); err != nil {
			return err
		}
		p.inputs = make([]promptInput, len(texts))
		for i, t := range texts {
			p.inputs[i].text = t
		}
		return nil
	case '[':
		for {
			if len(p.inputs) == maxSequences {
				return checkBatch(maxSequences + 1)
			}
			sc.i++ // the inner array's '['
			ids, err := sc.ids(p.maxTokens)
			if err != nil {
				return err
			}
			p.inputs = append(p.inputs, promptInput{ids: ids})
			more, err := sc.next()
			if err != nil {
				return err
			}
			if !more {
				return nil
			}
			if sc.space(); sc.peek() != '[' {
				return errPromptShape
			}
		}
	}
	ids, err := sc.ids(p.maxTokens)
	if err != nil {
		return err
	}
	p.inputs = []promptInput{{ids: ids}}
	return nil
}

var errPromptShape = invalid("prompt", "prompt must be a string, an array of strings, an array of token ids, or an array of arrays of token ids.")

func checkBatch(n int) error {
	if n > maxSequences {
		return invalid("prompt", "At most %d prompts per request; got more.", maxSequences)
	}
	return nil
}

// idScanner reads arrays of integers out of JSON that encoding/json has validated.
type idScanner struct {
	b []byte
	i int
}

func (s *idScanner) space() {
	for s.i < len(s.b) && (s.b[s.i] == ' ' || s.b[s.i] == '\t' || s.b[s.i] == '\n' || s.b[s.i] == '\r') {
		s.i++
	}
}

func (s *idScanner) peek() byte {
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

// next steps over the separator after an element: true after a comma, false at the
// array's end.
func (s *idScanner) next() (bool, error) {
	s.space()
	switch s.peek() {
	case ',':
		s.i++
		return true, nil
	case ']':
		s.i++
		return false, nil
	}
	return false, errPromptShape
}

// ids reads the token ids of an array whose '[' has been read, up to its ']'. It stops
// with context_length_exceeded once the array holds limit ids (limit > 0).
func (s *idScanner) ids(limit int) ([]int32, error) {
	s.space()
	if s.peek() == ']' {
		return nil, invalid("prompt", "The token-id prompt is empty.")
	}
	// An id takes at least two bytes ("1,"): a first guess that never exceeds the limit.
	out := make([]int32, 0, min(len(s.b)/2+1, max(limit, 1), 4096))
	for {
		s.space()
		id, err := s.int()
		if err != nil {
			return nil, err
		}
		switch {
		case id < 0:
			return nil, invalid("prompt", "Token id %d at position %d is out of range.", id, len(out))
		case id > math.MaxInt32:
			return nil, invalid("prompt", "Token id at position %d is out of range.", len(out))
		}
		out = append(out, int32(id))
		if limit > 0 && len(out) >= limit {
			return nil, promptTooLong("prompt", fmt.Sprintf("The token-id prompt has more than %d tokens; this model's maximum context length is %d tokens, which must also hold at least one generated token.",
				limit-1, limit))
		}
		more, err := s.next()
		if err != nil {
			return nil, err
		}
		if !more {
			return out, nil
		}
	}
}

// int reads a JSON integer; a fraction, an exponent or anything else is not a token id.
func (s *idScanner) int() (int64, error) {
	neg := s.peek() == '-'
	if neg {
		s.i++
	}
	start := s.i
	var v int64
	for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
		v = min(v*10+int64(s.b[s.i]-'0'), math.MaxInt32+1) // beyond int32 all the same
		s.i++
	}
	if s.i == start {
		return 0, errPromptShape
	}
	switch s.peek() {
	case '.', 'e', 'E':
		return 0, invalid("prompt", "Token ids must be integers.")
	}
	if neg {
		v = -v
	}
	return v, nil
}
