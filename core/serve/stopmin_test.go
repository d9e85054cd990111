package serve

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

// TestStopMatcherMinTokens: text added before min_tokens tokens are generated holds no
// stop string's end, but a stop string may begin in it and end after it (vLLM's rule).
func TestStopMatcherMinTokens(t *testing.T) {
	for _, c := range []struct {
		name   string
		stops  []string
		pieces []string
		search []bool
		want   string
		hit    bool
	}{
		{"stop inside the first tokens is skipped", []string{"ab"}, []string{"ab", "c", "ab", "d"}, []bool{false, false, true, true}, "abc", true},
		{"stop spanning the boundary is found", []string{"bc"}, []string{"ab", "c", "d"}, []bool{false, true, true}, "a", true},
		{"no stop after the boundary", []string{"ab"}, []string{"ab", "ab", "x", "y"}, []bool{false, false, true, true}, "ababxy", false},
		{"long text released before the boundary", []string{"xyz"}, []string{"xyzxyzab", "c"}, []bool{false, true}, "xyzxyzabc", false},
		{"held text of the first tokens starts a match", []string{"xyz"}, []string{"xyzxyzxy", "z"}, []bool{false, true}, "xyzxyz", true},
		{"long text released, then a spanning match", []string{"xyz"}, []string{"aaaaxy", "z"}, []bool{false, true}, "aaaa", true},
		{"without min_tokens", []string{"ab"}, []string{"ab", "c"}, []bool{true, true}, "", true},
	} {
		m := newStopMatcher(c.stops)
		var out strings.Builder
		hit := false
		for i, p := range c.pieces {
			text, h := m.add(p, c.search[i])
			out.WriteString(text)
			if h {
				hit = true
				break
			}
		}
		if !hit {
			out.WriteString(m.flush())
		}
		if out.String() != c.want || hit != c.hit {
			t.Errorf("%s: %q (hit %v), want %q (hit %v)", c.name, out.String(), hit, c.want, c.hit)
		}
	}
}

// TestMinTokensHoldsOffStopStrings: a stop string in the text of the first min_tokens
// tokens does not end the request (before, min_tokens 5 with a stop string in the first
// token's text ended it after 1 or 2 tokens); one that ends later does.
func TestMinTokensHoldsOffStopStrings(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	const minTokens = 5
	// A prompt whose greedy output starts with plain text (the tiny tokenizer's
	// byte tokens decode to U+FFFD on their own).
	var prompt, toks []int32
	var text, head string
	for p := int32(20); p < 400 && prompt == nil; p++ {
		cand := []int32{p, p + 1, p + 2}
		toks, text = h.reference(cand, 30)
		head = h.tok.Decode(toks[:min(minTokens, len(toks))], true)
		if len(toks) > minTokens && head != "" && !strings.ContainsRune(head, '\uFFFD') && strings.HasPrefix(text, head) {
			prompt = cand
		}
	}
	if prompt == nil {
		t.Fatal("no prompt with a plain-text greedy output")
	}
	first := h.tok.Decode(toks[:1], true)
	_, size := utf8.DecodeRuneInString(first)
	stop := first[:size]
	want := text
	// The first match ending past the text of the first min_tokens tokens.
	from := max(0, len(head)-len(stop)+1)
	if i := strings.Index(text[from:], stop); i >= 0 {
		want = text[:from+i]
	}
	body := map[string]any{"prompt": prompt, "temperature": 0, "max_tokens": 30, "stop": stop, "min_tokens": minTokens}
	out := h.cmpl(body)
	if got := out.Choices[0].Text; got != want || out.Usage.CompletionTokens < minTokens {
		t.Fatalf("stop %q with min_tokens %d: %q (%d tokens), want %q", stop, minTokens, got, out.Usage.CompletionTokens, want)
	}
	// Without min_tokens the first token's text ends it.
	delete(body, "min_tokens")
	if got := h.cmpl(body).Choices[0].Text; got != "" {
		t.Fatalf("stop %q without min_tokens: %q, want \"\"", stop, got)
	}
	h.stopAndCheck("min_tokens with stop strings")
}

// TestChatMinTokensPastTheContext: a chat request without max_tokens whose min_tokens
// exceeds what the context leaves is a 400 naming min_tokens (the engine's refusal came
// back with param null); one that fits is served with at least min_tokens tokens.
func TestChatMinTokensPastTheContext(t *testing.T) {
	h := newHarness(t, harnessOpts{runner: smallRunner()})
	chat := []any{map[string]any{"role": "user", "content": "x"}}
	code, raw := h.post("/v1/chat/completions", map[string]any{"messages": chat, "min_tokens": 1000})
	var e errorResp
	if err := json.Unmarshal(raw, &e); err != nil || code != 400 || e.Error.Param == nil || *e.Error.Param != "min_tokens" {
		t.Fatalf("min_tokens 1000 in a context of 256: status %d, %s; want 400 naming min_tokens", code, raw)
	}
	var out struct {
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	h.postJSON("/v1/chat/completions", map[string]any{"messages": chat, "min_tokens": 20}, 200, &out)
	if out.Usage.CompletionTokens < 20 {
		t.Fatalf("min_tokens 20: %d tokens", out.Usage.CompletionTokens)
	}
	h.stopAndCheck("chat min_tokens")
}
