package engine

// PromptChecker is implemented by a Runner that refuses some prompts outright: a text
// model given the placeholder tokens of inputs it has no encoder for (images, video).
// Submit asks it before queueing a request and fails that request alone with
// ErrInvalidRequest wrapping the checker's error; the engine and the other requests go
// on. CheckPrompt is called from Submit's goroutine, concurrently with Execute, so it must
// read only what does not change while the runner runs (its configuration).
type PromptChecker interface {
	CheckPrompt(prompt []int32) error
}
