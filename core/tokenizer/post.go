package tokenizer

import (
	"encoding/json"
	"fmt"
)

// postProcessor adds special tokens around an encoded single sequence.
type postProcessor struct {
	prefix, suffix []int32
}

func (p *postProcessor) apply(ids []int32) []int32 {
	if len(p.prefix) == 0 && len(p.suffix) == 0 {
		return ids
	}
	out := make([]int32, 0, len(p.prefix)+len(ids)+len(p.suffix))
	out = append(out, p.prefix...)
	out = append(out, ids...)
	return append(out, p.suffix...)
}

// parsePostProcessor understands ByteLevel (nothing to add to ids), TemplateProcessing's
// single-sequence template, and Sequence of those.
func parsePostProcessor(raw json.RawMessage, t *Tokenizer) (*postProcessor, error) {
	if isNull(raw) {
		return nil, nil
	}
	var head struct {
		Type       string            `json:"type"`
		Processors []json.RawMessage `json:"processors"`
		Single     []struct {
			SpecialToken *struct {
				ID string `json:"id"`
			} `json:"SpecialToken"`
			Sequence *struct {
				ID string `json:"id"`
			} `json:"Sequence"`
		} `json:"single"`
		SpecialTokens map[string]struct {
			IDs []int32 `json:"ids"`
		} `json:"special_tokens"`
	}
	if err := json.Unmarshal(raw, &head); err != nil {
		return nil, fmt.Errorf("post_processor: %v: %w", err, ErrInvalid)
	}
	switch head.Type {
	case "ByteLevel":
		return nil, nil
	case "Sequence":
		out := &postProcessor{}
		for _, r := range head.Processors {
			p, err := parsePostProcessor(r, t)
			if err != nil {
				return nil, err
			}
			if p != nil {
				out.prefix = append(out.prefix, p.prefix...)
				out.suffix = append(p.suffix, out.suffix...)
			}
		}
		return out, nil
	case "TemplateProcessing":
		out := &postProcessor{}
		seen := false
		for _, item := range head.Single {
			switch {
			case item.Sequence != nil:
				if seen {
					return nil, fmt.Errorf("TemplateProcessing with two sequences in single: %w", ErrUnsupported)
				}
				seen = true
			case item.SpecialToken != nil:
				st, ok := head.SpecialTokens[item.SpecialToken.ID]
				if !ok {
					return nil, fmt.Errorf("TemplateProcessing names unknown special token %q: %w", item.SpecialToken.ID, ErrInvalid)
				}
				if seen {
					out.suffix = append(out.suffix, st.IDs...)
				} else {
					out.prefix = append(out.prefix, st.IDs...)
				}
			}
		}
		return out, nil
	}
	return nil, fmt.Errorf("post_processor %q: %w", head.Type, ErrUnsupported)
}
