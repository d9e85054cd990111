package loadgen

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// sample is what one request measured.
type sample struct {
	err          error
	start        time.Time
	ttft         time.Duration   // to the first chunk carrying text
	itl          []time.Duration // between successive chunks carrying text
	e2e          time.Duration
	promptTokens int
	outputTokens int
}

type chunk struct {
	Choices []struct {
		Text  string `json:"text"`
		Delta struct {
			Content string `json:"content"`
		} `json:"delta"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
	Error *struct {
		Message string `json:"message"`
	} `json:"error"`
}

// send runs one streaming request and times its chunks.
func send(ctx context.Context, hc *http.Client, cfg *Config, prompt string) sample {
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
	raw, _ := json.Marshal(body)
	if cfg.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.Timeout)
		defer cancel()
	}
	s := sample{start: time.Now()}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(cfg.BaseURL, "/")+path, bytes.NewReader(raw))
	if err != nil {
		s.err = err
		return s
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	if cfg.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+cfg.APIKey)
	}
	resp, err := hc.Do(req)
	if err != nil {
		s.err = err
		return s
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		s.err = fmt.Errorf("HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(msg)))
		return s
	}
	var last time.Time
	rd := bufio.NewReader(resp.Body)
	done := false
	for {
		line, err := rd.ReadBytes('\n')
		if data, ok := bytes.CutPrefix(bytes.TrimSpace(line), []byte("data:")); ok {
			var cerr error
			if done, cerr = s.event(bytes.TrimSpace(data), &last); cerr != nil {
				s.err = cerr
				return s
			}
		}
		if done || err == io.EOF {
			break
		}
		if err != nil {
			s.err = err
			return s
		}
	}
	s.e2e = time.Since(s.start)
	if !done {
		s.err = fmt.Errorf("stream ended without [DONE]")
	} else if s.outputTokens == 0 && s.ttft == 0 {
		s.err = fmt.Errorf("stream carried no tokens and no usage")
	}
	return s
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
	if c.Usage != nil {
		s.promptTokens, s.outputTokens = c.Usage.PromptTokens, c.Usage.CompletionTokens
	}
	if len(c.Choices) == 0 || (c.Choices[0].Text == "" && c.Choices[0].Delta.Content == "") {
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
