package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// LoadChatTemplate reads a model's chat template as transformers does: the files
// chat_template.jinja and additional_chat_templates/NAME.jinja next to path (a
// tokenizer_config.json) take priority over the config's chat_template entry, which is a
// string or a list of named templates. The "default" one renders; a "tool_use" one
// replaces it when tools are given. Special tokens (bos_token, ...) come from the config.
func LoadChatTemplate(path string) (*ChatTemplate, error) {
	data, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("load chat template: %w", err)
	}
	files, ferr := templateFiles(filepath.Dir(path))
	if ferr != nil {
		return nil, fmt.Errorf("load chat template: %w", ferr)
	}
	if err != nil {
		if len(files) == 0 {
			return nil, fmt.Errorf("load chat template: %w", err)
		}
		data = []byte("{}") // templates without a tokenizer_config.json
	}
	c, err := parseChatTemplates(data, files, "")
	if err != nil {
		return nil, fmt.Errorf("load chat template %s: %w", path, err)
	}
	return c, nil
}

// ParseChatTemplate reads the chat template called name ("" for the default, with its
// "tool_use" companion) from the contents of a tokenizer_config.json.
func ParseChatTemplate(config []byte, name string) (*ChatTemplate, error) {
	return parseChatTemplates(config, nil, name)
}

// templateFiles reads chat_template.jinja (as "default") and
// additional_chat_templates/*.jinja in dir; none is no error.
func templateFiles(dir string) (map[string]string, error) {
	out := map[string]string{}
	data, err := os.ReadFile(filepath.Join(dir, "chat_template.jinja"))
	switch {
	case err == nil:
		out["default"] = string(data)
	case !errors.Is(err, fs.ErrNotExist):
		return nil, err
	}
	extra, err := filepath.Glob(filepath.Join(dir, "additional_chat_templates", "*.jinja"))
	if err != nil {
		return nil, err
	}
	for _, p := range extra {
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		out[strings.TrimSuffix(filepath.Base(p), ".jinja")] = string(data)
	}
	return out, nil
}

func parseChatTemplates(config []byte, files map[string]string, name string) (*ChatTemplate, error) {
	var cfg map[string]json.RawMessage
	if err := json.Unmarshal(config, &cfg); err != nil {
		return nil, fmt.Errorf("parse tokenizer_config.json: %v: %w", err, ErrInvalid)
	}
	templates := files
	if len(templates) == 0 {
		var err error
		if templates, err = configTemplates(cfg["chat_template"]); err != nil {
			return nil, err
		}
	}
	want := name
	if want == "" {
		want = "default"
	}
	src, ok := templates[want]
	if !ok {
		return nil, fmt.Errorf("chat template %q (the model has: %s): %w", want,
			strings.Join(slices.Sorted(maps.Keys(templates)), ", "), ErrNoChatTemplate)
	}
	c, err := NewChatTemplate(src)
	if err != nil {
		return nil, err
	}
	if tu, ok := templates["tool_use"]; ok && name == "" {
		if c.toolUse, err = NewChatTemplate(tu); err != nil {
			return nil, fmt.Errorf("tool_use: %w", err)
		}
		c.toolUse.tokens = c.tokens // one set of special tokens for both
	}
	for _, key := range []string{"bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token"} {
		if tok, ok := tokenContent(cfg[key]); ok {
			c.tokens[key] = tok
		}
	}
	return c, nil
}

// configTemplates reads a tokenizer_config.json chat_template entry: a string (the
// default) or a list of {"name", "template"}.
func configTemplates(raw json.RawMessage) (map[string]string, error) {
	if isNull(raw) {
		return nil, ErrNoChatTemplate
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return map[string]string{"default": s}, nil
	}
	var list []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, fmt.Errorf("chat_template is neither a string nor a list of named templates: %w", ErrInvalid)
	}
	out := make(map[string]string, len(list))
	for _, t := range list {
		out[t.Name] = t.Template
	}
	return out, nil
}
