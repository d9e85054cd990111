package loadgen

import (
	"errors"
	"fmt"
	"net/url"
	"time"
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
	// PromptWords is the length of each generated prompt in words (roughly one token each).
	PromptWords int
	// OutputTokens is each request's max_tokens; IgnoreEOS asks the server to generate all
	// of them (a vLLM extension that Resin honours).
	OutputTokens int
	IgnoreEOS    bool
	// Seed makes prompts and arrival times reproducible.
	Seed int64
	// Timeout bounds each request (0 = none).
	Timeout time.Duration
	// Progress, when set, is called after each finished request, one call at a time.
	Progress func(done, total int)
}

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
	case c.PromptWords <= 0:
		return fmt.Errorf("%w: prompt length %d must be > 0", ErrConfig, c.PromptWords)
	case c.OutputTokens <= 0:
		return fmt.Errorf("%w: output length %d must be > 0", ErrConfig, c.OutputTokens)
	}
	return nil
}
