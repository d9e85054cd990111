// Package tiny embeds a small byte-level BPE tokenizer (1,025 tokens, ChatML chat
// template) trained by scripts/tokenizer-goldens.sh on its own corpus. cmd/resin uses it
// whenever no tokenizer.json is given (the engine's test runner, a model on random
// weights), so the whole path from HTTP text to token ids and back runs end to end without
// downloading one.
package tiny

import (
	_ "embed"
	"encoding/json"
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

// Size is the number of tokens of the embedded tokenizer (its vocabulary and its added
// tokens).
const Size = 1025

// MinSize is the fewest tokens LoadVocab can cut it to: its four special tokens and the
// 256 byte tokens, so that every text still encodes.
const MinSize = 260

// LoadVocab is Load for a model whose vocabulary has n < Size tokens (the in-tree configs'
// 512, for seeded random weights): the tokenizer cut to its first n ids, that is its
// special and byte tokens and the merges whose tokens have ids below n, in their order. A
// byte-level BPE cut so still encodes every text (with fewer merges, so longer), and its
// ids all fit the model's embedding. n ≥ Size loads the whole tokenizer.
func LoadVocab(n int) (*tokenizer.Tokenizer, *tokenizer.ChatTemplate, error) {
	if n >= Size {
		return Load()
	}
	if n < MinSize {
		return nil, nil, fmt.Errorf("tiny tokenizer: a vocabulary of %d tokens is too small for its %d special and byte tokens", n, MinSize)
	}
	var doc map[string]any
	if err := json.Unmarshal(tokenizerJSON, &doc); err != nil {
		return nil, nil, fmt.Errorf("tiny tokenizer: %w", err)
	}
	model, _ := doc["model"].(map[string]any)
	vocab, _ := model["vocab"].(map[string]any)
	merges, _ := model["merges"].([]any)
	added, _ := doc["added_tokens"].([]any)
	if model == nil || vocab == nil || merges == nil {
		return nil, nil, fmt.Errorf("tiny tokenizer: no BPE vocabulary and merges")
	}
	keep := func(id any) bool { f, ok := id.(float64); return ok && int(f) < n }
	for tok, id := range vocab {
		if !keep(id) {
			delete(vocab, tok)
		}
	}
	var kept []any
	for _, m := range merges {
		pair, ok := m.([]any)
		if !ok || len(pair) != 2 {
			return nil, nil, fmt.Errorf("tiny tokenizer: a merge %v is not a pair", m)
		}
		a, _ := pair[0].(string)
		b, _ := pair[1].(string)
		_, okA := vocab[a]
		_, okB := vocab[b]
		if _, ok := vocab[a+b]; ok && okA && okB { // a merge of kept tokens into a kept one
			kept = append(kept, m)
		}
	}
	model["merges"] = kept
	var keptAdded []any
	for _, a := range added {
		if t, ok := a.(map[string]any); ok && keep(t["id"]) {
			keptAdded = append(keptAdded, a)
		}
	}
	doc["added_tokens"] = keptAdded
	data, err := json.Marshal(doc)
	if err != nil {
		return nil, nil, fmt.Errorf("tiny tokenizer: %w", err)
	}
	tok, err := tokenizer.Parse(data)
	if err != nil {
		return nil, nil, fmt.Errorf("tiny tokenizer cut to %d tokens: %w", n, err)
	}
	chat, err := tokenizer.ParseChatTemplate(configJSON, "")
	if err != nil {
		return nil, nil, fmt.Errorf("tiny chat template: %w", err)
	}
	return tok, chat, nil
}
