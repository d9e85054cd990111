// Package tiny embeds a small byte-level BPE tokenizer (1,025 tokens, ChatML chat
// template) trained by scripts/tokenizer-goldens.sh on its own corpus. cmd/resin uses it
// whenever no tokenizer.json is given (the engine's test runner, a model on random
// weights), so the whole path from HTTP text to token ids and back runs end to end without
// downloading one.
package tiny

import (
	_ "embed"
	"fmt"

	"github.com/resin-llm/resin/core/tokenizer"
)

//go:embed tokenizer.json
var tokenizerJSON []byte

//go:embed tokenizer_config.json
var configJSON []byte

// Load parses the embedded tokenizer and its chat template.
func Load() (*tokenizer.Tokenizer, *tokenizer.ChatTemplate, error) {
	tok, err := tokenizer.Parse(tokenizerJSON)
	if err != nil {
		return nil, nil, fmt.Errorf("tiny tokenizer: %w", err)
	}
	chat, err := tokenizer.ParseChatTemplate(configJSON, "")
	if err != nil {
		return nil, nil, fmt.Errorf("tiny chat template: %w", err)
	}
	return tok, chat, nil
}

// EOS returns the id of the end-of-turn token, <|im_end|>.
func EOS(tok *tokenizer.Tokenizer) int32 {
	id, _ := tok.TokenID("<|im_end|>")
	return id
}
