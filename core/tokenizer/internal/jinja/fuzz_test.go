package jinja

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// FuzzRender compiles and renders arbitrary templates: any of them may fail, none may
// panic. Seeds are the Python-checked cases and the committed model templates.
func FuzzRender(f *testing.F) {
	if raw, err := os.ReadFile("../../testdata/jinja.golden.json"); err == nil {
		var doc struct {
			Cases []struct {
				Template string `json:"template"`
			} `json:"cases"`
		}
		if json.Unmarshal(raw, &doc) == nil {
			for _, c := range doc.Cases {
				f.Add(c.Template)
			}
		}
	}
	paths, _ := filepath.Glob("../../testdata/templates/*.jinja")
	for _, p := range paths {
		if src, err := os.ReadFile(p); err == nil {
			f.Add(string(src))
		}
	}
	f.Fuzz(func(t *testing.T, src string) {
		tmpl, err := Compile(src)
		if err != nil {
			return
		}
		msgs := FromGoValue([]any{
			map[string]any{"role": "system", "content": "s"},
			map[string]any{"role": "user", "content": []any{map[string]any{"type": "text", "text": "t"}}},
			map[string]any{"role": "assistant", "content": nil, "tool_calls": []any{map[string]any{"type": "function",
				"function": map[string]any{"name": "f", "arguments": map[string]any{"a": 1.5}}}}},
			map[string]any{"role": "tool", "content": "r"},
		})
		_, _ = tmpl.RenderValues(map[string]Value{"messages": msgs, "tools": None(), "add_generation_prompt": NewBool(true), "x": NewInt(3)})
	})
}
