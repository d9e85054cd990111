package serve

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/serve/toolparse"
)

// TestUsageAlwaysReportsCachedTokens: a cold prompt reports cached_tokens 0 rather than
// leaving prompt_tokens_details out, so a load generator can tell 0% from "not reported".
func TestUsageAlwaysReportsCachedTokens(t *testing.T) {
	for _, cached := range []int{0, 32} {
		b, err := json.Marshal(usageOf(engine.Usage{PromptTokens: 48, CompletionTokens: 4, CachedTokens: cached}))
		if err != nil {
			t.Fatal(err)
		}
		var got struct {
			Details *struct {
				Cached *int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		}
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatal(err)
		}
		if got.Details == nil || got.Details.Cached == nil || *got.Details.Cached != cached {
			t.Errorf("cached %d: usage %s", cached, b)
		}
	}
}

// TestToolCallOnlyMessageHasNullContent: a message that is only tool calls says
// "content": null, as OpenAI's does; a message with text keeps it.
func TestToolCallOnlyMessageHasNullContent(t *testing.T) {
	calls := []toolparse.ToolCall{{ID: "call_1", Type: "function"}}
	calls[0].Function.Name = "get_weather"
	calls[0].Function.Arguments = `{"city":"Paris"}`
	for _, c := range []struct {
		m    chatMessage
		want string
	}{
		{chatMessage{Role: "assistant", ToolCalls: calls}, `"content":null`},
		{chatMessage{Role: "assistant", Content: "hi", ToolCalls: calls}, `"content":"hi"`},
		{chatMessage{Role: "assistant"}, `"content":""`},
	} {
		b, err := json.Marshal(c.m)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), c.want) || strings.Count(string(b), `"content"`) != 1 {
			t.Errorf("%s: want %s once", b, c.want)
		}
	}
}
