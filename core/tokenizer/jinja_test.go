package tokenizer

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
)

// jinjaCase is one template rendered by Python Jinja2 3.1 in transformers' environment
// (scripts/tokenizer_goldens.py writes testdata/jinja.golden.json).
type jinjaCase struct {
	Template string `json:"template"`
	Want     string `json:"want"`
}

// TestJinjaMatchesPython renders each case with the data transformers would see and
// compares with Python Jinja2's output.
func TestJinjaMatchesPython(t *testing.T) {
	raw, err := os.ReadFile("testdata/jinja.golden.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Data  string      `json:"data"`
		Cases []jinjaCase `json:"cases"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	var data map[string]json.RawMessage
	if err := json.Unmarshal([]byte(doc.Data), &data); err != nil {
		t.Fatal(err)
	}
	for _, c := range doc.Cases {
		ct, err := NewChatTemplate(c.Template)
		if err != nil {
			t.Errorf("%s: compile: %v", c.Template, err)
			continue
		}
		extra := map[string]any{}
		for k, v := range data {
			extra[k] = v
		}
		got, err := ct.Render(nil, ChatOptions{Extra: extra})
		if strings.HasPrefix(c.Want, "ERROR: ") {
			if err == nil {
				t.Errorf("%s: rendered %q, Python fails with %s", c.Template, got, c.Want)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", c.Template, err)
			continue
		}
		if got != c.Want {
			t.Errorf("%s\n got  %q\n want %q", c.Template, got, c.Want)
		}
	}
}
