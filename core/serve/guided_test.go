package serve

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/engine/enginetest"
)

// The guided_choice tests here run on a runner without token masks, where the choices
// are scored (guided.go); with masks guided_choice is a grammar (TestGuidedFields).

func TestGuidedChoiceGreedyTakesTheLikeliestFirstToken(t *testing.T) {
	h := newHarness(t, harnessOpts{wrap: withoutMasks})
	prompt := []int32{12, 13, 14}
	choices := []string{"yes", "no", "maybe so"}
	// With first tokens that differ, greedy guided decoding picks the choice whose first
	// token the model prefers after the prompt, then follows it to its end.
	best, bestLp := "", float32(-1e9)
	first := map[int32]bool{}
	for _, c := range choices {
		ids, _ := h.tok.Encode(c, false)
		if first[ids[0]] {
			t.Fatalf("choices share a first token: the test needs them distinct")
		}
		first[ids[0]] = true
		lp := enginetest.PromptLogprobs(h.tok.VocabSize(), append(slices.Clone(prompt), ids...), 0)[len(prompt)-1].Logprob
		if lp > bestLp {
			best, bestLp = c, lp
		}
	}
	out := h.cmpl(map[string]any{"prompt": prompt, "guided_choice": choices, "temperature": 0, "logprobs": 0})
	c := out.Choices[0]
	if c.Text != best || *c.FinishReason != "stop" {
		t.Fatalf("guided greedy: %q (%s), want %q", c.Text, *c.FinishReason, best)
	}
	if strings.Join(c.Logprobs.Tokens, "") != c.Text || c.Logprobs.TokenLogprobs[0] != bestLp {
		t.Fatalf("logprobs %+v for %q (first %v)", c.Logprobs, c.Text, bestLp)
	}
	h.stopAndCheck("guided greedy")
}

func TestGuidedChoiceSampledStaysInTheChoices(t *testing.T) {
	h := newHarness(t, harnessOpts{wrap: withoutMasks})
	choices := []string{"red", "green", "blue", "green tea", "redder"}
	out := h.cmpl(map[string]any{"prompt": "Colour:", "guided_choice": choices, "temperature": 2, "n": 24, "seed": 1})
	seen := map[string]bool{}
	for _, c := range out.Choices {
		if !slices.Contains(choices, c.Text) {
			t.Fatalf("%q is not one of %q", c.Text, choices)
		}
		seen[c.Text] = true
	}
	if len(seen) < 2 {
		t.Fatalf("24 samples at temperature 2 gave only %v", seen)
	}
	again := h.cmpl(map[string]any{"prompt": "Colour:", "guided_choice": choices, "temperature": 2, "n": 24, "seed": 1})
	for i := range out.Choices {
		if again.Choices[i].Text != out.Choices[i].Text {
			t.Fatalf("seeded choice %d: %q then %q", i, out.Choices[i].Text, again.Choices[i].Text)
		}
	}
	// Chat, streamed.
	code, raw := h.post("/v1/chat/completions", map[string]any{"messages": []any{map[string]any{"role": "user", "content": "pick"}},
		"guided_choice": choices, "stream": true})
	if code != 200 {
		t.Fatalf("chat stream: %d %s", code, raw)
	}
	var text string
	for _, ev := range sseEvents(t, raw) {
		if ev == "[DONE]" {
			continue
		}
		var c chatOut
		if err := json.Unmarshal([]byte(ev), &c); err != nil {
			t.Fatal(err)
		}
		for _, ch := range c.Choices {
			if ch.Delta.Content != nil {
				text += *ch.Delta.Content
			}
		}
	}
	if !slices.Contains(choices, text) {
		t.Fatalf("streamed chat %q is not one of %q", text, choices)
	}
	h.stopAndCheck("guided sampling")
}

func TestGuidedChoiceRefusals(t *testing.T) {
	h := newHarness(t, harnessOpts{wrap: withoutMasks})
	for _, c := range []struct {
		body  map[string]any
		param string
	}{
		{map[string]any{"prompt": "x", "guided_choice": []string{}}, "guided_choice"},
		{map[string]any{"prompt": "x", "guided_choice": "yes"}, "guided_choice"},
		{map[string]any{"prompt": "x", "guided_choice": []string{"a", ""}}, "guided_choice"},
		{map[string]any{"prompt": "x", "guided_choice": []string{"a"}, "stop": "z"}, "stop"},
		{map[string]any{"prompt": "x", "guided_choice": []string{"a"}, "logit_bias": map[string]float64{"1": 1}}, "logit_bias"},
		{map[string]any{"prompt": "x", "guided_choice": []string{"a"}, "echo": true}, "echo"},
	} {
		code, raw := h.post("/v1/completions", c.body)
		var e errorResp
		if err := json.Unmarshal(raw, &e); err != nil || code != 400 || e.Error.Param == nil || *e.Error.Param != c.param {
			t.Errorf("%v: %d %s, want 400 naming %s", c.body, code, raw, c.param)
		}
	}
}
