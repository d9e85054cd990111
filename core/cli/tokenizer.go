package cli

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/resin-llm/resin/core/tokenizer"
)

// LoadTokenizer reads the tokenizer at path, a tokenizer.json file or a directory holding
// one, with the chat template of the tokenizer_config.json beside it when there is one
// (chat is nil otherwise).
func LoadTokenizer(path string) (*tokenizer.Tokenizer, *tokenizer.ChatTemplate, error) {
	file := path
	if st, err := os.Stat(path); err != nil {
		return nil, nil, fmt.Errorf("tokenizer: %w", err)
	} else if st.IsDir() {
		file = filepath.Join(path, "tokenizer.json")
	}
	tok, err := tokenizer.Load(file)
	if err != nil {
		return nil, nil, fmt.Errorf("tokenizer %s: %w", file, err)
	}
	chat, err := LoadChatTemplate(filepath.Join(filepath.Dir(file), "tokenizer_config.json"))
	if err != nil {
		return nil, nil, err
	}
	return tok, chat, nil
}

// LoadChatTemplate reads the chat template of a tokenizer_config.json; a missing file or
// a config without a template gives nil and no error.
func LoadChatTemplate(path string) (*tokenizer.ChatTemplate, error) {
	chat, err := tokenizer.LoadChatTemplate(path)
	switch {
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, tokenizer.ErrNoChatTemplate):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("chat template %s: %w", path, err)
	}
	return chat, nil
}
