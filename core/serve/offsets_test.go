package serve

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestEchoTextOffsets: a completion's text_offset gives, for every token, the byte offset
// in the choice's text where that token's bytes start, through the echoed prompt and the
// generation: the BOS the tokenizer added to a text prompt takes no room, and tokens that
// hold parts of a character advance by their bytes. Before, the echoed prompt's offsets
// counted the BOS's text, which the echo does not hold, so they ran past the text and
// then fell back for the generated tokens ([0 17 18 2 6] for "hi" and two tokens).
func TestEchoTextOffsets(t *testing.T) {
	const prompt, generated = "héllo 世界 🇫🇷 ok", " naïve 😀🚀 done"
	h := newToolHarness(t, generated, "", "")
	for _, stream := range []bool{false, true} {
		body := map[string]any{"prompt": prompt, "echo": true, "logprobs": 0, "max_tokens": 100, "stream": stream}
		var text string
		var tokens []string
		var offsets []int
		if !stream {
			var out struct {
				Choices []struct {
					Text     string `json:"text"`
					Logprobs struct {
						Tokens     []string `json:"tokens"`
						TextOffset []int    `json:"text_offset"`
					} `json:"logprobs"`
				} `json:"choices"`
			}
			h.postJSON("/v1/completions", body, 200, &out)
			c := out.Choices[0]
			text, tokens, offsets = c.Text, c.Logprobs.Tokens, c.Logprobs.TextOffset
		} else {
			code, raw := h.post("/v1/completions", body)
			if code != 200 {
				t.Fatalf("stream: %d %s", code, raw)
			}
			for _, ev := range sseEvents(t, raw) {
				if ev == "[DONE]" {
					continue
				}
				var c struct {
					Choices []struct {
						Text     string `json:"text"`
						Logprobs *struct {
							Tokens     []string `json:"tokens"`
							TextOffset []int    `json:"text_offset"`
						} `json:"logprobs"`
					} `json:"choices"`
				}
				if err := json.Unmarshal([]byte(ev), &c); err != nil {
					t.Fatal(err)
				}
				for _, ch := range c.Choices {
					text += ch.Text
					if ch.Logprobs != nil {
						tokens = append(tokens, ch.Logprobs.Tokens...)
						offsets = append(offsets, ch.Logprobs.TextOffset...)
					}
				}
			}
		}
		if text != prompt+generated {
			t.Fatalf("stream=%v: text %q, want %q", stream, text, prompt+generated)

		}
		ids, err := h.tok.Encode(prompt, true)
		if err != nil {
			t.Fatal(err)
		}
		gen, _ := h.tok.Encode(generated, false)
		ids = append(ids, gen...)
		ids = append(ids, h.eos)
		if len(offsets) != len(ids) || len(tokens) != len(ids) {
			t.Fatalf("stream=%v: %d offsets and %d tokens for %d tokens", stream, len(offsets), len(tokens), len(ids))
		}
		if offsets[0] != 0 || offsets[1] != 0 {
			t.Fatalf("stream=%v: the BOS and the first prompt token are at %d and %d, want 0 and 0 (the echo holds no BOS)", stream, offsets[0], offsets[1])
		}
		for i := 1; i < len(ids); i++ {
			raw := string(h.tok.AppendBytes(nil, ids[i], true))
			if offsets[i] < offsets[i-1] || offsets[i] > len(text) || !strings.HasPrefix(text[offsets[i]:], raw) {
				t.Fatalf("stream=%v: token %d (%q) at offset %d of %d; the offsets are %v", stream, i, raw, offsets[i], len(text), offsets)
			}
		}
	}
}
