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

// TestMalformedToolsRefused: a tool without a function name, of a type other than
// function, or whose parameters are not a schema object is a 400 naming it, whatever
// tool_choice says (before, with tool_choice absent or "auto", such tools went to the
// chat template and the request was served with a nameless tool in its prompt).
func TestMalformedToolsRefused(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	good := map[string]any{"type": "function", "function": map[string]any{"name": "f", "parameters": map[string]any{"type": "object"}}}
	for _, c := range []struct {
		tool  any
		param string
	}{
		{map[string]any{"type": "function"}, "tools[1].function.name"},
		{map[string]any{"type": "function", "function": map[string]any{"description": "no name"}}, "tools[1].function.name"},
		{map[string]any{"type": "custom", "custom": map[string]any{"name": "x"}}, "tools[1].type"},
		{map[string]any{"type": "function", "function": map[string]any{"name": "g", "parameters": "{}"}}, "tools[1].function.parameters"},
		{"f", "tools[1]"},
	} {
		for _, choice := range []any{nil, "auto", "none"} {
			body := map[string]any{"messages": userMsg, "tools": []any{good, c.tool}, "max_tokens": 2}
			if choice != nil {
				body["tool_choice"] = choice
			}
			code, raw := h.post("/v1/chat/completions", body)
			var e errorResp
			if err := json.Unmarshal(raw, &e); err != nil || code != 400 || e.Error.Param == nil || *e.Error.Param != c.param {
				t.Errorf("tool %v, tool_choice %v: status %d, %s; want 400 naming %s", c.tool, choice, code, raw, c.param)
			}
		}
	}
	// Well-formed tools, with no type (vLLM's default) or no parameters, are served.
	h.postJSON("/v1/chat/completions", map[string]any{"messages": userMsg, "max_tokens": 2,
		"tools": []any{good, map[string]any{"function": map[string]any{"name": "h"}}}}, 200, nil)
	h.stopAndCheck("malformed tools")
}
