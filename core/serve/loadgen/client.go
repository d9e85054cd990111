package loadgen

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
	"time"
)

// sample is what one request measured.
type sample struct {
	err          error
	cancelled    bool // ended by the run's cancellation, not by a fault
	start        time.Time
	ttft         time.Duration   // to the first chunk carrying text
	itl          []time.Duration // between successive chunks carrying text
	e2e          time.Duration
	promptTokens int
	outputTokens int
	cachedTokens int
	hasCached    bool // usage carried prompt_tokens_details
}

// usage is the OpenAI usage object, with the prompt tokens served from the prefix cache.
type usage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	PromptTokensDetails *struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

// chunk is one streamed chunk or, from a server that does not stream, the whole answer.
type chunk struct {
	Choices []struct {
		Text  string `json:"text"`
		Delta struct {
			Content string `json:"content"`
		} `json:"delta"`
		Message struct {
			Content string `json:"content"`
		} `json:"message"`
	} `json:"choices"`
	Usage *usage `json:"usage"`
	Error *struct {
		Message string `json:"message"`
	} `json:"error"`
}

// hasText reports whether the chunk carries generated text.
func (c *chunk) hasText() bool {
	if len(c.Choices) == 0 {
		return false
	}
	ch := c.Choices[0]
	return ch.Text != "" || ch.Delta.Content != "" || ch.Message.Content != ""
}

// send runs one streaming request and times its chunks. A request cut short because ctx
// was cancelled is marked cancelled; a per-request timeout is a failure.
func send(ctx context.Context, hc *http.Client, cfg *Config, prompt string) sample {
	s := sample{start: time.Now()}
	s.err = s.do(ctx, hc, cfg, prompt)
	s.e2e = time.Since(s.start)
	if s.err != nil && ctx.Err() != nil {
		s.cancelled = true
	}
	return s
}

func (s *sample) do(ctx context.Context, hc *http.Client, cfg *Config, prompt string) error {
	body := map[string]any{
		"model":          cfg.Model,
		"max_tokens":     cfg.OutputTokens,
		"stream":         true,
		"stream_options": map[string]any{"include_usage": true},
		"temperature":    0,
	}
	if cfg.IgnoreEOS {
		body["ignore_eos"] = true
	}
	path := "/v1/completions"
	if cfg.Chat {
		path = "/v1/chat/completions"
		body["messages"] = []map[string]string{{"role": "user", "content": prompt}}
	} else {
		body["prompt"] = prompt
	}
	if cfg.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.Timeout)
		defer cancel()
	}
	resp, err := post(ctx, hc, cfg, path, body, "text/event-stream")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(msg)))
	}
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt == "application/json" {
		return s.whole(resp.Body)
	}
	return s.stream(resp.Body)
}

// post sends body as JSON to the server's path with cfg's API key; accept, when set, is
// the Accept header.
func post(ctx context.Context, hc *http.Client, cfg *Config, path string, body any, accept string) (*http.Response, error) {
	raw, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(cfg.BaseURL, "/")+path, bytes.NewReader(raw))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	if cfg.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+cfg.APIKey)
	}
	return hc.Do(req)
}

// stream reads an SSE answer up to its [DONE].
func (s *sample) stream(body io.Reader) error {
	var last time.Time
	rd := bufio.NewReader(body)
	done := false
	for {
		line, err := rd.ReadBytes('\n')
		if data, ok := bytes.CutPrefix(bytes.TrimSpace(line), []byte("data:")); ok {
			var cerr error
			if done, cerr = s.event(bytes.TrimSpace(data), &last); cerr != nil {
				return cerr
			}
		}
		if done || err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
	}
	switch {
	case !done:
		return fmt.Errorf("stream ended without [DONE]")
	case s.outputTokens == 0 && s.ttft == 0:
		return fmt.Errorf("stream carried no tokens and no usage")
	}
	return nil
}

// whole reads the answer of a server that did not stream: the first token is timed with
// the last, and there are no inter-token latencies.
func (s *sample) whole(body io.Reader) error {
	var c chunk
	if err := json.NewDecoder(body).Decode(&c); err != nil {
		return fmt.Errorf("bad JSON answer: %w", err)
	}
	if c.Error != nil {
		return fmt.Errorf("server error: %s", c.Error.Message)
	}
	s.ttft = time.Since(s.start)
	s.record(c.Usage)
	if !c.hasText() && s.outputTokens == 0 {
		return fmt.Errorf("answer carried no tokens and no usage")
	}
	return nil
}

// event records one SSE data payload in s, timing the chunks that carry text (last is
// when the previous one came). It reports whether the payload is the stream's [DONE].
func (s *sample) event(data []byte, last *time.Time) (bool, error) {
	if string(data) == "[DONE]" {
		return true, nil
	}
	var c chunk
	if err := json.Unmarshal(data, &c); err != nil {
		return false, fmt.Errorf("bad SSE chunk %q: %w", data, err)
	}
	if c.Error != nil {
		return false, fmt.Errorf("server error in stream: %s", c.Error.Message)
	}
	s.record(c.Usage)
	if !c.hasText() {
		return false, nil
	}
	now := time.Now()
	if last.IsZero() {
		s.ttft = now.Sub(s.start)
	} else {
		s.itl = append(s.itl, now.Sub(*last))
	}
	*last = now
	return false, nil
}

// record keeps the token counts of a usage object (nil: none in this chunk).
func (s *sample) record(u *usage) {
	if u == nil {
		return
	}
	s.promptTokens, s.outputTokens = u.PromptTokens, u.CompletionTokens
	if u.PromptTokensDetails != nil {
		s.cachedTokens, s.hasCached = u.PromptTokensDetails.CachedTokens, true
	}
}
