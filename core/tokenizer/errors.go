package tokenizer

import "errors"

var (
	// ErrUnsupported reports a tokenizer.json component this package does not implement.
	ErrUnsupported = errors.New("tokenizer: unsupported component")
	// ErrInvalid reports a malformed tokenizer file or an argument out of range.
	ErrInvalid = errors.New("tokenizer: invalid")
	// ErrNoChatTemplate reports a tokenizer_config.json without a chat template.
	ErrNoChatTemplate = errors.New("tokenizer: no chat template")
)
