package serve

import (
	"encoding/json"
	"testing"

	"github.com/resin-llm/resin/core/engine"
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
