package loadgen

import (
	"errors"
	"fmt"
	"net/url"
	"time"

	"github.com/resin-llm/resin/core/tokenizer"
)

// ErrConfig reports an invalid load configuration.
var ErrConfig = errors.New("loadgen: invalid configuration")

// Config describes one load run.
type Config struct {
	// BaseURL is the server's root, e.g. http://127.0.0.1:8000 (the /v1 paths are added).
	BaseURL string
	// Model is sent as the request's model.
	Model string
	// APIKey, when set, is sent as a Bearer token.
	APIKey string
	// Chat sends /v1/chat/completions requests; otherwise /v1/completions.
	Chat bool
	// Requests is the number of requests to send.
	Requests int
	// Concurrency caps the requests in flight (fixed concurrency when RequestRate is 0).
	Concurrency int
	// RequestRate, when > 0, starts requests at Poisson arrivals of this many per second
	// (still capped by Concurrency).
	RequestRate float64
	// PromptLen is each prompt's length in tokens of the served model, counted by the
	// server's /tokenize when it answers, else by Tokenizer, else approximated by words
	// (with a warning). For chat requests it counts the user message; the chat template
	// adds its own tokens.
	PromptLen int
	// Tokenizer counts prompt tokens when the server has no /tokenize; it should be the
	// served model's.
	Tokenizer *tokenizer.Tokenizer
	// OutputTokens is each request's max_tokens; IgnoreEOS asks the server to generate all
	// of them (a vLLM extension that Resin honours).
	OutputTokens int
	IgnoreEOS    bool
	// Seed makes prompts and arrival times reproducible; 0 draws a fresh seed, which the
	// report names so that the run can be repeated.
	Seed int64
	// Timeout bounds each request (0 = none).
	Timeout time.Duration
	// Progress, when set, is called once when the first request is sent and after each
	// request ends, one call at a time.
	Progress func(Tally)
	// Warn, when set, receives warnings as they arise (they are in the report too).
	Warn func(msg string)
}

// Tally counts a run's requests as they end.
type Tally struct {
	Completed, Failed, Cancelled int
	Total                        int // requests asked for
}

// Done is the number of requests that ended, however they ended.
func (t Tally) Done() int { return t.Completed + t.Failed + t.Cancelled }

func (c *Config) validate() error {
	u, err := url.Parse(c.BaseURL)
	switch {
	case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
		return fmt.Errorf("%w: base URL %q must be http(s)://host[:port]", ErrConfig, c.BaseURL)
	case c.Requests <= 0:
		return fmt.Errorf("%w: requests %d must be > 0", ErrConfig, c.Requests)
	case c.Concurrency <= 0:
		return fmt.Errorf("%w: concurrency %d must be > 0", ErrConfig, c.Concurrency)
	case c.RequestRate < 0:
		return fmt.Errorf("%w: request rate %v must be >= 0", ErrConfig, c.RequestRate)
	case c.PromptLen <= 0:
		return fmt.Errorf("%w: prompt length %d must be > 0", ErrConfig, c.PromptLen)
	case c.OutputTokens <= 0:
		return fmt.Errorf("%w: output length %d must be > 0", ErrConfig, c.OutputTokens)
	}
	return nil
}
