package engine

import (
	"errors"
	"fmt"
	"time"
)

// Errors returned by Submit. They are sentinels: test them with errors.Is.
var (
	// ErrContextTooLong: the prompt plus max tokens exceed the runner's maximum context
	// (HTTP 400).
	ErrContextTooLong = errors.New("engine: prompt plus max tokens exceed the model's context")
	// ErrInvalidRequest: a malformed request (empty prompt, token id outside the
	// vocabulary, sampling parameter out of range; HTTP 400).
	ErrInvalidRequest = errors.New("engine: invalid request")
	// ErrQueueFull: the waiting queue is at Config.MaxQueue (HTTP 429).
	ErrQueueFull = errors.New("engine: waiting queue is full")
	// ErrDraining: the engine is draining and accepts no new requests (HTTP 503).
	ErrDraining = errors.New("engine: draining, not accepting requests")
	// ErrClosed: the engine was closed.
	ErrClosed = errors.New("engine: closed")
	// ErrDuplicateID: a request with the same id is still in flight.
	ErrDuplicateID = errors.New("engine: duplicate request id")
	// ErrAborted is the error carried by the terminal event of an aborted request.
	ErrAborted = errors.New("engine: request aborted")
	// ErrRunner wraps a runner failure in the terminal event of the requests of the
	// failed step (finish reason error).
	ErrRunner = errors.New("engine: runner failed")
	// ErrCache wraps a cache-pool failure for one request, such as a request that needs
	// more pages than the whole pool holds (kvslab.ErrNoSpace).
	ErrCache = errors.New("engine: cache pool")
	// ErrBadResult: the runner returned a StepResult that does not match its plan.
	ErrBadResult = errors.New("engine: runner result does not match the plan")
)

// SamplingParams say how the next token is chosen and when generation stops.
type SamplingParams struct {
	// Temperature divides the logits; 0 means greedy (argmax).
	Temperature float32
	// TopP keeps the smallest set of tokens whose probability reaches TopP; 0 or 1 = off.
	TopP float32
	// TopK keeps the K most likely tokens; 0 = off.
	TopK int
	// MinP drops tokens whose probability is below MinP times the top token's; 0 = off.
	MinP float32
	// Seed makes sampling reproducible when HasSeed is set: the same seed and prompt give
	// the same tokens whatever the batch. Without it the engine draws a seed.
	Seed    uint64
	HasSeed bool
	// MaxTokens caps the generated tokens; 0 means up to the runner's maximum context.
	MaxTokens int
	// StopTokenIDs end generation (finish reason stop) when generated; the stop token is
	// part of the output.
	StopTokenIDs []int32
	// IgnoreEOS keeps generating past the runner's EOS ids.
	IgnoreEOS bool
	// Logprobs asks for the log probability of every generated token, and TopLogprobs
	// for that many most likely alternatives at each position (0..MaxTopLogprobs).
	Logprobs    bool
	TopLogprobs int
}

// MaxTopLogprobs is the largest TopLogprobs a request may ask for.
const MaxTopLogprobs = 20

// Request is one generation request.
type Request struct {
	// ID names the request for Abort and in events; empty = the engine assigns one.
	ID string
	// Prompt is the prompt's token ids (at least one).
	Prompt []int32
	// Sampling holds the sampling parameters.
	Sampling SamplingParams
	// Priority orders the waiting queue under PolicyPriority: lower values are served
	// first (as in vLLM); ties go by arrival.
	Priority int
	// Arrival is when the request arrived; zero = the time of Submit.
	Arrival time.Time
}

// FinishReason says why a request ended.
type FinishReason uint8

// Finish reasons; FinishNone marks a non-terminal event.
const (
	FinishNone   FinishReason = iota
	FinishStop                // an EOS or stop token was generated
	FinishLength              // max tokens or the maximum context was reached
	FinishAbort               // aborted by Abort, a cancelled context or Close
	FinishError               // the runner failed on a step of this request
)

// String returns the OpenAI spelling: "stop", "length", "abort", "error" ("" for none).
func (f FinishReason) String() string {
	switch f {
	case FinishStop:
		return "stop"
	case FinishLength:
		return "length"
	case FinishAbort:
		return "abort"
	case FinishError:
		return "error"
	}
	return ""
}

// TopLogprob is one alternative token and its log probability.
type TopLogprob struct {
	Token   int32
	Logprob float32
}

// TokenLogprob is the log probability of a generated token and, when asked, the most
// likely alternatives at its position.
type TokenLogprob struct {
	Token   int32
	Logprob float32
	Top     []TopLogprob
}

// Usage counts a request's tokens; it is filled in the terminal event.
type Usage struct {
	PromptTokens     int
	CompletionTokens int
	// CachedTokens is how many prompt tokens came from the prefix cache at admission.
	CachedTokens int
}

// Event is what a Stream delivers: new tokens, and on the terminal event a finish reason.
// Several steps' tokens may be merged into one event; the terminal event may carry the
// last tokens too. After the terminal event the stream ends.
type Event struct {
	Tokens []int32
	// Logprobs runs parallel to Tokens when the request asked for logprobs.
	Logprobs []TokenLogprob
	// Finish is FinishNone except on the terminal event.
	Finish FinishReason
	// Err explains FinishError (wrapping ErrRunner or ErrBadResult) and FinishAbort
	// (ErrAborted or the context's error).
	Err error
	// Usage is set on the terminal event.
	Usage Usage
}

// validate checks a request against the runner's description and returns the effective
// max tokens.
func (r *Request) validate(info *RunnerInfo) (int, error) {
	if len(r.Prompt) == 0 {
		return 0, fmt.Errorf("%w: empty prompt", ErrInvalidRequest)
	}
	for i, t := range r.Prompt {
		if t < 0 || int(t) >= info.VocabSize {
			return 0, fmt.Errorf("%w: prompt token %d at position %d outside the vocabulary [0, %d)", ErrInvalidRequest, t, i, info.VocabSize)
		}
	}
	s := &r.Sampling
	switch {
	case s.Temperature < 0 || s.Temperature != s.Temperature:
		return 0, fmt.Errorf("%w: temperature %v must be >= 0", ErrInvalidRequest, s.Temperature)
	case s.TopP < 0 || s.TopP > 1 || s.TopP != s.TopP:
		return 0, fmt.Errorf("%w: top_p %v outside [0, 1]", ErrInvalidRequest, s.TopP)
	case s.TopK < 0:
		return 0, fmt.Errorf("%w: top_k %d must be >= 0", ErrInvalidRequest, s.TopK)
	case s.MinP < 0 || s.MinP > 1 || s.MinP != s.MinP:
		return 0, fmt.Errorf("%w: min_p %v outside [0, 1]", ErrInvalidRequest, s.MinP)
	case s.MaxTokens < 0:
		return 0, fmt.Errorf("%w: max_tokens %d must be >= 0", ErrInvalidRequest, s.MaxTokens)
	case s.TopLogprobs < 0 || s.TopLogprobs > MaxTopLogprobs:
		return 0, fmt.Errorf("%w: top_logprobs %d outside [0, %d]", ErrInvalidRequest, s.TopLogprobs, MaxTopLogprobs)
	case s.TopLogprobs > 0 && !s.Logprobs:
		return 0, fmt.Errorf("%w: top_logprobs needs logprobs", ErrInvalidRequest)
	}
	for _, t := range s.StopTokenIDs {
		if t < 0 || int(t) >= info.VocabSize {
			return 0, fmt.Errorf("%w: stop token %d outside the vocabulary [0, %d)", ErrInvalidRequest, t, info.VocabSize)
		}
	}
	if len(r.Prompt) >= info.MaxContext {
		return 0, fmt.Errorf("%w: prompt of %d tokens leaves no room in a context of %d", ErrContextTooLong, len(r.Prompt), info.MaxContext)
	}
	maxTokens := s.MaxTokens
	if maxTokens == 0 {
		maxTokens = info.MaxContext - len(r.Prompt)
	}
	if maxTokens > info.MaxContext-len(r.Prompt) { // not len+max: a huge max would wrap
		return 0, fmt.Errorf("%w: %d prompt tokens + %d max tokens > %d", ErrContextTooLong, len(r.Prompt), maxTokens, info.MaxContext)
	}
	return maxTokens, nil
}
