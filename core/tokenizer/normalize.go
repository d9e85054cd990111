package tokenizer

import (
	"encoding/json"
	"fmt"
	"strings"

	"golang.org/x/text/unicode/norm"
)

// normalizer rewrites a text segment before pre-tokenization.
type normalizer interface {
	normalize(s string) string
}

type nfcNormalizer struct{}

func (nfcNormalizer) normalize(s string) string { return norm.NFC.String(s) }

type nfkcNormalizer struct{}

func (nfkcNormalizer) normalize(s string) string { return norm.NFKC.String(s) }

type nfdNormalizer struct{}

func (nfdNormalizer) normalize(s string) string { return norm.NFD.String(s) }

type nfkdNormalizer struct{}

func (nfkdNormalizer) normalize(s string) string { return norm.NFKD.String(s) }

type lowercaseNormalizer struct{}

func (lowercaseNormalizer) normalize(s string) string { return strings.ToLower(s) }

type prependNormalizer struct{ prefix string }

func (p prependNormalizer) normalize(s string) string {
	if s == "" {
		return s
	}
	return p.prefix + s
}

type replaceNormalizer struct{ old, new string }

func (r replaceNormalizer) normalize(s string) string { return strings.ReplaceAll(s, r.old, r.new) }

type sequenceNormalizer []normalizer

func (q sequenceNormalizer) normalize(s string) string {
	for _, n := range q {
		s = n.normalize(s)
	}
	return s
}

// parseNormalizer builds a normalizer from its tokenizer.json description; null gives nil.
func parseNormalizer(raw json.RawMessage) (normalizer, error) {
	if isNull(raw) {
		return nil, nil
	}
	var head struct {
		Type        string            `json:"type"`
		Normalizers []json.RawMessage `json:"normalizers"`
		Prepend     string            `json:"prepend"`
		Pattern     patternSpec       `json:"pattern"`
		Content     string            `json:"content"`
	}
	if err := json.Unmarshal(raw, &head); err != nil {
		return nil, fmt.Errorf("normalizer: %w", err)
	}
	switch head.Type {
	case "NFC":
		return nfcNormalizer{}, nil
	case "NFKC":
		return nfkcNormalizer{}, nil
	case "NFD":
		return nfdNormalizer{}, nil
	case "NFKD":
		return nfkdNormalizer{}, nil
	case "Lowercase":
		return lowercaseNormalizer{}, nil
	case "Prepend":
		return prependNormalizer{head.Prepend}, nil
	case "Replace":
		if head.Pattern.String == nil {
			return nil, fmt.Errorf("normalizer Replace: only string patterns are supported: %w", ErrUnsupported)
		}
		return replaceNormalizer{*head.Pattern.String, head.Content}, nil
	case "Sequence":
		var seq sequenceNormalizer
		for _, r := range head.Normalizers {
			n, err := parseNormalizer(r)
			if err != nil {
				return nil, err
			}
			if n != nil {
				seq = append(seq, n)
			}
		}
		if len(seq) == 0 {
			return nil, nil
		}
		return seq, nil
	default:
		return nil, fmt.Errorf("normalizer %q: %w", head.Type, ErrUnsupported)
	}
}

// patternSpec is tokenizer.json's {"String": "..."} or {"Regex": "..."}.
type patternSpec struct {
	String *string `json:"String"`
	Regex  *string `json:"Regex"`
}

func isNull(raw json.RawMessage) bool {
	s := strings.TrimSpace(string(raw))
	return s == "" || s == "null"
}
