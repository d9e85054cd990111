package serve

import (
	"encoding/json"
	"testing"

	"github.com/resin-llm/resin/core/tokenizer"
)

func TestChatMessagesKeepJSONOrderForTemplates(t *testing.T) {
	var req chatRequest
	body := `{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
		{"role":"assistant","content":null,"tool_calls":[{"type":"function","function":{"name":"f","arguments":{"z":1,"a":2}}}]}],
		"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{}}}}]}`
	if err := json.Unmarshal([]byte(body), &req); err != nil {
		t.Fatal(err)
	}
	msgs, err := chatMessages(req.Messages)
	if err != nil {
		t.Fatal(err)
	}
	tmpl, err := tokenizer.NewChatTemplate(`{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% if m.tool_calls %}{{ m.tool_calls[0].function.arguments | tojson }}{% endif %}{% endfor %}{{ tools[0] | tojson }}`)
	if err != nil {
		t.Fatal(err)
	}
	var tools []any
	for _, x := range req.Tools {
		tools = append(tools, x)
	}
	out, err := tmpl.Render(msgs, tokenizer.ChatOptions{Tools: tools})
	if err != nil {
		t.Fatal(err)
	}
	want := `[user:a
b][assistant:]{"z": 1, "a": 2}{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}`
	if out != want {
		t.Fatalf("rendered\n%s\nwant\n%s", out, want)
	}
}
