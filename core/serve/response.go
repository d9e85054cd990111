package serve

import (
	"encoding/json"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/serve/toolparse"
)

type usageJSON struct {
	PromptTokens        int           `json:"prompt_tokens"`
	CompletionTokens    int           `json:"completion_tokens"`
	TotalTokens         int           `json:"total_tokens"`
	PromptTokensDetails *promptDetail `json:"prompt_tokens_details,omitempty"`
}

type promptDetail struct {
	CachedTokens int `json:"cached_tokens"`
}

// usageOf is a response's usage. prompt_tokens_details.cached_tokens is always there, 0 on
// a cold prompt, as OpenAI reports it, so a client tells "nothing cached" from "not
// reported".
func usageOf(u engine.Usage) *usageJSON {
	return &usageJSON{
		PromptTokens: u.PromptTokens, CompletionTokens: u.CompletionTokens, TotalTokens: u.PromptTokens + u.CompletionTokens,
		PromptTokensDetails: &promptDetail{CachedTokens: u.CachedTokens},
	}
}

// usageSoFar is a stream chunk's usage with continuous usage stats: its choice's prompt
// and the tokens generated so far (no cached count: the engine reports it at the end).
func usageSoFar(prompt, generated int) *usageJSON {
	return &usageJSON{PromptTokens: prompt, CompletionTokens: generated, TotalTokens: prompt + generated}
}

type completionChoice struct {
	Index        int                 `json:"index"`
	Text         string              `json:"text"`
	Logprobs     *completionLogprobs `json:"logprobs"`
	FinishReason *string             `json:"finish_reason"`
	// PromptLogprobs is vLLM's prompt_logprobs, when asked for.
	PromptLogprobs []map[string]promptLogprob `json:"prompt_logprobs,omitempty"`
}

type completionResponse struct {
	envelope
	Choices []completionChoice `json:"choices"`
	Usage   *usageJSON         `json:"usage,omitempty"`
}

type chatMessage struct {
	Role    string  `json:"role"`
	Content string  `json:"content"`
	Refusal *string `json:"refusal"`
	// ReasoningContent and ToolCalls are filled by the server's parsers (chattools.go).
	ReasoningContent *string              `json:"reasoning_content,omitempty"`
	ToolCalls        []toolparse.ToolCall `json:"tool_calls,omitempty"`
}

// MarshalJSON writes content as null when the message is only tool calls, as OpenAI does.
func (m chatMessage) MarshalJSON() ([]byte, error) {
	type plain chatMessage
	if m.Content != "" || len(m.ToolCalls) == 0 {
		return json.Marshal(plain(m))
	}
	return json.Marshal(struct {
		plain
		Content *string `json:"content"`
	}{plain: plain(m)})
}

type chatChoice struct {
	Index        int           `json:"index"`
	Message      chatMessage   `json:"message"`
	Logprobs     *chatLogprobs `json:"logprobs"`
	FinishReason string        `json:"finish_reason"`
}

type chatResponse struct {
	envelope
	Choices []chatChoice `json:"choices"`
	Usage   *usageJSON   `json:"usage"`
	// PromptLogprobs is vLLM's prompt_logprobs, when asked for.
	PromptLogprobs []map[string]promptLogprob `json:"prompt_logprobs,omitempty"`
}

type chatDelta struct {
	Role             string                    `json:"role,omitempty"`
	Content          *string                   `json:"content,omitempty"`
	ReasoningContent *string                   `json:"reasoning_content,omitempty"`
	ToolCalls        []toolparse.ToolCallDelta `json:"tool_calls,omitempty"`
}

type chatChunkChoice struct {
	Index        int           `json:"index"`
	Delta        chatDelta     `json:"delta"`
	Logprobs     *chatLogprobs `json:"logprobs"`
	FinishReason *string       `json:"finish_reason"`
}

type chatChunk struct {
	envelope
	Choices []chatChunkChoice `json:"choices"`
	Usage   *usageJSON        `json:"usage,omitempty"`
}

// fingerprint names the serving stack in system_fingerprint.
const fingerprint = "resin"

// envelope is the head of every completion and chat response and stream chunk.
type envelope struct {
	ID                string `json:"id"`
	Object            string `json:"object"`
	Created           int64  `json:"created"`
	Model             string `json:"model"`
	SystemFingerprint string `json:"system_fingerprint"`
}

func newEnvelope(id, object string, created int64, model string) envelope {
	return envelope{ID: id, Object: object, Created: created, Model: model, SystemFingerprint: fingerprint}
}
