package serve

import (
	"encoding/json"
	"testing"

	"github.com/resin-llm/resin/core/grammar"
)

// TestRequiredToolsOneCall: tool_choice "required" with parallel_tool_calls false
// constrains the output to exactly one call (before, any number was allowed and all but
// the first were dropped afterwards); with parallel calls two stay allowed.
func TestRequiredToolsOneCall(t *testing.T) {
	tools := []json.RawMessage{json.RawMessage(`{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}`)}
	toks := make([][]byte, 257)
	for b := range 256 {
		toks[b] = []byte{byte(b)}
	}
	v, err := grammar.NewVocabulary(toks, []int32{256}, nil)
	if err != nil {
		t.Fatal(err)
	}
	const two = `[{"name": "f", "parameters": {}}, {"name": "f", "parameters": {}}]`
	for _, one := range []bool{true, false} {
		src, err := requiredToolsSchema(tools, one)
		if err != nil {
			t.Fatal(err)
		}
		g, err := grammar.Compile(v, grammar.JSONSchema, src)
		if err != nil {
			t.Fatal(err)
		}
		m, _ := g.NewMatcher()
		var refused error
		for i := 0; i < len(two) && refused == nil; i++ {
			refused = m.Accept(int32(two[i]))
		}
		if refused == nil {
			refused = m.Accept(256)
		}
		if one != (refused != nil) {
			t.Fatalf("one call %v: two calls give %v", one, refused)
		}
	}
}
