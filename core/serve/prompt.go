package serve

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/resin-llm/resin/core/tokenizer"
)

// maxPromptBytesPerToken bounds how many bytes of text one token stands for, to refuse a
// prompt by its size before tokenizing it: a prompt of more than MaxContext x 32 bytes
// is refused unread. Ordinary text averages 3 to 5 bytes a token in byte-level BPE
// vocabularies and code or CJK fewer; only degenerate text (long runs of one repeated
// character that a vocabulary has long tokens for) can exceed 32, and such a prompt is
// refused although it would fit.
const maxPromptBytesPerToken = 32

// defaultTokenizeBudget is Config.TokenizeBudgetBytes' default.
const defaultTokenizeBudget = 32 << 20

// Chunks in which a long prompt is counted before it is tokenized whole.
const (
	minCountChunk = 16 << 10
	maxCountChunk = 256 << 10
)

// promptLimits bounds the memory tokenization takes: a prompt is refused by its bytes
// first, then counted chunk by chunk and refused as soon as it has too many tokens, and
// the bytes being tokenized at once, all requests together, stay within a budget.
type promptLimits struct {
	maxContext int // tokens
	maxBytes   int // prompts longer than this are refused unread
	chunk      int // count in chunks of about this many bytes
	budget     *byteBudget
	// spaced are the added tokens with a space in them: a chunk may not end inside one.
	spaced []string
	maxLen int // longest of spaced
}

func newPromptLimits(tok *tokenizer.Tokenizer, maxContext int, budget int64) promptLimits {
	maxBytes := maxContext * maxPromptBytesPerToken
	if budget <= 0 {
		budget = max(defaultTokenizeBudget, int64(maxBytes))
	}
	maxBytes = int(min(int64(maxBytes), budget))
	l := promptLimits{maxContext: maxContext, maxBytes: maxBytes,
		chunk: min(max(4*maxContext, minCountChunk), maxCountChunk), budget: newByteBudget(budget)}
	for _, a := range tok.AddedTokens() {
		if strings.ContainsRune(a.Content, ' ') {
			l.spaced = append(l.spaced, a.Content)
			l.maxLen = max(l.maxLen, len(a.Content))
		}
	}
	return l
}

// byteBudget is a semaphore of bytes that never waits: a request it cannot serve now is
// told to retry.
type byteBudget struct {
	mu         sync.Mutex
	used, size int64
}

func newByteBudget(size int64) *byteBudget { return &byteBudget{size: size} }

func (b *byteBudget) acquire(n int64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.used+n > b.size {
		return &apiError{status: http.StatusTooManyRequests, typ: "rate_limit_error", code: "tokenizer_busy", retryAfter: 1,
			message: "The server is tokenizing as many prompt bytes as it allows at once; retry shortly."}
	}
	b.used += n
	return nil
}

func (b *byteBudget) release(n int64) {
	b.mu.Lock()
	b.used -= n
	b.mu.Unlock()
}

// inUse reports the bytes being tokenized (tests).
func (b *byteBudget) inUse() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

// encodePrompt tokenizes a prompt that must fit the model's context, refusing it, as
// early and as cheaply as it can, when it cannot: by its bytes unread, then by counting
// its tokens a chunk at a time (stopping once the count passes the limit), and only
// then tokenizing it whole. param names the prompt's field in errors ("prompt" or
// "messages"). The engine checks the prompt plus max_tokens against the context once
// the request is submitted.
func (s *Server) encodePrompt(text string, addSpecial bool, param string) ([]int32, error) {
	l := &s.prompts
	if len(text) > l.maxBytes {
		return nil, promptTooLong(param, fmt.Sprintf("The prompt is %d bytes; this server refuses prompts over %d bytes unread (%d tokens of context at up to %d bytes a token).",
			len(text), l.maxBytes, l.maxContext, maxPromptBytesPerToken))
	}
	if len(text) > l.chunk {
		if err := s.countPrompt(text, param); err != nil {
			return nil, err
		}
	}
	ids, err := s.encodeWithin(text, addSpecial)
	if err != nil {
		return nil, asPromptError(err, param)
	}
	if len(ids) >= l.maxContext {
		return nil, promptTooLong(param, fmt.Sprintf("The prompt is %d tokens; this model's maximum context length is %d tokens, which must also hold at least one generated token.",
			len(ids), l.maxContext))
	}
	return ids, nil
}

// encodeWithin tokenizes text while its bytes are counted against the budget.
func (s *Server) encodeWithin(text string, addSpecial bool) ([]int32, error) {
	n := int64(len(text))
	if err := s.prompts.budget.acquire(n); err != nil {
		return nil, err
	}
	defer s.prompts.budget.release(n)
	ids, err := s.encode(text, addSpecial)
	if err != nil {
		return nil, fmt.Errorf("cannot tokenize the prompt: %w", err)
	}
	return ids, nil
}

// countPrompt counts text's tokens a chunk at a time and refuses it once the count
// passes the context. Chunks end between a letter and a space that precedes a letter,
// where the pre-tokenizers of byte-level BPE vocabularies (GPT-2, Llama 3, Qwen 2,
// DeepSeek) split anyway, so the count is the whole text's; where no such place is
// near, or for other vocabularies, a chunk's end may shift a token or two, which the
// allowance of slack tokens per chunk absorbs: a prompt that fits is never refused here.
func (s *Server) countPrompt(text, param string) error {
	l := &s.prompts
	const slackPerChunk = 4
	count, chunks := 0, 0
	for start := 0; start < len(text); {
		end := l.chunkEnd(text, start)
		ids, err := s.encodeWithin(text[start:end], false)
		if err != nil {
			return asPromptError(err, param)
		}
		count += len(ids)
		chunks++
		start = end
		if count >= l.maxContext+slackPerChunk*chunks {
			return promptTooLong(param, fmt.Sprintf("The prompt has more than %d tokens (%d in its first %d of %d bytes); this model's maximum context length is %d tokens.",
				l.maxContext, count, start, len(text), l.maxContext))
		}
	}
	return nil
}

// chunkEnd returns where the chunk of text that starts at start ends: about l.chunk bytes
// on, preferably just before a space between letters, never inside a UTF-8 character
// or a spaced added token.
func (l *promptLimits) chunkEnd(text string, start int) int {
	end := start + l.chunk
	if end >= len(text) {
		return len(text)
	}
	for i := end; i > end-l.chunk/2; i-- {
		if text[i] == ' ' && isASCIILetter(text[i-1]) && i+1 < len(text) && isASCIILetter(text[i+1]) && !l.insideAdded(text, i) {
			return i
		}
	}
	for end > start+1 && !utf8.RuneStart(text[end]) {
		end--
	}
	return end
}

// insideAdded reports whether a spaced added token spans position i of text.
func (l *promptLimits) insideAdded(text string, i int) bool {
	if len(l.spaced) == 0 {
		return false
	}
	win := text[max(0, i-l.maxLen+1):min(len(text), i+l.maxLen)]
	for _, a := range l.spaced {
		for off := 0; ; {
			j := strings.Index(win[off:], a)
			if j < 0 {
				break
			}
			at := max(0, i-l.maxLen+1) + off + j
			if at < i && i < at+len(a) {
				return true
			}
			off += j + 1
		}
	}
	return false
}

func isASCIILetter(c byte) bool { return c|0x20 >= 'a' && c|0x20 <= 'z' }

// checkContentBytes refuses chat messages whose content alone is over the prompt limit,
// before the chat template renders them (rendering copies them at least once).
func (s *Server) checkContentBytes(msgs []map[string]any) error {
	n := 0
	for _, m := range msgs {
		if c, ok := m["content"].(string); ok {
			n += len(c)
		}
	}
	if l := &s.prompts; n > l.maxBytes {
		return promptTooLong("messages", fmt.Sprintf("The messages' content is %d bytes; this server refuses prompts over %d bytes unrendered (%d tokens of context at up to %d bytes a token).",
			n, l.maxBytes, l.maxContext, maxPromptBytesPerToken))
	}
	return nil
}

func promptTooLong(param, msg string) *apiError {
	return &apiError{status: http.StatusBadRequest, typ: "invalid_request_error", code: "context_length_exceeded", param: param, message: msg}
}

// asPromptError passes apiErrors (the budget's 429) through and reports anything else as
// a prompt that cannot be tokenized.
func asPromptError(err error, param string) error {
	if _, ok := err.(*apiError); ok {
		return err
	}
	return invalid(param, "Cannot tokenize the prompt: %v.", err)
}
