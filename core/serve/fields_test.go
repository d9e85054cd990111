package serve

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/engine/enginetest"
)

// cmpl posts a completion and returns its answer.
func (h *harness) cmpl(body map[string]any) completionOut {
	h.t.Helper()
	var out completionOut
	h.postJSON("/v1/completions", body, 200, &out)
	return out
}

func TestNChoicesHaveDerivedSeedsAndIndices(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	body := map[string]any{"prompt": []int{5, 6, 7}, "n": 3, "seed": 7, "temperature": 1, "max_tokens": 8, "ignore_eos": true}
	out := h.cmpl(body)
	if len(out.Choices) != 3 {
		t.Fatalf("%d choices", len(out.Choices))
	}
	texts := map[string]bool{}
	for k, c := range out.Choices {
		if c.Index != k {
			t.Fatalf("choice %d has index %d", k, c.Index)
		}
		// Choice k is what a single request with seed 7+k generates.
		one := h.cmpl(map[string]any{"prompt": []int{5, 6, 7}, "seed": 7 + k, "temperature": 1, "max_tokens": 8, "ignore_eos": true})
		if one.Choices[0].Text != c.Text {
			t.Fatalf("choice %d: %q, seed %d alone gives %q", k, c.Text, 7+k, one.Choices[0].Text)
		}
		texts[c.Text] = true
	}
	if len(texts) != 3 {
		t.Fatalf("the 3 choices are not distinct: %v", texts)
	}
	if out.Usage.PromptTokens != 3 || out.Usage.CompletionTokens != 24 {
		t.Fatalf("usage %+v", out.Usage)
	}
	// Chat: n choices too.
	var chat chatOut
	h.postJSON("/v1/chat/completions", map[string]any{"messages": []any{map[string]any{"role": "user", "content": "hi"}},
		"n": 2, "max_tokens": 4, "temperature": 1, "ignore_eos": true}, 200, &chat)
	if len(chat.Choices) != 2 || chat.Usage.CompletionTokens != 8 {
		t.Fatalf("chat n=2: %d choices, usage %+v", len(chat.Choices), chat.Usage)
	}
	h.stopAndCheck("n choices")
}

func TestBatchedPrompts(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	prompts := [][]int32{{11, 12, 13}, {40, 41, 42, 43}}
	out := h.cmpl(map[string]any{"prompt": prompts, "n": 2, "temperature": 0, "max_tokens": 5, "ignore_eos": true})
	if len(out.Choices) != 4 {
		t.Fatalf("%d choices, want 2 prompts x n=2", len(out.Choices))
	}
	for i, c := range out.Choices {
		toks := enginetest.Reference(h.tok.VocabSize(), prompts[i/2], 5, engine.SamplingRow{Logprobs: -1})
		if want := h.tok.Decode(toks, true); c.Index != i || c.Text != want {
			t.Fatalf("choice %d (index %d): %q, want prompt %d's %q", i, c.Index, c.Text, i/2, want)
		}
	}
	if out.Usage.PromptTokens != 7 || out.Usage.CompletionTokens != 20 {
		t.Fatalf("usage %+v", out.Usage)
	}
	// Text prompts, echoed.
	out = h.cmpl(map[string]any{"prompt": []string{"one", "two words"}, "temperature": 0, "max_tokens": 3, "echo": true})
	if len(out.Choices) != 2 || !strings.HasPrefix(out.Choices[0].Text, "one") || !strings.HasPrefix(out.Choices[1].Text, "two words") {
		t.Fatalf("text batch: %+v", out.Choices)
	}
	h.stopAndCheck("batched prompts")
}

func TestBestOfKeepsTheMostLikely(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	out := h.cmpl(map[string]any{"prompt": []int{9, 9, 9}, "n": 1, "best_of": 4, "seed": 100, "temperature": 1.5, "max_tokens": 6, "ignore_eos": true})
	if len(out.Choices) != 1 || out.Choices[0].Logprobs != nil {
		t.Fatalf("best_of: %+v (no logprobs were asked for)", out.Choices)
	}
	best, bestText := -1e9, ""
	for k := 0; k < 4; k++ {
		one := h.cmpl(map[string]any{"prompt": []int{9, 9, 9}, "seed": 100 + k, "temperature": 1.5, "max_tokens": 6, "ignore_eos": true, "logprobs": 0})
		var sum float64
		for _, lp := range one.Choices[0].Logprobs.TokenLogprobs {
			sum += float64(lp)
		}
		if sum > best {
			best, bestText = sum, one.Choices[0].Text
		}
	}
	if out.Choices[0].Text != bestText {
		t.Fatalf("best_of 4 chose %q, the most likely candidate is %q", out.Choices[0].Text, bestText)
	}
	h.stopAndCheck("best_of")
}

func TestStreamedChoicesCarryTheirIndex(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	body := map[string]any{"prompt": []int{3, 1, 4}, "n": 2, "seed": 5, "temperature": 1, "max_tokens": 7, "ignore_eos": true}
	whole := h.cmpl(body)
	body["stream"] = true
	body["stream_options"] = map[string]any{"include_usage": true}
	code, raw := h.post("/v1/completions", body)
	if code != 200 {
		t.Fatalf("status %d: %s", code, raw)
	}
	texts, finishes := map[int]string{}, map[int]int{}
	var usage *usageJSON
	for _, ev := range sseEvents(t, raw) {
		if ev == "[DONE]" {
			continue
		}
		var c completionOut
		if err := json.Unmarshal([]byte(ev), &c); err != nil {
			t.Fatal(err)
		}
		if c.Usage != nil {
			usage = c.Usage
		}
		for _, ch := range c.Choices {
			texts[ch.Index] += ch.Text
			if ch.FinishReason != nil {
				finishes[ch.Index]++
			}
		}
	}
	for k := 0; k < 2; k++ {
		if texts[k] != whole.Choices[k].Text || finishes[k] != 1 {
			t.Fatalf("index %d: streamed %q (%d finishes), whole %q", k, texts[k], finishes[k], whole.Choices[k].Text)
		}
	}
	if usage == nil || usage.CompletionTokens != 14 {
		t.Fatalf("usage %+v", usage)
	}
	h.stopAndCheck("streamed choices")
}

func TestIncludeStopStrInOutput(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	prompt := []int32{20, 21, 22}
	_, text := h.reference(prompt, 30)
	stop := ""
	for i := 2; i+2 <= len(text) && stop == ""; i++ {
		if s := text[i : i+2]; strings.TrimSpace(s) == s && !strings.ContainsRune(s, '\uFFFD') && strings.Index(text, s) == i {
			stop = s
		}
	}
	if stop == "" {
		t.Skipf("no usable stop string in %q", text)
	}
	before := text[:strings.Index(text, stop)]
	base := map[string]any{"prompt": prompt, "temperature": 0, "max_tokens": 30, "stop": stop}
	if got := h.cmpl(base).Choices[0].Text; got != before {
		t.Fatalf("without the flag: %q, want %q", got, before)
	}
	base["include_stop_str_in_output"] = true
	if got := h.cmpl(base).Choices[0].Text; got != before+stop {
		t.Fatalf("with the flag: %q, want %q", got, before+stop)
	}
	// A stop token id's text is kept too.
	toks, _ := h.reference(prompt, 30)
	stopID := toks[3]
	cut := slices.Index(toks, stopID)
	want := h.tok.Decode(toks[:cut+1], true)
	got := h.cmpl(map[string]any{"prompt": prompt, "temperature": 0, "max_tokens": 30, "stop_token_ids": []int32{stopID}, "include_stop_str_in_output": true, "ignore_eos": true})
	if got.Choices[0].Text != want {
		t.Fatalf("stop token kept: %q, want %q", got.Choices[0].Text, want)
	}
	h.stopAndCheck("include_stop_str_in_output")
}

func TestSamplingFieldsTakeEffect(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	prompt := []int32{7, 8, 9, 10}
	// logit_bias +100 forces a token; -100 forbids the greedy one.
	out := h.cmpl(map[string]any{"prompt": prompt, "temperature": 1, "max_tokens": 4, "logit_bias": map[string]float64{"300": 100}, "ignore_eos": true})
	if want := h.tok.Decode([]int32{300, 300, 300, 300}, true); out.Choices[0].Text != want {
		t.Fatalf("logit_bias +100: %q, want %q", out.Choices[0].Text, want)
	}
	// min_tokens: EOS forced by the bias still waits for min_tokens tokens.
	eos := fmt.Sprint(h.eos)
	out = h.cmpl(map[string]any{"prompt": prompt, "max_tokens": 10, "logit_bias": map[string]float64{eos: 100}})
	if out.Usage.CompletionTokens != 1 || *out.Choices[0].FinishReason != "stop" {
		t.Fatalf("EOS forced: %d tokens, %s", out.Usage.CompletionTokens, *out.Choices[0].FinishReason)
	}
	out = h.cmpl(map[string]any{"prompt": prompt, "max_tokens": 10, "logit_bias": map[string]float64{eos: 100}, "min_tokens": 4})
	if out.Usage.CompletionTokens != 5 || *out.Choices[0].FinishReason != "stop" {
		t.Fatalf("EOS forced with min_tokens 4: %d tokens, %s", out.Usage.CompletionTokens, *out.Choices[0].FinishReason)
	}
	// Penalties: what the reference sampler gives with them, and not without. (Below 1 and
	// negative, they favour the prompt's and the output's tokens: on a large vocabulary
	// that changes greedy decoding at once.)
	row := engine.SamplingRow{Logprobs: -1, RepetitionPenalty: 0.2, PresencePenalty: -0.5, FrequencyPenalty: -1}
	toks := enginetest.Reference(h.tok.VocabSize(), prompt, 12, row)
	plain := enginetest.Reference(h.tok.VocabSize(), prompt, 12, engine.SamplingRow{Logprobs: -1})
	if slices.Equal(toks, plain) {
		t.Fatal("the penalties change nothing on this prompt; pick another")
	}
	out = h.cmpl(map[string]any{"prompt": prompt, "temperature": 0, "max_tokens": 12, "ignore_eos": true,
		"repetition_penalty": 0.2, "presence_penalty": -0.5, "frequency_penalty": -1})
	if want := h.tok.Decode(toks, true); out.Choices[0].Text != want {
		t.Fatalf("penalties: %q, want %q", out.Choices[0].Text, want)
	}
	h.stopAndCheck("sampling fields")
}

func TestUnsupportedFieldsRefusedByName(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	chat := []any{map[string]any{"role": "user", "content": "x"}}
	for _, c := range []struct {
		path  string
		body  map[string]any
		param string
	}{
		{"/v1/completions", map[string]any{"prompt": "x", "guided_regex": `a\bb`}, "guided_regex"},
		{"/v1/chat/completions", map[string]any{"messages": chat, "guided_json": map[string]any{"not": map[string]any{}}}, "guided_json"},
		{"/v1/completions", map[string]any{"prompt": "x", "frobnicate": 1}, "frobnicate"},
		{"/v1/chat/completions", map[string]any{"messages": chat, "response_format": map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "x"}}}, "response_format"},
		{"/v1/chat/completions", map[string]any{"messages": chat, "best_of": 2}, "best_of"},
		{"/v1/completions", map[string]any{"prompt": "x", "n": 2, "best_of": 1}, "best_of"},
		{"/v1/completions", map[string]any{"prompt": "x", "n": 2, "best_of": 3, "stream": true}, "best_of"},
		{"/v1/completions", map[string]any{"prompt": "x", "logit_bias": map[string]float64{"abc": 1}}, "logit_bias"},
		{"/v1/completions", map[string]any{"prompt": "x", "logit_bias": map[string]float64{"1": 150}}, "logit_bias"},
		{"/v1/completions", map[string]any{"prompt": "x", "repetition_penalty": 0}, "repetition_penalty"},
		{"/v1/completions", map[string]any{"prompt": "x", "frequency_penalty": -2.5}, "frequency_penalty"},
		{"/v1/completions", map[string]any{"prompt": "x", "min_tokens": 50, "max_tokens": 10}, "min_tokens"},
		{"/v1/completions", map[string]any{"prompt": []string{}}, "prompt"},
	} {
		code, raw := h.post(c.path, c.body)
		var e errorResp
		if err := json.Unmarshal(raw, &e); err != nil || code != 400 || e.Error.Param == nil || *e.Error.Param != c.param {
			t.Errorf("%v: status %d, %s; want 400 naming %s", c.body, code, raw, c.param)
		}
	}
	// A logit_bias token outside the vocabulary is refused too.
	code, raw := h.post("/v1/completions", map[string]any{"prompt": "x", "logit_bias": map[string]float64{"99999999": 1}})
	if code != 400 || !strings.Contains(string(raw), "logit_bias") {
		t.Fatalf("logit_bias outside the vocabulary: %d %s", code, raw)
	}
}

func TestEchoWithPromptLogprobs(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	prompt := []int32{5, 6, 7, 8, 9}
	want := enginetest.PromptLogprobs(h.tok.VocabSize(), prompt, 2)
	type lpOut struct {
		Choices []struct {
			Text     string `json:"text"`
			Logprobs struct {
				Tokens        []string             `json:"tokens"`
				TokenLogprobs []*float32           `json:"token_logprobs"`
				TopLogprobs   []map[string]float32 `json:"top_logprobs"`
				TextOffset    []int                `json:"text_offset"`
			} `json:"logprobs"`
		} `json:"choices"`
	}
	body := map[string]any{"prompt": prompt, "echo": true, "logprobs": 2, "max_tokens": 3, "temperature": 0, "ignore_eos": true}
	var out lpOut
	h.postJSON("/v1/completions", body, 200, &out)
	lp := out.Choices[0].Logprobs
	if len(lp.Tokens) != len(prompt)+3 || len(lp.TokenLogprobs) != len(prompt)+3 || len(lp.TopLogprobs) != len(prompt)+3 {
		t.Fatalf("%d tokens, %d logprobs, %d tops for a prompt of %d and 3 generated", len(lp.Tokens), len(lp.TokenLogprobs), len(lp.TopLogprobs), len(prompt))
	}
	if lp.TokenLogprobs[0] != nil || lp.TopLogprobs[0] != nil || lp.TextOffset[0] != 0 {
		t.Fatalf("the first prompt token has logprob %v, top %v, offset %d; want null, null, 0", lp.TokenLogprobs[0], lp.TopLogprobs[0], lp.TextOffset[0])
	}
	for k, w := range want {
		tok, _ := h.srv.tokenText(w.Token)
		if got := lp.TokenLogprobs[k+1]; got == nil || *got != w.Logprob || lp.Tokens[k+1] != tok || len(lp.TopLogprobs[k+1]) == 0 {
			t.Fatalf("prompt position %d: %q %v (top %v), want %q %v", k+1, lp.Tokens[k+1], got, lp.TopLogprobs[k+1], tok, w.Logprob)
		}
	}
	for k := len(prompt); k < len(lp.TokenLogprobs); k++ {
		if lp.TokenLogprobs[k] == nil {
			t.Fatalf("generated token %d has no logprob", k-len(prompt))
		}
	}
	// Streamed: the same entries, spread over the chunks.
	body["stream"] = true
	code, raw := h.post("/v1/completions", body)
	if code != 200 {
		t.Fatalf("stream: %d %s", code, raw)
	}
	var streamed []*float32
	for _, ev := range sseEvents(t, raw) {
		if ev == "[DONE]" {
			continue
		}
		var c lpOut
		if err := json.Unmarshal([]byte(ev), &c); err != nil {
			t.Fatal(err)
		}
		for _, ch := range c.Choices {
			streamed = append(streamed, ch.Logprobs.TokenLogprobs...)
		}
	}
	if len(streamed) != len(lp.TokenLogprobs) || streamed[0] != nil {
		t.Fatalf("streamed %d logprobs (first %v), want %d starting with null", len(streamed), streamed[0], len(lp.TokenLogprobs))
	}
	for k := 1; k < len(streamed); k++ {
		if *streamed[k] != *lp.TokenLogprobs[k] {
			t.Fatalf("streamed logprob %d: %v, want %v", k, *streamed[k], *lp.TokenLogprobs[k])
		}
	}
	h.stopAndCheck("echo with logprobs")
}
