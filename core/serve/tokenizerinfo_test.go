package serve

import (
	"encoding/json"
	"net/http"
	"strconv"
	"testing"
)

func getTokenizerInfo(t *testing.T, h *harness) map[string]any {
	t.Helper()
	resp, err := http.Get(h.ts.URL + "/tokenizer_info")
	if err != nil {
		t.Fatal(err)
	}
	body := readAll(t, resp)
	var info map[string]any
	if err := json.Unmarshal([]byte(body), &info); err != nil || resp.StatusCode != 200 {
		t.Fatalf("/tokenizer_info: %d %s (%v)", resp.StatusCode, body, err)
	}
	return info
}

// /tokenizer_info answers as vLLM's does, with what lm-eval's remote tokenizer reads:
// the special tokens (whose text /tokenize turns back into their ids), the chat
// template, the context length, the added tokens by id.
func TestTokenizerInfo(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	info := getTokenizerInfo(t, h)
	want := map[string]any{
		"tokenizer_class":  "PreTrainedTokenizerFast",
		"eos_token":        "<|im_end|>",
		"bos_token":        "<|begin_of_text|>",
		"pad_token":        "<|endoftext|>",
		"chat_template":    h.srv.chat.Source(),
		"model_max_length": float64(h.eng.Info().MaxContext),
	}
	for k, v := range want {
		if info[k] != v {
			t.Errorf("%s = %#v, want %#v", k, info[k], v)
		}
	}
	// lm-eval's eos_token_id: the first id /tokenize gives the eos_token's text.
	var out struct{ Tokens []int32 }
	h.postJSON("/tokenize", map[string]any{"prompt": info["eos_token"], "add_special_tokens": false}, 200, &out)
	if len(out.Tokens) != 1 || out.Tokens[0] != h.eos {
		t.Errorf("/tokenize of eos_token %q: %v, want [%d]", info["eos_token"], out.Tokens, h.eos)
	}
	added, ok := info["added_tokens_decoder"].(map[string]any)
	if !ok || added[strconv.Itoa(int(h.eos))] != "<|im_end|>" || len(added) != len(h.tok.AddedTokens()) {
		t.Errorf("added_tokens_decoder = %v, want the %d added tokens with %d: <|im_end|>", info["added_tokens_decoder"], len(h.tok.AddedTokens()), h.eos)
	}

	// Without a chat template (nor its tokenizer_config.json), the eos_token is the
	// runner's end-of-sequence token.
	bare := newHarness(t, harnessOpts{cfg: func(c *Config) { c.ChatTemplate = nil }})
	info = getTokenizerInfo(t, bare)
	if _, ok := info["chat_template"]; ok || info["eos_token"] != "<|im_end|>" {
		t.Errorf("without a chat template: %v, want eos_token <|im_end|> and no chat_template", info)
	}
}
