package tokenizer

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

type goldenCase struct {
	Text               string  `json:"text"`
	IDs                []int32 `json:"ids"`
	IDsAddSpecial      []int32 `json:"ids_add_special"`
	Decoded            string  `json:"decoded"`
	DecodedSkipSpecial string  `json:"decoded_skip_special"`
}

// goldenChat is a conversation rendered by transformers. Tool-calling chats carry their
// messages and tools as JSON text (messages_json, tools_json) so that numbers reach the
// template with the spelling a client sent.
type goldenChat struct {
	Messages            []map[string]json.RawMessage `json:"messages"`
	MessagesJSON        string                       `json:"messages_json"`
	AddGenerationPrompt bool                         `json:"add_generation_prompt"`
	Tools               []json.RawMessage            `json:"tools"`
	ToolsJSON           string                       `json:"tools_json"`
	Kwargs              map[string]json.RawMessage   `json:"kwargs"`
	ContentFormat       ContentFormat                `json:"content_format"`
	DecodeToolArguments bool                         `json:"decode_tool_arguments"`
	Prompt              string                       `json:"prompt"`
	IDs                 []int32                      `json:"ids"`
}

// render renders c with ct as the server would: messages and tools as raw JSON.
func (c goldenChat) render(t *testing.T, ct *ChatTemplate) (string, error) {
	t.Helper()
	msgs, tools := c.Messages, c.Tools
	if c.MessagesJSON != "" {
		if err := json.Unmarshal([]byte(c.MessagesJSON), &msgs); err != nil {
			t.Fatal(err)
		}
	}
	if c.ToolsJSON != "" {
		if err := json.Unmarshal([]byte(c.ToolsJSON), &tools); err != nil {
			t.Fatal(err)
		}
	}
	if c.ContentFormat != "" && c.ContentFormat != ct.ContentFormat() {
		t.Errorf("content format %s, transformers was given %s", ct.ContentFormat(), c.ContentFormat)
	}
	messages := make([]map[string]any, len(msgs))
	for i, m := range msgs {
		messages[i] = make(map[string]any, len(m))
		for k, v := range m {
			messages[i][k] = v
		}
	}
	extra := make(map[string]any, len(c.Kwargs))
	for k, v := range c.Kwargs {
		extra[k] = v
	}
	return ct.Render(messages, ChatOptions{AddGenerationPrompt: c.AddGenerationPrompt, Tools: rawTools(tools), Extra: extra,
		DecodeToolArguments: c.DecodeToolArguments, Now: goldenNow})
}

// goldenNow is the date scripts/tokenizer_goldens.py gives transformers' strftime_now
// (GOLDEN_DATE), so templates that print today's date (Mistral, gpt-oss) render the
// goldens' prompts on any day.
func goldenNow() time.Time { return time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC) }

type goldenFile struct {
	Name   string       `json:"name"`
	SHA256 string       `json:"tokenizer_sha256"`
	Cases  []goldenCase `json:"cases"`
	Chats  []goldenChat `json:"chats"`
}

// tokenizerDir finds the files of a golden: tiny/ and testdata/gpt2style/ are committed
// (trained by the golden script), the real ones are fetched by
// .ci/setup.d/30-tokenizers.sh into $RESIN_TOKENIZERS_DIR.
func tokenizerDir(t *testing.T, name string) string {
	if name == "tiny" {
		return "tiny"
	}
	if dir := filepath.Join("testdata", name); fileExists(filepath.Join(dir, "tokenizer.json")) {
		return dir
	}
	root := os.Getenv("RESIN_TOKENIZERS_DIR")
	if root == "" {
		root = filepath.Join("..", "..", ".cache", "tokenizers")
	}
	dir := filepath.Join(root, name)
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err != nil {
		t.Skipf("%s/tokenizer.json is missing: run .ci/setup.d/30-tokenizers.sh (scripts/test.sh does) to fetch it", dir)
	}
	return dir
}

func loadGolden(t *testing.T, path string) (goldenFile, *Tokenizer, string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var g goldenFile
	if err := json.Unmarshal(data, &g); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	dir := tokenizerDir(t, g.Name)
	raw, err := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(raw)
	if got := hex.EncodeToString(sum[:]); got != g.SHA256 {
		t.Fatalf("%s/tokenizer.json has sha256 %s, the golden was made from %s: rerun scripts/tokenizer-goldens.sh", dir, got, g.SHA256)
	}
	tok, err := Parse(raw)
	if err != nil {
		t.Fatalf("parse %s: %v", g.Name, err)
	}
	return g, tok, dir
}

func TestGoldens(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "*.golden.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no goldens in testdata: %v", err)
	}
	for _, path := range files {
		t.Run(filepath.Base(path), func(t *testing.T) {
			g, tok, dir := loadGolden(t, path)
			for i, c := range g.Cases {
				ids, err := tok.Encode(c.Text, false)
				if err != nil {
					t.Fatalf("case %d: %v", i, err)
				}
				if !slices.Equal(ids, c.IDs) {
					t.Errorf("case %d %q:\n got  %v\n want %v", i, c.Text, ids, c.IDs)
				}
				withSpecial, err := tok.Encode(c.Text, true)
				if err != nil {
					t.Fatalf("case %d: %v", i, err)
				}
				if !slices.Equal(withSpecial, c.IDsAddSpecial) {
					t.Errorf("case %d %q with special tokens:\n got  %v\n want %v", i, c.Text, withSpecial, c.IDsAddSpecial)
				}
				if got := tok.Decode(c.IDs, false); got != c.Decoded {
					t.Errorf("case %d: decode\n got  %q\n want %q", i, got, c.Decoded)
				}
				if got := tok.Decode(c.IDs, true); got != c.DecodedSkipSpecial {
					t.Errorf("case %d: decode skipping special tokens\n got  %q\n want %q", i, got, c.DecodedSkipSpecial)
				}
				d := tok.NewDetokenizer(false)
				streamed := ""
				for _, id := range c.IDs {
					streamed += d.Add(id)
				}
				if streamed+d.Flush() != c.Decoded {
					t.Errorf("case %d: streamed decode %q, want %q", i, streamed, c.Decoded)
				}
			}
			if len(g.Chats) == 0 {
				return
			}
			ct, err := LoadChatTemplate(filepath.Join(dir, "tokenizer_config.json"))
			if err != nil {
				t.Fatal(err)
			}
			for i, c := range g.Chats {
				prompt, err := c.render(t, ct)
				if err != nil {
					t.Errorf("chat %d: %v", i, err)
					continue
				}
				if prompt != c.Prompt {
					t.Errorf("chat %d: rendered\n%q\nwant\n%q", i, prompt, c.Prompt)
				}
				ids, err := tok.Encode(c.Prompt, false)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(ids, c.IDs) {
					t.Errorf("chat %d ids:\n got  %v\n want %v", i, ids, c.IDs)
				}
			}
		})
	}
}

func rawTools(tools []json.RawMessage) []any {
	if tools == nil {
		return nil
	}
	out := make([]any, len(tools))
	for i, t := range tools {
		out[i] = t
	}
	return out
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// TestTemplateGoldens renders the committed chat templates of tool-calling models
// (testdata/templates) and compares with transformers' prompts.
func TestTemplateGoldens(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "*.template.golden.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no template goldens in testdata: %v", err)
	}
	for _, path := range files {
		t.Run(strings.TrimSuffix(filepath.Base(path), ".template.golden.json"), func(t *testing.T) {
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			var g struct {
				Template      string            `json:"template"`
				SHA256        string            `json:"template_sha256"`
				SpecialTokens map[string]string `json:"special_tokens"`
				Chats         []goldenChat      `json:"chats"`
			}
			if err := json.Unmarshal(data, &g); err != nil {
				t.Fatal(err)
			}
			src, err := os.ReadFile(filepath.Join("testdata", "templates", g.Template))
			if err != nil {
				t.Fatal(err)
			}
			if sum := sha256.Sum256(src); hex.EncodeToString(sum[:]) != g.SHA256 {
				t.Fatalf("%s changed since the golden was made: rerun scripts/tokenizer-goldens.sh", g.Template)
			}
			ct, err := NewChatTemplate(string(src))
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range g.SpecialTokens {
				ct.SetSpecialToken(k, v)
			}
			for i, c := range g.Chats {
				prompt, err := c.render(t, ct)
				if err != nil {
					t.Errorf("chat %d: %v", i, err)
					continue
				}
				if prompt != c.Prompt {
					t.Errorf("chat %d: rendered\n%s\nwant\n%s\nfirst difference at byte %d", i, prompt, c.Prompt, firstDiff(prompt, c.Prompt))
				}
			}
		})
	}
}

func firstDiff(a, b string) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}
