package serve

import (
	"encoding/json"
	"strings"
	"testing"
)

// pydanticTool is a tool as OpenAI's pydantic_function_tool writes a model with a nested
// one: the nested schema under $defs, referenced as "#/$defs/Color".
func pydanticTool(name, colors string) json.RawMessage {
	return json.RawMessage(`{"type": "function", "function": {"name": "` + name + `", "strict": true, "parameters": {
		"$defs": {"Color": {"enum": ` + colors + `, "title": "Color", "type": "string"}},
		"properties": {"color": {"$ref": "#/$defs/Color"}}, "required": ["color"], "title": "Paint",
		"type": "object", "additionalProperties": false}}}`)
}

// TestRequiredToolsWithDefs: tool_choice "required" over tools whose parameters reference
// their own $defs answers calls whose arguments follow those definitions; two tools
// sharing a definition are served, two defining one name differently get 400 naming
// tools. Before, every tool's schema was nested in the array schema, where
// "#/$defs/Color" resolves against the array's root: the request got 400 "$ref does not
// resolve" (the named tool_choice, compiled at the tool's own root, worked).
func TestRequiredToolsWithDefs(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	tools := []json.RawMessage{pydanticTool("paint", `["red", "green"]`), pydanticTool("repaint", `["red", "green"]`)}
	for seed := 0; seed < 3; seed++ {
		var out chatAnswer
		h.postJSON("/v1/chat/completions", map[string]any{"messages": userMsg, "tools": tools, "tool_choice": "required",
			"temperature": 1, "seed": seed, "max_tokens": 1500}, 200, &out)
		c := out.Choices[0]
		if len(c.Message.ToolCalls) == 0 || c.FinishReason != "tool_calls" {
			t.Fatalf("seed %d: %+v", seed, c)
		}
		for _, call := range c.Message.ToolCalls {
			var args struct {
				Color string `json:"color"`
			}
			if err := json.Unmarshal([]byte(call.Function.Arguments), &args); err != nil || args.Color != "red" && args.Color != "green" ||
				call.Function.Name != "paint" && call.Function.Name != "repaint" {
				t.Fatalf("seed %d: call %s(%s), want paint or repaint with color red or green", seed, call.Function.Name, call.Function.Arguments)
			}
		}
	}
	clash := []json.RawMessage{pydanticTool("paint", `["red", "green"]`), pydanticTool("repaint", `["blue"]`)}
	code, raw := h.post("/v1/chat/completions", map[string]any{"messages": userMsg, "tools": clash, "tool_choice": "required", "max_tokens": 50})
	var e errorResp
	if code != 400 || json.Unmarshal(raw, &e) != nil || e.Error.Param == nil || *e.Error.Param != "tools" || !strings.Contains(e.Error.Message, `"Color"`) {
		t.Fatalf("two tools defining Color differently: %d %s, want 400 naming tools and Color", code, raw)
	}
}
