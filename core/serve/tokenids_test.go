package serve

import (
	"encoding/json"
	"fmt"
	"testing"
)

// TestOutOfVocabularyIDsNameTheField: a token id outside the vocabulary in logit_bias,
// stop_token_ids or a token-id prompt is a 400 naming that field (before, the engine's
// refusal came back with param null).
func TestOutOfVocabularyIDsNameTheField(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	vocab := h.eng.Info().VocabSize
	chat := []any{map[string]any{"role": "user", "content": "x"}}
	for _, c := range []struct {
		path  string
		body  map[string]any
		param string
	}{
		{"/v1/completions", map[string]any{"prompt": "x", "logit_bias": map[string]float64{fmt.Sprint(vocab): 1}}, "logit_bias"},
		{"/v1/chat/completions", map[string]any{"messages": chat, "logit_bias": map[string]float64{"99999999": 1}}, "logit_bias"},
		{"/v1/completions", map[string]any{"prompt": "x", "stop_token_ids": []int{1, vocab}}, "stop_token_ids"},
		{"/v1/chat/completions", map[string]any{"messages": chat, "stop_token_ids": []int{-1}}, "stop_token_ids"},
		{"/v1/completions", map[string]any{"prompt": []int{1, vocab + 5}}, "prompt"},
		{"/v1/completions", map[string]any{"prompt": [][]int{{1}, {-3}}, "echo": true}, "prompt"},
	} {
		code, raw := h.post(c.path, c.body)
		var e errorResp
		if err := json.Unmarshal(raw, &e); err != nil || code != 400 || e.Error.Param == nil || *e.Error.Param != c.param {
			t.Errorf("%v: status %d, %s; want 400 naming %s", c.body, code, raw, c.param)
		}
	}
	// The edges of the vocabulary are accepted.
	h.cmpl(map[string]any{"prompt": []int{0, vocab - 1}, "max_tokens": 2, "logit_bias": map[string]float64{fmt.Sprint(vocab - 1): 1}, "stop_token_ids": []int{0}})
	h.stopAndCheck("out-of-vocabulary ids")
}
